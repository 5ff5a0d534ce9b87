//! The embedded Raft store and elector (`raft://`): three (or five) gnomon
//! servers replicate the store among themselves, with no database and no
//! etcd.
//!
//! - `log.rs`: the Raft log, vote and commit index (SQLite, fsynced).
//! - `state.rs`: the state machine, the embedded SQLite store written only by
//!   applying committed entries; snapshots are copies of it.
//! - `network.rs`: the `gnomon.raft.v1` service and its client.
//! - `elector.rs`: the scheduling leader is the Raft leader.
//! - `prevote.rs`: the election timer; a member stands only when a
//!   majority would vote for it.
//!
//! A store write is one log entry ([`types::Command`]); a member that does
//! not lead forwards it to the one that does. A read is linearizable: the
//! leader confirms its leadership with a quorum (read index) and the member
//! serving the read waits until it has applied up to that index.
//!
//! Fencing is the store's: a fenced write applies only if its token is the
//! scope's latest fence, checked by the state machine when the entry is
//! applied. The elector's tokens are `term << 20 | n` — the Raft term, and a
//! count of the fences in that term (a scheduler that resigns and campaigns
//! again within one term gets a higher one) — so a scheduler of a later
//! Raft term always fences above every earlier one. A leader of an old term
//! commits nothing (Raft), and an entry it appended that a later leader
//! commits still meets the fence check when applied.

mod elector;
mod log;
mod membership;
mod network;
mod prevote;
mod service;
mod state;
pub mod types;
mod writes;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gnomon_core::spec::JobSpec;
use gnomon_core::Millis;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ServerState};
use serde::{Deserialize, Serialize};

pub use elector::RaftElector;
pub use membership::{valid_address, Change, ChangeError, MemberStatus, Status};
pub use network::Connect;
use network::{Factory, Net, Rpc};
pub use service::Service;
use state::Current;
use types::{Applied, Command, NodeId, Raft, Reply};

use crate::*;

/// Bits of a token below the term.
const TERM_SHIFT: u32 = 20;

/// This member's wall clock, Unix ms.
pub(crate) fn wall_ms() -> Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The token of the `n`th fence of `term`.
pub fn term_token(term: u64, n: u64) -> u64 {
    (term << TERM_SHIFT) | n
}

/// The Raft term a token belongs to.
pub fn token_term(token: u64) -> u64 {
    token >> TERM_SHIFT
}

/// How one member runs.
#[derive(Clone)]
pub struct RaftConfig {
    pub id: NodeId,
    /// Where the log, snapshots and the state database live.
    pub dir: PathBuf,
    /// Every voter's id and address (`host:port` of its gnomon listener).
    pub peers: BTreeMap<NodeId, String>,
    /// The credential sent to the other members.
    pub token: Option<String>,
    /// How to open a channel to a member (TLS); plain HTTP/2 when `None`.
    pub connect: Option<Connect>,
    pub heartbeat: Duration,
    /// A follower that hears nothing from its leader for a time in this
    /// range starts an election; the leader's lease is the upper bound.
    pub election_timeout: (Duration, Duration),
    /// Entries between snapshots (and kept after one, for slow followers).
    pub snapshot_every: u64,
}

impl RaftConfig {
    pub fn new(id: NodeId, dir: PathBuf, peers: BTreeMap<NodeId, String>) -> RaftConfig {
        RaftConfig {
            id,
            dir,
            peers,
            token: None,
            connect: None,
            heartbeat: Duration::from_millis(150),
            election_timeout: (Duration::from_millis(750), Duration::from_millis(1125)),
            snapshot_every: 5000,
        }
    }
}

/// A write sent to the leader by another member.
#[derive(Serialize, Deserialize)]
pub(crate) struct Forwarded {
    pub from: NodeId,
    pub command: Command,
}

/// One member of the cluster: its Raft node, its copy of the state, and
/// its links to the others.
pub struct Member {
    pub id: NodeId,
    pub raft: Raft,
    current: Arc<Current>,
    net: Arc<Net>,
    /// Schedulers on this member waiting to lead (see `elector.rs`).
    campaigners: AtomicUsize,
    /// Terms a scheduler here leads (non-zero while one does).
    leading: AtomicUsize,
    /// When this member last heard from a leader (see `prevote.rs`).
    heard: prevote::Heard,
    /// While this member hands its leadership over: it does not stand.
    hold_standing: AtomicBool,
    /// Set by [`Member::shutdown`] (a stop that is no failure).
    stopping: AtomicBool,
    config: RaftConfig,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("id", &self.id).finish()
    }
}

