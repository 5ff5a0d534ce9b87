//! Jobs: written by any replica directly (the API), read by the leader
//! through the change feed.

use gnomon_core::spec::JobSpec;

use async_trait::async_trait;
use gnomon_core::Millis;

use crate::*;

/// Job definitions and their change feed.
///
/// # To be correct, an implementation must…
/// - check a write's [`Precondition`] atomically with the write;
/// - give every write a place in the change feed: `job_changes(since)`
///   returns every job written and every uid deleted after `since`, and
///   the feed's sequence never goes back (a deletion leaves a tombstone,
///   so a leader polling the feed sees it);
/// - answer `job_heads` at one feed position: nothing at or below the
///   returned sequence appears in a later `job_changes` call as if new.
#[async_trait]
pub trait JobStore: Send + Sync {
    /// Creates or replaces a job (a new uid on creation; `version` + 1 on
    /// update; a schedule change is recorded so the leader re-plans).
    async fn put_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError>;
    /// Pauses or resumes a job (a version bump and a feed entry).
    async fn set_job_paused(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError>;
    /// Deletes a job, leaving a tombstone in the change feed.
    async fn delete_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError>;
    /// One job by namespace and name.
    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError>;
    /// Every job, or one namespace's, by namespace and name.
    async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>, StoreError>;
    /// The job change feed: jobs written and uids deleted after `since`.
    async fn job_changes(&self, since: u64) -> Result<JobChanges, StoreError>;
    /// Every job's head (uid, version, last fire) without its spec, at one
    /// feed position: what a leader rebuilding its state reads to keep the
    /// jobs it already holds at the stored version.
    async fn job_heads(&self) -> Result<JobHeads, StoreError> {
        let all = self.job_changes(0).await?;
        Ok(JobHeads {
            heads: all
                .upserted
                .into_iter()
                .map(|j| JobHead { uid: j.uid, version: j.version, last_scheduled_at: j.last_scheduled_at })
                .collect(),
            seq: all.seq,
        })
    }
    /// The stored jobs among these uids (a uid with no job is left out).
    async fn jobs_by_uid(&self, uids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
        let wanted: std::collections::HashSet<&str> = uids.iter().map(String::as_str).collect();
        let mut jobs = self.job_changes(0).await?.upserted;
        jobs.retain(|j| wanted.contains(j.uid.as_str()));
        Ok(jobs)
    }

    /// The jobs of `namespace` whose `after` edges name job `name` (the
    /// jobs that run after it), by name. The stores read them through an
    /// index of edges (SQL's `job_edges`, etcd's `edges/`), so the read is
    /// as large as the answer; this default reads the namespace's jobs.
    async fn dependents(&self, namespace: &str, name: &str) -> Result<Vec<JobRecord>, StoreError> {
        let mut jobs = self.list_jobs(Some(namespace)).await?;
        jobs.retain(|j| j.spec.after.iter().any(|e| e.job == name));
        Ok(jobs)
    }
}
