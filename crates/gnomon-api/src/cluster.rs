//! The members of a `raft://` cluster.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The cluster as one member sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterStatus {
    /// The member that answered.
    pub this: u64,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub state: String,
    /// The Raft term this member is in; it rises with every election.
    pub term: u64,
    /// The id of the member it knows as the Raft leader, which is also the
    /// scheduling leader; absent: it knows none.
    pub leader: Option<u64>,
    /// The index of the last entry in its log; absent: its log is empty.
    pub last_log: Option<u64>,
    /// The index of the last log entry applied to its copy of the store;
    /// absent: none yet.
    pub applied: Option<u64>,
    /// The last log index its latest snapshot covers; absent: it has no
    /// snapshot yet.
    pub snapshot: Option<u64>,
    /// Every member of the cluster, voters and learners.
    pub members: Vec<ClusterMember>,
    /// A voter that has heard from no leader within the election timeout:
    /// it serves no linearizable reads and takes no writes.
    pub degraded: bool,
}

/// One member of a `raft://` cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterMember {
    /// The member's id (its `--raft-id`, 1 or more).
    pub id: u64,
    /// `HOST:PORT` of its gnomon listener.
    pub address: String,
    /// `voter` or `learner`.
    pub role: String,
    /// The last log index the leader knows it holds (on the leader only).
    pub matched: Option<u64>,
}

/// `POST /v1/cluster/learners`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewLearner {
    /// The id the new member was started with (`--raft-id`, 1 or more).
    #[serde(deserialize_with = "gnomon_core::int::exact")]
    #[schema(minimum = 1, maximum = 9007199254740991_u64)]
    pub id: u64,
    /// `HOST:PORT` of the new member's gnomon listener.
    #[schema(pattern = "^[A-Za-z0-9.-]+:(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$")]
    pub address: String,
}

/// The answer to removing a member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Removed {
    /// The id of the member that was removed.
    pub removed: u64,
    /// The cluster after the removal, as the answering member sees it.
    pub status: ClusterStatus,
}