/// How long a write or a read barrier may take before it is reported
/// unavailable (its outcome unknown, for a write).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("raft: {e}"))
}

impl Member {
    /// Starts this member (it joins the cluster its log knows, if any).
    pub async fn start(config: RaftConfig) -> Result<Arc<Member>, StoreError> {
        let bad = |e: std::io::Error| StoreError::Backend(format!("cannot create the raft directory {}: {e}", config.dir.display()));
        std::fs::create_dir_all(&config.dir).map_err(bad)?;
        let log = log::LogStore::open(&config.dir.join("log.db")).map_err(StoreError::Backend)?;
        let sm = state::StateMachine::open(&config.dir).await?;
        let current = sm.current.clone();
        let raft_config = openraft::Config {
            cluster_name: "gnomon".into(),
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            election_timeout_min: config.election_timeout.0.as_millis() as u64,
            election_timeout_max: config.election_timeout.1.as_millis() as u64,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: config.snapshot_every / 5,
            install_snapshot_timeout: 30_000,
            // Elections start from this crate's pre-vote timer.
            enable_elect: false,
            ..Default::default()
        }
        .validate()
        .map_err(|e| StoreError::InvalidUrl(format!("raft settings: {e}")))?;
        let net = Arc::new(Net::new(config.connect.clone(), config.token.clone()));
        let raft = Raft::new(config.id, Arc::new(raft_config), Factory { net: net.clone() }, log, sm)
            .await
            .map_err(|e| StoreError::Backend(format!("cannot start raft member {}: {e}", config.id)))?;
        let member = Arc::new(Member {
            id: config.id,
            raft,
            current,
            net,
            campaigners: AtomicUsize::new(0),
            leading: AtomicUsize::new(0),
            heard: prevote::Heard::default(),
            hold_standing: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            config,
        });
        elector::spawn_steward(&member);
        prevote::spawn_timer(&member);
        Ok(member)
    }

    /// Makes the configured peers a new cluster, once: refused when this
    /// member already has a log (it belongs to a cluster).
    pub async fn bootstrap(&self) -> Result<(), StoreError> {
        let members: BTreeMap<NodeId, BasicNode> = self.config.peers.iter().map(|(id, a)| (*id, BasicNode::new(a))).collect();
        self.raft.initialize(members).await.map_err(|e| StoreError::Backend(format!("cannot bootstrap the raft cluster: {e}")))
    }

    /// The `gnomon.raft.v1` service of this member, to mount on the listener.
    pub fn service(self: &Arc<Self>) -> Service {
        Service { member: self.clone() }
    }

