//! The scheduling leader is the Raft leader.
//!
//! `campaign` waits until this member leads the Raft cluster, then fences
//! the scope with a token of the current term (a log entry, applied only in
//! that term). The term is lost when the member stops leading, when the
//! term changes, or when it cannot confirm its leadership with a quorum
//! within the election timeout (a member cut off from the others): its
//! writes could not commit anyway, and the state machine refuses them once
//! a later term exists.
//!
//! Leadership goes where a scheduler waits: a Raft leader with no scheduler
//! that wants to lead (it resigned, or none runs there) hands over — the
//! member with a waiting scheduler stands for election at once, and this
//! one stops sending heartbeats and does not stand — so a SIGTERM moves the
//! scheduler in well under an election timeout.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use openraft::ServerState;
use tokio::sync::watch;

use super::network::Rpc;
use super::{term_token, token_term, wall_ms, Member, RaftStore};
use crate::election::count_election;
use crate::roles::*;
use crate::{ElectionError, Elector, Fence, LeaderInfo, Leadership, StoreError};

/// The elector over one member.
#[derive(Debug, Clone)]
pub struct RaftElector {
    member: Arc<Member>,
    /// The `lost` senders of the terms this elector holds, by token.
    terms: Arc<Mutex<HashMap<u64, watch::Sender<bool>>>>,
}

impl RaftElector {
    pub fn new(member: Arc<Member>) -> RaftElector {
        RaftElector { member, terms: Arc::default() }
    }
}

/// Counts a waiting campaign while it lives.
struct Waiting<'a>(&'a Member);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.campaigners.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Elector for RaftElector {
    fn backend(&self) -> &'static str {
        "raft"
    }

    async fn campaign(&self, scope: &str, me: &LeaderInfo) -> Result<Leadership, ElectionError> {
        let m = &self.member;
        m.campaigners.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(m);
        let store = RaftStore::new(m.clone());
        let mut metrics = m.raft.metrics();
        loop {
            // Wait to lead.
            let term = loop {
                let now = metrics.borrow_and_update().clone();
                if now.state == ServerState::Leader && now.current_leader == Some(m.id) {
                    break now.current_term;
                }
                if metrics.changed().await.is_err() {
                    return Err(ElectionError::Unavailable("the raft member stopped".into()));
                }
            };
            // The next token of this term: above any fence of it so far.
            let n = match store.leadership(scope).await {
                Ok(Some(r)) if token_term(r.token) == term => (r.token & ((1 << super::TERM_SHIFT) - 1)) + 1,
                Ok(_) => 0,
                Err(e) => {
                    tracing::debug!(error = %e, "raft: cannot read the leadership record yet; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if n >= 1 << super::TERM_SHIFT {
                return Err(ElectionError::Refused("too many fences in one raft term".into()));
            }
            let token = term_token(term, n);
            let fence = Fence { scope: scope.to_string(), token };
            match store.fence(&fence, me, wall_ms()).await {
                Ok(()) => {}
                Err(StoreError::Fenced { .. } | StoreError::StaleToken { .. }) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "raft: fencing a new term failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
            count_election("raft", "won");
            let (tx, rx) = watch::channel(false);
            self.terms.lock().unwrap_or_else(|e| e.into_inner()).insert(token, tx.clone());
            m.leading.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(watch_term(m.clone(), term, tx));
            return Ok(Leadership { scope: scope.to_string(), token, lost: rx });
        }
    }

    async fn resign(&self, leadership: &Leadership) -> Result<(), ElectionError> {
        let tx = self.terms.lock().unwrap_or_else(|e| e.into_inner()).remove(&leadership.token);
        if let Some(tx) = tx {
            let _ = tx.send(true);
        }
        // Hand Raft leadership over now (a shutdown, a clock too far off)
        // rather than at the steward's next round, unless a scheduler here
        // already stands again.
        if self.member.campaigners.load(Ordering::SeqCst) == 0 {
            self.member.hand_over().await;
        }
        Ok(())
    }
}

/// Signals `lost` when this member stops leading `term` or cannot confirm
/// it with a quorum within the election timeout.
async fn watch_term(m: Arc<Member>, term: u64, lost: watch::Sender<bool>) {
    let mut metrics = m.raft.metrics();
    let confirm_within = m.config.election_timeout.0;
    let mut every = tokio::time::interval(m.config.heartbeat.max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            _ = lost.closed() => break,
            _ = async {
                loop {
                    let now = metrics.borrow_and_update().clone();
                    if now.state != ServerState::Leader || now.current_term != term {
                        return;
                    }
                    if metrics.changed().await.is_err() {
                        return;
                    }
                }
            } => {
                tracing::warn!(term, "raft: this member no longer leads; the scheduler's term is over");
                break;
            }
            _ = every.tick() => {
                if *lost.borrow() {
                    break;
                }
                match tokio::time::timeout(confirm_within, m.raft.get_read_log_id()).await {
                    Ok(Ok(_)) => {}
                    _ => {
                        tracing::warn!(term, "raft: leadership not confirmed by a quorum within the election timeout; the scheduler's term is over");
                        count_election("raft", "lost");
                        break;
                    }
                }
            }
        }
    }
    let _ = lost.send(true);
    m.leading.fetch_sub(1, Ordering::SeqCst);
}

/// Moves Raft leadership to a member where a scheduler waits when none
/// leads here.
pub(super) fn spawn_steward(member: &Arc<Member>) {
    let weak = Arc::downgrade(member);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(500));
        loop {
            every.tick().await;
            let Some(m) = weak.upgrade() else { return };
            if m.leading.load(Ordering::SeqCst) > 0 || m.campaigners.load(Ordering::SeqCst) > 0 {
                continue;
            }
            m.hand_over().await;
        }
    });
}

