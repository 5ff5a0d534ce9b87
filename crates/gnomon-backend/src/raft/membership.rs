//! Membership of a `raft://` cluster: status, learners, promotion, removal.
//! Changes run on the leader; a member that does not lead forwards them.

use std::collections::BTreeSet;

use openraft::{BasicNode, ChangeMembers};
use serde::{Deserialize, Serialize};

use super::network::Rpc;
use super::types::NodeId;
use super::{Member, CALL_TIMEOUT};

/// Why a membership change did not happen.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
pub enum ChangeError {
    /// The change makes no sense for this cluster (unknown member, the last
    /// voter, …): nothing changed.
    #[error("{0}")]
    Refused(String),
    /// No leader could be reached, or it lost leadership on the way: the
    /// change may or may not have happened; `status` tells.
    #[error("{0}")]
    Unavailable(String),
}

/// Whether `addr` is `HOST:PORT`.
pub fn valid_address(addr: &str) -> bool {
    addr.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && !h.contains(char::is_whitespace) && p.parse::<u16>().is_ok_and(|p| p > 0))
}

/// A change of the cluster's members.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Change {
    /// Adds a non-voting member at `addr` (it receives the log, or a
    /// snapshot, and never takes part in elections); answered once it has
    /// caught up.
    AddLearner { id: NodeId, addr: String },
    /// Makes a learner a voter.
    Promote { id: NodeId },
    /// Removes a voter or a learner.
    Remove { id: NodeId },
}

/// One member as the cluster sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: NodeId,
    pub address: String,
    /// `voter` or `learner`.
    pub role: String,
    /// The last log index the leader knows it holds (on the leader only).
    pub matched: Option<u64>,
}

/// The cluster as one member sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub this: NodeId,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub state: String,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub last_log: Option<u64>,
    pub applied: Option<u64>,
    pub snapshot: Option<u64>,
    pub members: Vec<MemberStatus>,
    /// A voter that has heard from no leader within the election timeout
    /// serves no linearizable reads and takes no writes.
    pub degraded: bool,
}

impl Member {
    /// The cluster as this member sees it.
    pub fn status(&self) -> Status {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| MemberStatus {
                id: *id,
                address: node.addr.clone(),
                role: if voters.contains(id) { "voter" } else { "learner" }.to_string(),
                matched: m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map(|l| l.index),
            })
            .collect();
        let state = match m.state {
            openraft::ServerState::Leader => "leader",
            openraft::ServerState::Follower => "follower",
            openraft::ServerState::Candidate => "candidate",
            openraft::ServerState::Learner => "learner",
            openraft::ServerState::Shutdown => "shutdown",
        };
        Status {
            this: self.id,
            state: state.to_string(),
            term: m.current_term,
            leader: m.current_leader,
            last_log: m.last_log_index,
            applied: m.last_applied.map(|l| l.index),
            snapshot: m.snapshot.map(|l| l.index),
            members,
            degraded: m.current_leader.is_none() || (m.current_leader != Some(self.id) && !self.leader_heard()),
        }
    }

    /// Applies `change` on the leader (here, or forwarded).
    pub async fn change_membership(&self, change: Change) -> Result<(), ChangeError> {
        if self.is_leader() {
            return self.change_here(change).await;
        }
        let Some((id, addr)) = self.leader() else {
            return Err(ChangeError::Unavailable("no leader: membership cannot change without a quorum".into()));
        };
        self.net
            .call::<_, Result<(), ChangeError>>(id, &addr, Rpc::Membership, &change, CALL_TIMEOUT * 12)
            .await
            .map_err(|e| ChangeError::Unavailable(format!("the leader {id} did not answer: {e}")))?
    }

    /// Applies `change` here (this member must lead).
    pub(crate) async fn change_here(&self, change: Change) -> Result<(), ChangeError> {
        if !self.is_leader() {
            return Err(ChangeError::Unavailable(format!("member {} does not lead any more", self.id)));
        }
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership().clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let known = membership.get_node(&match &change {
            Change::AddLearner { id, .. } | Change::Promote { id } | Change::Remove { id } => *id,
        });
        let r = match change {
            Change::AddLearner { id, addr } => {
                if voters.contains(&id) {
                    return Err(ChangeError::Refused(format!("member {id} is already a voter")));
                }
                self.raft.add_learner(id, BasicNode::new(addr), true).await.map(|_| ())
            }
            Change::Promote { id } => {
                if known.is_none() {
                    return Err(ChangeError::Refused(format!("member {id} is not in the cluster; add it as a learner first")));
                }
                if voters.contains(&id) {
                    return Ok(());
                }
                self.raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false).await.map(|_| ())
            }
            Change::Remove { id } => {
                if known.is_none() {
                    return Err(ChangeError::Refused(format!("member {id} is not in the cluster")));
                }
                if voters.contains(&id) {
                    if voters.len() == 1 {
                        return Err(ChangeError::Refused("the last voter cannot be removed".to_string()));
                    }
                    self.raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await.map(|_| ())
                } else {
                    self.raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false).await.map(|_| ())
                }
            }
        };
        r.map_err(|e| match e {
            openraft::error::RaftError::APIError(openraft::error::ClientWriteError::ChangeMembershipError(c)) => {
                ChangeError::Refused(c.to_string())
            }
            e => ChangeError::Unavailable(e.to_string()),
        })
    }
}