    /// Cuts (or restores) this member's links to `peer` (fault injection).
    pub fn set_cut(&self, peer: NodeId, cut: bool) {
        self.net.set_cut(peer, cut);
    }

    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = self.raft.shutdown().await;
    }

    pub(crate) fn leader(&self) -> Option<(NodeId, String)> {
        let m = self.raft.metrics().borrow().clone();
        let id = m.current_leader?;
        // A leader not heard from for the lease may be gone (this member
        // cut off, say): no leader, rather than one that may be stale.
        if id != self.id && !self.leader_heard() {
            return None;
        }
        let node = m.membership_config.membership().get_node(&id).cloned()?;
        Some((id, node.addr))
    }

    /// While this member leads: its clock minus the median of the voters'
    /// clocks (ms), measured on replication round trips, when enough of
    /// them answered lately (see `network::skew_from_offsets`).
    pub fn cluster_clock_skew(&self) -> Option<i64> {
        if !self.is_leader() {
            return None;
        }
        let m = self.raft.metrics().borrow().clone();
        let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().filter(|id| *id != self.id).collect();
        network::skew_from_offsets(&self.net.clock_offsets(&voters), voters.len() + 1)
    }

    /// Whether the voters are enough for [`Member::cluster_clock_skew`] to
    /// answer (three clocks or more).
    pub fn measures_clocks(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        m.membership_config.membership().voter_ids().count() >= 3
    }

    pub(crate) fn is_leader(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// Proposes `command` on this member; `Err` when it does not lead.
    pub(crate) async fn propose_here(&self, command: Command) -> Result<Applied, String> {
        match tokio::time::timeout(CALL_TIMEOUT, self.raft.client_write(command)).await {
            Err(_) => Err(format!("member {} did not commit the write within {CALL_TIMEOUT:?}", self.id)),
            Ok(Ok(r)) => Ok(r.data),
            Ok(Err(e)) => Err(e.to_string()),
        }
    }

    /// Proposes `command` where it can be committed: here if this member
    /// leads, else at the leader. An error is an unknown outcome.
    async fn propose(&self, command: Command) -> Result<Reply, StoreError> {
        let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
        loop {
            let attempt = match tokio::time::timeout_at(deadline, self.raft.client_write(command.clone())).await {
                Err(_) => return Err(unavailable(format!("the write was not committed within {CALL_TIMEOUT:?}; its outcome is unknown"))),
                Ok(r) => r,
            };
            match attempt {
                Ok(r) => return r.data,
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                    // Only to a leader heard from within the lease: one this
                    // member no longer hears may be gone.
                    let heard = self.leader_heard();
                    if let (Some(id), Some(node), true) = (f.leader_id, f.leader_node, heard) {
                        let msg = Forwarded { from: self.id, command: command.clone() };
                        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                        let r: Result<Applied, String> =
                            self.net.call(id, &node.addr, Rpc::Forward, &msg, left).await.map_err(unavailable)?;
                        return match r {
                            Ok(applied) => Ok(applied?),
                            Err(e) => Err(unavailable(format!("the leader {id} refused the write: {e}"))),
                        };
                    }
                    // No leader known: wait for one a little, then retry.
                    if tokio::time::Instant::now() + Duration::from_millis(100) >= deadline {
                        return Err(unavailable("no leader: this member cannot reach a quorum of the cluster; writes are refused"));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(unavailable(e)),
            }
        }
    }

    /// Waits until this member has applied everything committed before the
    /// call (read index, confirmed by the leader with a quorum).
    async fn read_barrier(&self) -> Result<(), StoreError> {
        let index = if self.is_leader() {
            match tokio::time::timeout(CALL_TIMEOUT, self.raft.get_read_log_id()).await {
                Err(_) => return Err(unavailable("the leader could not confirm its leadership with a quorum")),
                Ok(Err(e)) => return Err(unavailable(e)),
                Ok(Ok((read, _))) => read.map(|l| l.index),
            }
        } else {
            let Some((id, addr)) = self.leader() else {
                return Err(unavailable("no leader: this member cannot reach a quorum of the cluster"));
            };
            let r: Result<Option<u64>, String> =
                self.net.call(id, &addr, Rpc::ReadIndex, &self.id, CALL_TIMEOUT).await.map_err(unavailable)?;
            r.map_err(unavailable)?
        };
        if let Some(i) = index {
            self.raft
                .wait(Some(CALL_TIMEOUT))
                .applied_index_at_least(Some(i), "read index")
                .await
                .map_err(|e| unavailable(format!("this member did not catch up with the leader: {e}")))?;
        }
        Ok(())
    }

    /// Asked by a leader that hands over (its last log index): if a
    /// scheduler here waits to lead, stands for election as soon as this
    /// member has that much of the log (a voter grants only a candidate
    /// whose log is as long as its own), within a second.
    pub(crate) async fn take_over(&self, leader_last: Option<u64>) -> bool {
        if self.campaigners.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let raft = self.raft.clone();
        tokio::spawn(async move {
            let mut metrics = raft.metrics();
            let caught_up = metrics.wait_for(|m| m.last_log_index >= leader_last);
            let _ = tokio::time::timeout(Duration::from_secs(1), caught_up).await;
            if let Err(e) = raft.trigger().elect().await {
                tracing::debug!(error = %e, "raft: standing for election failed");
            }
        });
        true
    }
}

/// The store over one member.
#[derive(Debug, Clone)]
pub struct RaftStore {
    pub member: Arc<Member>,
    /// Reads from this member's copy as it is, without the read index.
    stale: bool,
}

impl RaftStore {
    pub fn new(member: Arc<Member>) -> RaftStore {
        RaftStore { member, stale: false }
    }

    /// Proposes a command and takes the value out of the reply it must
    /// give (`take` hands any other reply back).
    async fn ask<T>(&self, command: Command, take: impl FnOnce(Reply) -> Result<T, Reply> + Send) -> Result<T, StoreError> {
        take(self.member.propose(command).await?).map_err(|r| r.unexpected())
    }

    async fn read(&self) -> Result<Arc<crate::sqlite::SqliteStore>, StoreError> {
        if !self.stale {
            self.member.read_barrier().await?;
        }
        Ok(self.member.current.store())
    }
}

#[async_trait]
impl JobStore for RaftStore {
    async fn put_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError> {
        let uid = format!("{:016x}", rand::random::<u64>());
        let spec = Box::new(spec.clone());
        // The check is made as the entry applies; a job without edges has
        // none to make, and its entry stays readable by older members.
        let command = match spec.after.is_empty() {
            true => Command::PutJob { spec, precondition, now, uid },
            false => Command::PutJobChecked { spec, precondition, now, uid },
        };
        self.ask(command, |r| match r {
            Reply::Job(j) => Ok(*j),
            r => Err(r),
        })
        .await
    }

    async fn set_job_paused(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError> {
        self.ask(Command::SetJobPaused { namespace: namespace.into(), name: name.into(), paused, now }, |r| match r {
            Reply::Job(j) => Ok(*j),
            r => Err(r),
        })
        .await
    }

    async fn delete_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError> {
        self.ask(Command::DeleteJobChecked { namespace: namespace.into(), name: name.into(), precondition }, |r| match r {
            Reply::Done => Ok(()),
            r => Err(r),
        })
        .await
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
        self.read().await?.get_job(namespace, name).await
    }

    async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>, StoreError> {
        self.read().await?.list_jobs(namespace).await
    }

    async fn dependents(&self, namespace: &str, name: &str) -> Result<Vec<JobRecord>, StoreError> {
        self.read().await?.dependents(namespace, name).await
    }

    async fn job_changes(&self, since: u64) -> Result<JobChanges, StoreError> {
        self.read().await?.job_changes(since).await
    }

    async fn job_heads(&self) -> Result<JobHeads, StoreError> {
        self.read().await?.job_heads().await
    }

    async fn jobs_by_uid(&self, uids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
        self.read().await?.jobs_by_uid(uids).await
    }
}

#[async_trait]
impl LeadershipStore for RaftStore {
    async fn next_epoch(&self, scope: &str) -> Result<u64, StoreError> {
        self.ask(Command::NextEpoch { scope: scope.into() }, |r| match r {
            Reply::Epoch(n) => Ok(n),
            r => Err(r),
        })
        .await
    }

    async fn fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError> {
        self.ask(Command::Fence { fence: fence.clone(), holder: holder.clone(), now }, |r| match r {
            Reply::Done => Ok(()),
            r => Err(r),
        })
        .await
    }

    async fn leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError> {
        self.read().await?.leadership(scope).await
    }

    async fn advance_leader_time(&self, fence: &Fence, at: Millis) -> Result<Millis, StoreError> {
        self.ask(Command::LeaderTime { fence: fence.clone(), at }, |r| match r {
            Reply::LeaderTime(t) => Ok(t),
            r => Err(r),
        })
        .await
    }
}

#[async_trait]
impl RunStore for RaftStore {
    async fn request_cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
        self.ask(Command::RequestCancel { run_id: run_id.into(), now }, |r| match r {
            Reply::Cancel(c) => Ok(c),
            r => Err(r),
        })
        .await
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError> {
        self.read().await?.get_run(run_id).await
    }

    async fn list_runs(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError> {
        self.read().await?.list_runs(filter, limit, cursor).await
    }

    async fn open_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.read().await?.open_runs().await
    }

    async fn cancel_requests(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.read().await?.cancel_requests().await
    }

    async fn live_attempts(&self) -> Result<Vec<LiveAttempt>, StoreError> {
        self.read().await?.live_attempts().await
    }

    async fn kept_keyed_runs(&self, since: Millis) -> Result<Vec<KeptRun>, StoreError> {
        self.read().await?.kept_keyed_runs(since).await
    }
}

#[async_trait]
impl NotificationStore for RaftStore {
    async fn due_notifications(&self, now: Millis, limit: u32) -> Result<Vec<Notification>, StoreError> {
        self.read().await?.due_notifications(now, limit).await
    }

    async fn settle_notification(&self, fence: &Fence, delivery: &Delivery) -> Result<bool, StoreError> {
        self.ask(Command::SettleNotification { fence: fence.clone(), delivery: delivery.clone() }, |r| match r {
            Reply::Settled(b) => Ok(b),
            r => Err(r),
        })
        .await
    }

    async fn run_notifications(&self, run_id: &str) -> Result<Vec<Notification>, StoreError> {
        self.read().await?.run_notifications(run_id).await
    }
}

#[async_trait]
impl RetentionStore for RaftStore {
    async fn prune(
        &self,
        fence: &Fence,
        keep_per_job: usize,
        before: Millis,
        keep_keyed_after: Millis,
        max: usize,
    ) -> Result<u64, StoreError> {
        self.ask(Command::Prune { fence: fence.clone(), keep_per_job, before, keep_keyed_after, max }, |r| match r {
            Reply::Pruned(n) => Ok(n),
            r => Err(r),
        })
        .await
    }

    async fn size_bytes(&self) -> Option<u64> {
        self.member.current.store().size_bytes().await
    }
}

#[async_trait]
impl StoreProbes for RaftStore {
    fn backend(&self) -> &'static str {
        "raft"
    }

    fn cluster_clock_skew(&self) -> Option<i64> {
        self.member.cluster_clock_skew()
    }

    fn measures_cluster_clocks(&self) -> bool {
        self.member.measures_clocks()
    }

    fn stale_reads(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(RaftStore { member: self.member.clone(), stale: true }))
    }
}

