//! Pre-vote: a member stands for election only when a majority of the
//! voters would vote for it.
//!
//! openraft 0.9 has no pre-vote of its own: a member that was paused,
//! restarted or cut off times out, raises its term and stands; the leader
//! then meets that higher term on its next append and steps down, and the
//! scheduler's term ends for nothing. So openraft's own election timer is
//! off (`enable_elect: false`) and this module's timer replaces it:
//!
//! - a member records when it last heard from a leader (an append or a
//!   snapshot it accepted);
//! - once that is longer ago than the leader lease plus a random pause
//!   (one heartbeat interval plus up to the spread of the election
//!   timeout), it asks every other voter `PreVote` with its last log id; a
//!   voter says yes only if its own leader lease has run out too (it has
//!   not heard from a leader for the lease) and the candidate's log is at
//!   least as up to date as its own;
//! - with a majority of yeses (its own included) it stands, as soon as they
//!   are in (a voter that does not answer costs nothing then); otherwise
//!   it waits another random pause, its term unchanged.
//!
//! openraft's own timer waits the lease plus a whole election timeout; the
//! lease alone already keeps a live leader's followers from voting (they
//! refuse within it) and pre-vote keeps a returning member from disturbing
//! them, so the extra wait only has to part members that stand at once:
//! the heartbeat interval covers followers that heard the last append a
//! little apart, and the random spread parts the candidates.
//!
//! A Raft leader handing over (`Member::hand_over`) and the member taking
//! over (`Member::take_over`) stand or hold back directly, as before.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use openraft::ServerState;
use rand::Rng;

use super::network::Rpc;
use super::types::LogId;
use super::Member;

/// When this member last heard from a leader.
#[derive(Debug)]
pub(crate) struct Heard(Mutex<Instant>);

impl Default for Heard {
    fn default() -> Self {
        Heard(Mutex::new(Instant::now()))
    }
}

impl Heard {
    pub(crate) fn now(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn elapsed(&self) -> Duration {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).elapsed()
    }
}

/// How often the timer looks.
const TICK: Duration = Duration::from_millis(50);

impl Member {
    /// The leader lease (openraft's: the longest election timeout).
    fn lease(&self) -> Duration {
        self.config.election_timeout.1
    }

    fn last_log(&self) -> Option<LogId> {
        self.raft.data_metrics().borrow().last_log
    }

    /// Whether a leader was heard from within the lease (a member whose
    /// Raft state still names a leader it no longer hears from does not
    /// count it: pre-vote keeps that state from changing).
    pub(crate) fn leader_heard(&self) -> bool {
        self.heard.elapsed() <= self.lease()
    }

    /// Answers another member's pre-vote.
    pub(crate) fn pre_vote(&self, candidate_last: Option<LogId>) -> bool {
        let leads = self.raft.metrics().borrow().state == ServerState::Leader;
        !leads && self.heard.elapsed() > self.lease() && candidate_last >= self.last_log()
    }

    /// Asks the other voters; whether a majority would vote for this member.
    async fn majority_would_vote(&self) -> bool {
        let (voters, me_voter) = {
            let x = self.raft.metrics().borrow().clone();
            let ms = x.membership_config.membership();
            let voters: Vec<(u64, String)> =
                ms.voter_ids().filter(|id| *id != self.id).filter_map(|id| ms.get_node(&id).map(|n| (id, n.addr.clone()))).collect();
            (voters, ms.voter_ids().any(|id| id == self.id))
        };
        if !me_voter {
            return false;
        }
        // A majority of the voters, this one included.
        let all = voters.len() + 1;
        let need = all / 2 + 1;
        let last = self.last_log();
        let timeout = self.config.election_timeout.0;
        // Asked at once; the answer is in as soon as a majority said yes, so
        // a voter that is down (a host that does not answer) costs nothing
        // unless it is needed.
        let ask = (self.id, last);
        let mut asks: futures::stream::FuturesUnordered<_> =
            voters.iter().map(|(id, addr)| self.net.call::<_, bool>(*id, addr, Rpc::PreVote, &ask, timeout)).collect();
        let mut yes = 1;
        while yes < need {
            match asks.next().await {
                Some(Ok(true)) => yes += 1,
                Some(_) => {}
                None => return false,
            }
        }
        true
    }

    /// The random pause before a try (see the module's doc).
    fn pause(&self) -> Duration {
        let (min, max) = self.config.election_timeout;
        let spread = max.saturating_sub(min).max(TICK * 2);
        self.config.heartbeat + rand::thread_rng().gen_range(Duration::ZERO..=spread)
    }
}

/// The election timer that replaces openraft's (see the module's doc).
pub(super) fn spawn_timer(member: &Arc<Member>) {
    let weak = Arc::downgrade(member);
    tokio::spawn(async move {
        // The timeout of this round, and when this member last asked.
        let mut timeout = None;
        let mut asked: Option<Instant> = None;
        let mut seen = (0, None);
        loop {
            tokio::time::sleep(TICK).await;
            let Some(m) = weak.upgrade() else { return };
            let (term, leader) = {
                let x = m.raft.metrics().borrow().clone();
                (x.current_term, x.current_leader)
            };
            if (term, leader) != seen && leader.is_some() {
                tracing::info!(member = m.id, term, leader, "raft: the cluster has a leader");
                seen = (term, leader);
            }
            if let Err(fatal) = &m.raft.metrics().borrow().running_state {
                if !m.stopping.load(Ordering::SeqCst) {
                    tracing::error!(member = m.id, error = %fatal, "raft: this member stopped; it takes no part in the cluster until the server restarts");
                }
                return;
            }
            if m.raft.metrics().borrow().state == ServerState::Leader {
                m.heard.now();
            }
            if m.heard.elapsed() < m.lease() {
                // A leader lives: the next try starts from the first wait.
                asked = None;
                continue;
            }
            // The first try waits for the lease plus a random pause since
            // the leader was last heard from; a try that did not end in a
            // leader (a split vote, a lost pre-vote) is followed by another
            // after a fresh random pause, so two members that stood at once
            // part.
            let wait = *timeout.get_or_insert_with(|| m.pause());
            let quiet = match asked {
                None => m.heard.elapsed() >= m.lease() + wait,
                Some(a) => m.heard.elapsed() >= m.lease() && a.elapsed() >= wait,
            };
            if !quiet || m.hold_standing.load(Ordering::SeqCst) {
                continue;
            }
            timeout = None;
            asked = Some(Instant::now());
            if m.majority_would_vote().await {
                tracing::info!(member = m.id, "raft: no leader heard from and a majority would vote; standing for election");
                if let Err(e) = m.raft.trigger().elect().await {
                    tracing::debug!(error = %e, "raft: standing for election failed");
                }
            } else {
                tracing::debug!(member = m.id, "raft: a majority would not vote (a leader is alive); not standing");
            }
        }
    });
}
