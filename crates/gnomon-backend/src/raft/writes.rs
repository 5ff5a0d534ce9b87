//! The leader's fenced writes on the Raft store: each one log entry, or,
//! past about a MiB, several in order, so that no entry is too large to
//! replicate within an election timeout.

use async_trait::async_trait;

use super::types::{Command, Reply};
use super::RaftStore;
use crate::chunks::{new_run_bytes, transition_bytes};
use crate::*;

/// About the most bytes of runs and transitions one log entry carries: a
/// larger write goes as several entries, so that no entry is too large to
/// replicate within an election timeout.
const MAX_ENTRY_BYTES: usize = 1024 * 1024;

impl RaftStore {
    async fn fire_entry(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
        self.ask(Command::fire(fence.clone(), runs.to_vec(), advances.to_vec()), |r| match r {
            Reply::Fired(v) => Ok(v),
            r => Err(r),
        })
        .await
    }

    async fn transition_entry(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
        self.ask(Command::Transition { fence: fence.clone(), transitions: transitions.to_vec() }, |r| match r {
            Reply::Transitioned(v) => Ok(v),
            r => Err(r),
        })
        .await
    }
}

#[async_trait]
impl LeaderWrites for RaftStore {
    /// One entry, or (past about a MiB) several in order, the
    /// advances in the last: a crash in between leaves runs whose re-fire
    /// is `Existed`, as on etcd.
    async fn fire(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
        let chunks = crate::chunks::by_size(runs, usize::MAX, MAX_ENTRY_BYTES, new_run_bytes);
        if chunks.len() <= 1 {
            return self.fire_entry(fence, runs, advances).await;
        }
        let mut out = Vec::with_capacity(runs.len());
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            out.extend(self.fire_entry(fence, chunk, if i == last { advances } else { &[] }).await?);
        }
        Ok(out)
    }

    /// One entry, or several in order (each transition is its own CAS).
    async fn transition(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
        let chunks = crate::chunks::by_size(transitions, usize::MAX, MAX_ENTRY_BYTES, transition_bytes);
        if chunks.len() <= 1 {
            return self.transition_entry(fence, transitions).await;
        }
        let mut out = Vec::with_capacity(transitions.len());
        for chunk in chunks {
            out.extend(self.transition_entry(fence, chunk).await?);
        }
        Ok(out)
    }

    /// One entry; a turn past about a MiB is its fire, then its
    /// transitions, then its backfill work, each as [`Self::fire`],
    /// [`Self::transition`] and the backfill calls write them (each valid
    /// alone).
    async fn write_turn(&self, fence: &Fence, batch: &TurnBatch) -> Result<TurnWrite, StoreError> {
        let bytes = batch.runs.iter().map(new_run_bytes).sum::<usize>() + batch.transitions.iter().map(transition_bytes).sum::<usize>();
        if bytes > MAX_ENTRY_BYTES {
            let fired = self.fire(fence, &batch.runs, &batch.advances).await?;
            let applied = if batch.transitions.is_empty() { Ok(Vec::new()) } else { self.transition(fence, &batch.transitions).await };
            let (advanced, created) = backfill_steps(self, fence, batch, &fired).await?;
            return Ok(TurnWrite { fired, applied, advanced, created });
        }
        let command = if batch.is_runs_only() {
            Command::turn(fence.clone(), batch.runs.clone(), batch.advances.clone(), batch.transitions.clone())
        } else {
            Command::TurnBatch { fence: fence.clone(), batch: Box::new(batch.clone()) }
        };
        self.ask(command, |r| match r {
            Reply::Turn(t) => Ok(*t),
            r => Err(r),
        })
        .await
    }
}
