//! What only the leader writes, each call fenced by its term's token:
//! runs fired, run transitions and backfill progress, one write per turn.

use async_trait::async_trait;

use crate::*;

/// The leader's fenced writes.
///
/// # To be correct, an implementation must…
/// - **keep fires unique**: `fire` creates at most one run per
///   `(job_uid, scheduled_at)` even when called concurrently from several
///   handles or processes; a duplicate is reported as
///   [`FireOutcome::Existed`] and changes nothing. The run and the job's
///   `last_scheduled_at` advance are written in the same transaction, or,
///   for a fire too large for one request (etcd, Raft), the advance goes
///   with the job's last runs, so a crash in between leaves runs whose
///   re-fire is `Existed`, never an advance past runs not written;
/// - **fence**: check, in the same transaction as its writes, that the
///   fence's token is the current token of its scope, and fail with
///   [`StoreError::Fenced`] (writing nothing) otherwise;
/// - **apply transitions by CAS**: a [`Transition`] applies only when the
///   run is in `(from, from_attempt)`; otherwise it is reported as not
///   applied and writes nothing. Transitions outside the lifecycle are
///   rejected; terminal states are final;
/// - write a transition's notifications in the transition's own write, only
///   if it applies, and never twice (insert-or-ignore by id).
#[async_trait]
pub trait LeaderWrites: BackfillStore + Send + Sync {
    /// Creates the runs (at most one per `(job_uid, scheduled_at)`) and
    /// advances the jobs' `last_scheduled_at`, fenced.
    async fn fire(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError>;
    /// Applies each transition by CAS, fenced; per transition, whether it
    /// applied.
    async fn transition(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError>;

    /// One leader write per turn: the fire, then the transitions (which
    /// may move the runs just fired), then the backfills' progress and the
    /// backfills started. The SQL stores make it one transaction, one
    /// commit. This default makes the calls one after the other (each valid
    /// alone): an error after the fire committed comes back in
    /// [`TurnWrite::applied`] when it is the transitions', and as `Err`
    /// otherwise; `Err` means the outcome is unknown past the fire.
    async fn write_turn(&self, fence: &Fence, batch: &TurnBatch) -> Result<TurnWrite, StoreError> {
        let fired = if batch.runs.is_empty() && batch.advances.is_empty() {
            Vec::new()
        } else {
            self.fire(fence, &batch.runs, &batch.advances).await?
        };
        let applied = if batch.transitions.is_empty() { Ok(Vec::new()) } else { self.transition(fence, &batch.transitions).await };
        let (advanced, created) = backfill_steps(self, fence, batch, &fired).await?;
        Ok(TurnWrite { fired, applied, advanced, created })
    }
}

/// The backfill part of a turn written call by call, after its fire
/// (whose outcomes are `fired`): each progress, then each backfill started
/// (`false` where its id was taken).
pub async fn backfill_steps<S: BackfillStore + ?Sized>(
    store: &S,
    fence: &Fence,
    batch: &TurnBatch,
    fired: &[FireOutcome],
) -> Result<(Vec<bool>, Vec<bool>), StoreError> {
    let mut advanced = Vec::with_capacity(batch.backfills.len());
    for p in batch.counted_progress(fired) {
        advanced.push(store.advance_backfill(fence, &p).await?);
    }
    let mut created = Vec::with_capacity(batch.new_backfills.len());
    for b in &batch.new_backfills {
        created.push(match store.create_backfill(b, batch.at).await {
            Ok(_) => true,
            Err(StoreError::AlreadyExists(_)) => false,
            Err(e) => return Err(e),
        });
    }
    Ok((advanced, created))
}
