//! Runs as the API and a recovering leader read them, and the one write a
//! user makes on a run: asking it to cancel.

use async_trait::async_trait;
use gnomon_core::Millis;

use crate::*;

/// Run reads and cancel requests.
///
/// # To be correct, an implementation must…
/// - page runs newest first, stably under concurrent inserts: a cursor
///   never yields a run twice or skips an older one;
/// - answer `open_runs` with every run that is not terminal (a leader's
///   recovery depends on it: a run missing here would stay open forever);
/// - never cancel a terminal run (`request_cancel` fails on one);
/// - answer `kept_keyed_runs` with every ended keyed run fired since the
///   cut (a missing one lets a namespace pass its quotas after a rebuild).
#[async_trait]
pub trait RunStore: Send + Sync {
    /// Cancels a run that has not started (directly) or asks the leader to
    /// stop a live one (`cancel_requested`). Fails on a terminal run.
    async fn request_cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError>;
    /// One run with its attempts.
    async fn get_run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError>;
    /// A page of runs matching `filter`, newest first, after `cursor`.
    async fn list_runs(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError>;
    /// Every run that is not terminal (for leader recovery).
    async fn open_runs(&self) -> Result<Vec<RunRecord>, StoreError>;
    /// The keyed runs ([`crate::is_keyed_run_id`]) that have ended and were
    /// fired at or after `since`: the records retention holds, which a
    /// rebuilding leader counts in their namespaces' quotas. Read newest
    /// first, stopping at the first run fired before `since` (fire times
    /// follow insertion).
    async fn kept_keyed_runs(&self, since: Millis) -> Result<Vec<KeptRun>, StoreError>;
    /// Live attempts of runs whose cancellation was requested.
    async fn cancel_requests(&self) -> Result<Vec<RunRecord>, StoreError>;
    /// The worker of every live attempt (runs `assigned` or `running`), for
    /// leader recovery. The default reads each such run; the SQL stores
    /// answer with one join.
    async fn live_attempts(&self) -> Result<Vec<LiveAttempt>, StoreError> {
        let mut out = Vec::new();
        for run in self.open_runs().await? {
            if !matches!(run.state, gnomon_core::RunState::Assigned | gnomon_core::RunState::Running) {
                continue;
            }
            let Some(detail) = self.get_run(&run.id).await? else { continue };
            if let Some(a) = detail.attempts.iter().find(|a| a.attempt == detail.run.attempt) {
                out.push(LiveAttempt {
                    run_id: run.id.clone(),
                    attempt: a.attempt,
                    worker: a.worker.clone(),
                    assigned_at: a.assigned_at,
                    started_at: a.started_at,
                });
            }
        }
        Ok(out)
    }
}
