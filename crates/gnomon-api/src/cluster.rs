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
    pub term: u64,
    pub leader: Option<u64>,
    pub last_log: Option<u64>,
    pub applied: Option<u64>,
    pub snapshot: Option<u64>,
    pub members: Vec<ClusterMember>,
    /// A voter that has heard from no leader within the election timeout:
    /// it serves no linearizable reads and takes no writes.
    pub degraded: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterMember {
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
    pub id: u64,
    /// `HOST:PORT` of the new member's gnomon listener.
    pub address: String,
}

/// The answer to removing a member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Removed {
    pub removed: u64,
    pub status: ClusterStatus,
}