impl Member {
    /// If this member leads Raft: asks each other voter whether a scheduler
    /// waits there (`TakeOver`, with this member's last log index); at the
    /// first yes, that voter stands for election as soon as it has this
    /// member's log, and this member stops renewing the followers' lease
    /// and does not stand until another member leads (or six election
    /// timeouts passed). This member's own vote is no longer leased (a Raft
    /// leader's vote is timed when it was won), so it grants the new term
    /// at once and, with three voters, the election needs no timeout.
    /// Returns whether another member took over.
    pub(crate) async fn hand_over(&self) -> bool {
        if !self.is_leader() {
            return false;
        }
        let (term, last, voters) = {
            let x = self.raft.metrics().borrow().clone();
            let ms = x.membership_config.membership();
            let voters: Vec<(u64, String)> =
                ms.voter_ids().filter(|id| *id != self.id).filter_map(|id| ms.get_node(&id).map(|n| (id, n.addr.clone()))).collect();
            (x.current_term, x.last_log_index, voters)
        };
        let mut wanted = false;
        for (id, addr) in voters.iter() {
            if let Ok(true) = self.net.call::<_, bool>(*id, addr, Rpc::TakeOver, &(self.id, last), Duration::from_secs(1)).await {
                tracing::info!(to = id, "raft: no scheduler leads here; handing leadership to a member where one waits");
                wanted = true;
                break;
            }
        }
        if !wanted {
            return false;
        }
        self.raft.runtime_config().heartbeat(false);
        self.hold_standing.store(true, Ordering::SeqCst);
        let mut metrics = self.raft.metrics();
        let moved = tokio::time::timeout(self.config.election_timeout.1 * 6, async {
            loop {
                let now = metrics.borrow_and_update().clone();
                if now.current_term > term && now.current_leader.is_some_and(|l| l != self.id) {
                    return true;
                }
                if metrics.changed().await.is_err() {
                    return false;
                }
            }
        })
        .await
        .unwrap_or(false);
        self.raft.runtime_config().heartbeat(true);
        self.hold_standing.store(false, Ordering::SeqCst);
        moved
    }
}
