//! What only the leader writes, each call fenced by its term's token:
//! runs fired and run transitions.

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
pub trait LeaderWrites: Send + Sync {
    /// Creates the runs (at most one per `(job_uid, scheduled_at)`) and
    /// advances the jobs' `last_scheduled_at`, fenced.
    async fn fire(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError>;
    /// Applies each transition by CAS, fenced; per transition, whether it
    /// applied.
    async fn transition(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError>;

    /// One leader write per turn: `fire`, then `transition` (which may move
    /// the runs just fired). The SQL stores do both in one transaction, one
    /// commit. This default makes the two calls; a transition failure after
    /// the fire committed comes back in [`TurnWrite::applied`] (the fire
    /// stands). `Err` means nothing was written.
    async fn fire_and_transition(
        &self,
        fence: &Fence,
        runs: &[NewRun],
        advances: &[JobAdvance],
        transitions: &[Transition],
    ) -> Result<TurnWrite, StoreError> {
        let fired = if runs.is_empty() && advances.is_empty() { Vec::new() } else { self.fire(fence, runs, advances).await? };
        let applied = if transitions.is_empty() { Ok(Vec::new()) } else { self.transition(fence, transitions).await };
        Ok(TurnWrite { fired, applied })
    }
}
