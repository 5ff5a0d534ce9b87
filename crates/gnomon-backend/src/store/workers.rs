//! Worker ids: each bound to the credential that first opened a worker
//! session with it, written by any replica (the worker service, before a
//! session is opened), released by an admin.

use async_trait::async_trait;
use gnomon_core::Millis;

use crate::*;

/// Which credential owns each worker id.
///
/// # To be correct, an implementation must…
/// - record a binding only for an id that has none, atomically with that
///   check: of two binds of one id racing (from two servers, two handles),
///   one credential wins, and both calls answer the winner;
/// - keep a binding until [`WorkerStore::unbind_worker`] releases it: it is
///   never pruned, it survives a restart of every server, and every replica
///   answers it the same (after a failover too);
/// - answer [`WorkerStore::bind_worker`] with the owner as stored after the
///   call, never a credential that does not hold the id.
#[async_trait]
pub trait WorkerStore: Send + Sync {
    /// Binds `worker` to `credential` if the id has no owner yet, and
    /// returns the id's owner: `credential` when the binding is new or was
    /// already its own, else the credential that holds the id (nothing is
    /// written then). An API-side write (any replica, no fence).
    async fn bind_worker(&self, worker: &str, credential: &str, now: Millis) -> Result<String, StoreError>;
    /// Releases `worker` (an admin's call), so that the next credential to
    /// open a session with it binds it; false if it had no binding.
    async fn unbind_worker(&self, worker: &str) -> Result<bool, StoreError>;
    /// The credential `worker` is bound to, if any.
    async fn worker_owner(&self, worker: &str) -> Result<Option<String>, StoreError>;
}
