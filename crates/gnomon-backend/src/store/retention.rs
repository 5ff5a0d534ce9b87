//! Retention: the leader's fenced pruning of finished runs, and the
//! store's size where the backend reports one.

use async_trait::async_trait;
use gnomon_core::Millis;

use crate::*;

/// Pruning and size.
///
/// # To be correct, an implementation must…
/// - delete only terminal runs (with their attempts and notifications),
///   never an open one, and only for the current token (fenced);
/// - keep fire uniqueness across pruning: a pruned run's instant is never
///   fired again, which holds because a job's `last_scheduled_at` only
///   moves forward.
#[async_trait]
pub trait RetentionStore: Send + Sync {
    /// Deletes terminal runs (with their attempts) beyond the newest
    /// `keep_per_job` of each job or fired before `before`, at most `max`
    /// of them; returns how many. A keyed run ([`crate::is_keyed_run_id`])
    /// fired at or after `keep_keyed_after` is never deleted, whatever the
    /// count. Every store prunes; this default (nothing) is for test stores.
    async fn prune(
        &self,
        _fence: &Fence,
        _keep_per_job: usize,
        _before: Millis,
        _keep_keyed_after: Millis,
        _max: usize,
    ) -> Result<u64, StoreError> {
        Ok(0)
    }
    /// The store's size in bytes, where the backend reports one (etcd).
    async fn size_bytes(&self) -> Option<u64> {
        None
    }
}
