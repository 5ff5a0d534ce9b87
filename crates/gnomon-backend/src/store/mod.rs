//! The `Store` seam, as role traits: each names what one part of the system
//! asks of the persistent state and what an implementation must hold for
//! it to be correct. [`Store`] is all of them together; every type that
//! implements every role is a `Store`.
//!
//! | role | who calls it |
//! |---|---|
//! | [`JobStore`] | the API (job writes, any replica), the leader (the change feed) |
//! | [`LeadershipStore`] | electors and the leader (epochs, fences, leader time) |
//! | [`LeaderWrites`] | the leader, fenced (fires and transitions) |
//! | [`RunStore`] | the API (run reads, cancel requests), the leader (recovery) |
//! | [`NotificationStore`] | the leader's deliverer (the outbox) |
//! | [`RetentionStore`] | the leader (pruning, fenced), metrics (size) |
//! | [`BackfillStore`] | the API (backfill requests, cancels), the leader (their progress, fenced) |
//! | [`WorkerStore`] | the worker service (each worker id's credential), the API (releasing an id) |
//! | [`StoreProbes`] | the node at start: what the backend can do besides |
//!
//! The conformance suite (`testing::conformance`) checks every role on
//! every backend, one file per role.

mod backfills;
mod jobs;
mod leader_writes;
mod leadership;
mod notifications;
mod probes;
mod retention;
mod runs;
mod workers;

pub use backfills::BackfillStore;
pub use jobs::JobStore;
pub use leader_writes::{backfill_steps, LeaderWrites};
pub use leadership::LeadershipStore;
pub use notifications::NotificationStore;
pub use probes::StoreProbes;
pub use retention::RetentionStore;
pub use runs::RunStore;
pub use workers::WorkerStore;

/// Every role trait, for `use gnomon_backend::roles::*` where a concrete
/// store's methods are called (a `dyn Store` needs no import).
pub mod roles {
    pub use super::{
        BackfillStore, JobStore, LeaderWrites, LeadershipStore, NotificationStore, RetentionStore, RunStore, Store, StoreProbes,
        WorkerStore,
    };
}

/// The persistent state of gnomon: every role together. Nothing is
/// implemented for `Store` itself; a backend implements each role.
pub trait Store:
    JobStore
    + LeadershipStore
    + LeaderWrites
    + RunStore
    + NotificationStore
    + RetentionStore
    + BackfillStore
    + WorkerStore
    + StoreProbes
    + Send
    + Sync
    + std::fmt::Debug
{
}

impl<T> Store for T where
    T: JobStore
        + LeadershipStore
        + LeaderWrites
        + RunStore
        + NotificationStore
        + RetentionStore
        + BackfillStore
        + WorkerStore
        + StoreProbes
        + Send
        + Sync
        + std::fmt::Debug
{
}