#[async_trait]
impl BackfillStore for RaftStore {
    async fn create_backfill(&self, b: &NewBackfill, now: Millis) -> Result<BackfillRecord, StoreError> {
        self.ask(Command::CreateBackfill { backfill: b.clone(), now }, |r| match r {
            Reply::Backfill(b) => Ok(*b),
            r => Err(r),
        })
        .await
    }

    async fn get_backfill(&self, id: &str) -> Result<Option<BackfillRecord>, StoreError> {
        self.read().await?.get_backfill(id).await
    }

    async fn list_backfills(&self, namespace: Option<&str>) -> Result<Vec<BackfillRecord>, StoreError> {
        self.read().await?.list_backfills(namespace).await
    }

    async fn cancel_backfill(&self, id: &str, now: Millis) -> Result<BackfillRecord, StoreError> {
        self.ask(Command::CancelBackfill { id: id.into(), now }, |r| match r {
            Reply::Backfill(b) => Ok(*b),
            r => Err(r),
        })
        .await
    }

    async fn running_backfills(&self) -> Result<Vec<BackfillRecord>, StoreError> {
        self.read().await?.running_backfills().await
    }

    async fn advance_backfill(&self, fence: &Fence, progress: &BackfillProgress) -> Result<bool, StoreError> {
        self.ask(Command::AdvanceBackfill { fence: fence.clone(), progress: progress.clone() }, |r| match r {
            Reply::Settled(b) => Ok(b),
            r => Err(r),
        })
        .await
    }
}

/// A bind reads first (a read barrier, no log entry): a bound id, the
/// usual case, costs nothing in the log. An unbound one is one entry, which
/// binds it as it is applied only if it is still unbound then.
#[async_trait]
impl WorkerStore for RaftStore {
    async fn bind_worker(&self, worker: &str, credential: &str, now: Millis) -> Result<String, StoreError> {
        if let Some(owner) = self.worker_owner(worker).await? {
            return Ok(owner);
        }
        let command = Command::BindWorker { worker: worker.into(), credential: credential.into(), now };
        self.ask(command, |r| match r {
            Reply::Owner(o) => Ok(o),
            r => Err(r),
        })
        .await
    }

    async fn unbind_worker(&self, worker: &str) -> Result<bool, StoreError> {
        self.ask(Command::UnbindWorker { worker: worker.into() }, |r| match r {
            Reply::Settled(b) => Ok(b),
            r => Err(r),
        })
        .await
    }

    async fn worker_owner(&self, worker: &str) -> Result<Option<String>, StoreError> {
        self.read().await?.worker_owner(worker).await
    }
}
