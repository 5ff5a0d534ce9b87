//! What goes through the replicated log: one [`Command`] per store write,
//! and the [`Reply`] its application gives on every member.

use std::io::Cursor;

use gnomon_core::spec::JobSpec;
use gnomon_core::Millis;
use serde::{Deserialize, Serialize};

use crate::{
    CancelOutcome, Fence, FireOutcome, JobAdvance, JobRecord, LeaderInfo, NewRun, Precondition, StoreError, Transition, TurnWrite,
};

openraft::declare_raft_types!(
    /// The Raft types of the `raft` store.
    pub TypeConfig:
        D = Command,
        R = Applied,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

/// A member's id within its cluster.
pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;

/// One store write. Everything a member needs to apply it the same way as
/// every other member is in it: times, the uid of a new job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Command {
    PutJob {
        spec: Box<JobSpec>,
        precondition: Precondition,
        now: Millis,
        uid: String,
    },
    SetJobPaused {
        namespace: String,
        name: String,
        paused: bool,
        now: Millis,
    },
    DeleteJob {
        namespace: String,
        name: String,
        precondition: Precondition,
    },
    NextEpoch {
        scope: String,
    },
    /// A new scheduling term's fence (the elector's tokens carry the Raft
    /// term, see [`super::term_token`]).
    Fence {
        fence: Fence,
        holder: LeaderInfo,
        now: Millis,
    },
    Fire {
        fence: Fence,
        runs: Vec<NewRun>,
        advances: Vec<JobAdvance>,
    },
    Transition {
        fence: Fence,
        transitions: Vec<Transition>,
    },
    Turn {
        fence: Fence,
        runs: Vec<NewRun>,
        advances: Vec<JobAdvance>,
        transitions: Vec<Transition>,
    },
    RequestCancel {
        run_id: String,
        now: Millis,
    },
    /// Retention, with the cut-off time the leader computed.
    Prune {
        fence: Fence,
        keep_per_job: usize,
        before: Millis,
        max: usize,
    },
    /// The leader's clock, committed (the leader time never runs backwards).
    LeaderTime {
        fence: Fence,
        at: Millis,
    },
}

/// What applying a command gave (the same on every member).
pub type Applied = Result<Reply, StoreError>;

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    /// Blank and membership entries.
    None,
    Job(Box<JobRecord>),
    Done,
    Epoch(u64),
    Fired(Vec<FireOutcome>),
    Transitioned(Vec<bool>),
    Turn(TurnWrite),
    Cancel(CancelOutcome),
    Pruned(u64),
    LeaderTime(Millis),
}

impl Reply {
    pub(crate) fn unexpected(&self) -> StoreError {
        StoreError::Backend(format!("the replicated store answered {self:?} to a write it did not expect it for"))
    }
}

/// Storage errors from anything displayable.
pub mod err {
    use openraft::{AnyError, StorageIOError};

    use super::{NodeId, StorageError};

    fn any(e: impl std::fmt::Display) -> AnyError {
        AnyError::error(e.to_string())
    }

    pub fn read_logs(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::read_logs(any(e)).into()
    }

    pub fn write_logs(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::write_logs(any(e)).into()
    }

    pub fn read_vote(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::read_vote(any(e)).into()
    }

    pub fn write_vote(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::write_vote(any(e)).into()
    }

    pub fn write_state_machine(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::write_state_machine(any(e)).into()
    }

    pub fn write_snapshot(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::write_snapshot(None, any(e)).into()
    }
}
