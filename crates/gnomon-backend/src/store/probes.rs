//! What a backend can do besides the roles every store has: leases for
//! worker sessions, stale reads, cluster clocks, a server clock, pushed job
//! changes. Each answers "not here" by default.

use async_trait::async_trait;
use gnomon_core::Millis;

use crate::*;

/// The backend's name and optional capabilities.
///
/// # To be correct, an implementation must…
/// - answer a capability only where it holds it: a node relies on each
///   answer (a `session_leases` store must expire a worker's lease in the
///   store itself; a `job_change_signal` must fire on every job write).
#[async_trait]
pub trait StoreProbes: Send + Sync {
    /// `sqlite`, `mysql`, `postgres`, `etcd` or `raft`.
    fn backend(&self) -> &'static str;

    /// Worker session liveness kept in the store itself, where the backend
    /// has leases (etcd); `None` keeps it only in the leader's memory.
    fn session_leases(&self) -> Option<std::sync::Arc<dyn SessionLeases>> {
        None
    }

    /// A view of this store whose reads answer from this replica's copy
    /// as it is, without confirming it is current (raft: no read index), for
    /// clients that ask for stale reads; `None` where reads have no such
    /// choice.
    fn stale_reads(&self) -> Option<std::sync::Arc<dyn Store>> {
        None
    }

    /// Where the store's members see each other's clocks (raft: measured on
    /// replication): this leader's clock minus the members' median, in ms,
    /// when a majority answered lately. `None` elsewhere.
    fn cluster_clock_skew(&self) -> Option<i64> {
        None
    }

    /// Whether [`StoreProbes::cluster_clock_skew`] can answer here once the
    /// members have been heard from (raft with three voters or more).
    fn measures_cluster_clocks(&self) -> bool {
        false
    }

    /// The store server's own clock (Unix ms) where it has one apart from
    /// this machine's (MySQL, PostgreSQL): the reference a node's clock is
    /// checked against. `None` elsewhere.
    async fn server_clock(&self) -> Result<Option<Millis>, StoreError> {
        Ok(None)
    }

    /// A signal on every job write, where the backend can push one (an etcd
    /// watch): the leader reads `job_changes` at once instead of at its next
    /// poll. `None`: the leader polls (at most a second late).
    fn job_change_signal(&self) -> Option<tokio::sync::mpsc::Receiver<()>> {
        None
    }
}
