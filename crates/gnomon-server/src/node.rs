//! A server node: campaigns for leadership and runs the leader loops while it
//! leads. Shared state for the API lives in [`NodeHandle`].

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use gnomon_backend::{Elector, Fence, LeaderInfo, Store};
use gnomon_core::Clock;
use tokio::sync::{mpsc, watch};

use crate::leader::{LeaderCommand, LeaderConfig, LeaderExit, LeaderParts, LeaderRuntime, PressureInfo, WorkerInfo, WorkersView};
use crate::leader_time::{self, ClockStatus, Keeper, LeaderClock, Meters, SharedStatus, SkewLimits, Verdict};

pub const SCOPE: &str = "scheduler";

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: String,
    /// The address workers and clients should use to reach this node.
    pub advertise: String,
    pub leader: LeaderConfig,
    /// How far this node's clock may be from the leader time.
    pub clock: SkewLimits,
}

/// What the API needs to know about this node.
#[derive(Debug, Clone)]
pub struct NodeHandle {
    pub config: NodeConfig,
    pub store: Arc<dyn Store>,
    pub elector_backend: &'static str,
    pub elector: Arc<dyn Elector>,
    pub clock: Arc<dyn Clock>,
    clock_status: SharedStatus,
    state: Arc<RwLock<NodeState>>,
}

#[derive(Debug, Default)]
struct NodeState {
    term: Option<(u64, mpsc::Sender<LeaderCommand>)>,
    workers: WorkersView,
}

impl NodeHandle {
    /// The token of the term this node leads, if it leads.
    pub fn leading_token(&self) -> Option<u64> {
        self.read().term.as_ref().map(|(t, _)| *t)
    }

    pub fn leader_commands(&self) -> Option<mpsc::Sender<LeaderCommand>> {
        self.read().term.as_ref().map(|(_, tx)| tx.clone())
    }

    /// The advertised address of the current leader if it is another node:
    /// the election backend's view where it has one (etcd), else the
    /// store's fenced leadership record.
    pub async fn leader_address(&self) -> Option<String> {
        let me = &self.config.advertise;
        if let Some(a) = self.elector.current_leader(SCOPE).await {
            return (a != *me && !a.is_empty()).then_some(a);
        }
        match self.store.leadership(SCOPE).await {
            Ok(Some(r)) if r.holder != self.config.node_id && !r.address.is_empty() => Some(r.address),
            _ => None,
        }
    }

    /// Tells the leader (if it is this node) to look at the store now.
    pub fn nudge(&self) {
        if let Some(tx) = self.leader_commands() {
            let _ = tx.try_send(LeaderCommand::Nudge);
        }
    }

    /// Tells the leader (if it is this node) that a run was changed in the
    /// store (a cancel), so that it reloads it now: a cancelled `pending`
    /// run no longer counts against `forbid`/`buffer_one`. On another
    /// node's API the leader finds out when it next touches the run.
    pub fn run_changed(&self, run_id: &str) {
        if let Some(tx) = self.leader_commands() {
            let _ = tx.try_send(LeaderCommand::RunChanged { run_id: run_id.to_string() });
        }
    }

    /// This node's clock as measured against the leader time.
    pub fn clock_status(&self) -> ClockStatus {
        self.clock_status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The worker sessions of the current term (empty on a follower).
    pub fn workers(&self) -> Vec<WorkerInfo> {
        let view = self.read().workers.clone();
        let list = view.read().unwrap_or_else(|p| p.into_inner()).workers.clone();
        list
    }

    /// Why runs of the job are waiting in `pending`, if the leader knows.
    pub fn waiting_reason(&self, job_uid: &str) -> Option<String> {
        let view = self.read().workers.clone();
        let reason = view.read().unwrap_or_else(|p| p.into_inner()).waiting.get(job_uid).cloned();
        reason
    }

    /// The leader's backpressure state (`None` on a follower).
    pub fn pressure(&self) -> Option<PressureInfo> {
        let view = self.read().workers.clone();
        let p = view.read().unwrap_or_else(|p| p.into_inner()).pressure.clone();
        p
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, NodeState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, NodeState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Node {
    pub handle: NodeHandle,
    elector: Arc<dyn Elector>,
}

impl Node {
    pub fn new(config: NodeConfig, store: Arc<dyn Store>, elector: Arc<dyn Elector>, clock: Arc<dyn Clock>) -> Self {
        let handle = NodeHandle {
            config,
            store,
            elector_backend: elector.backend(),
            elector: elector.clone(),
            clock,
            clock_status: SharedStatus::default(),
            state: Arc::default(),
        };
        Self { handle, elector }
    }

    /// Campaigns and leads until `shutdown` turns true; then resigns.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let backend = self.elector.backend();
        let me = LeaderInfo {
            holder: self.handle.config.node_id.clone(),
            address: self.handle.config.advertise.clone(),
            backend: backend.to_string(),
        };
        metrics::gauge!("gnomon_is_leader", "scope" => SCOPE).set(0.0);
        let limits = self.handle.config.clock;
        let meters = Arc::new(Meters::default());
        let observer = {
            let h = self.handle.clone();
            tokio::spawn(leader_time::observe(
                h.store.clone(),
                SCOPE,
                h.clock.clone(),
                meters.clone(),
                h.clock_status.clone(),
                limits,
                move || h.leading_token().is_some(),
            ))
        };
        while !*shutdown.borrow() {
            let leadership = tokio::select! {
                r = self.elector.campaign(SCOPE, &me) => r,
                _ = shutdown.changed() => break,
            };
            let leadership = match leadership {
                Ok(l) => l,
                Err(e) => {
                    metrics::counter!("gnomon_leader_election_total", "backend" => backend, "result" => "error").increment(1);
                    tracing::warn!(error = %e, "campaign failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = shutdown.changed() => {}
                    }
                    continue;
                }
            };
            // The term starts from the committed leader time, and not at all
            // if this node's clock is too far from it.
            let Some(committed) = self.committed_leader_time().await else {
                tracing::warn!("cannot read the committed leader time; giving the term back");
                let _ = self.elector.resign(&leadership).await;
                self.hold_off(Duration::from_secs(1), &mut shutdown).await;
                continue;
            };
            // Where the store measures the members' clocks (raft), their
            // median is the better reference. A cluster's first leader has
            // no committed time and no readings to judge itself by: it
            // waits (briefly) for the first round trips to measure the
            // members, so that a wrong clock never commits the first
            // leader time, which every later leader would start from.
            let mut cluster_skew = self.handle.store.cluster_clock_skew();
            if committed == 0 && cluster_skew.is_none() && self.handle.store.measures_cluster_clocks() {
                let until = Instant::now() + FIRST_MEASURE;
                while cluster_skew.is_none() && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    cluster_skew = self.handle.store.cluster_clock_skew();
                }
            }
            // Where the store server has a clock: this node against the
            // median of it, this node and the last leader.
            let mut server_center = None;
            if cluster_skew.is_none() {
                if let Some(me) = leader_time::server_offset(&*self.handle.store, &*self.handle.clock, 3).await {
                    let leader = meters.leader_vs_server.lock().unwrap_or_else(|p| p.into_inner()).estimate(Instant::now()).map(|e| -e);
                    cluster_skew = Some(leader_time::server_skew(me, leader));
                    server_center = cluster_skew.map(|s| me - s);
                }
            }
            let wall = self.handle.clock.now_millis();
            let estimate = meters.leader.lock().unwrap_or_else(|p| p.into_inner()).estimate(Instant::now());
            let start_skew = cluster_skew.or_else(|| leader_time::takeover_skew(committed, wall, estimate));
            if leader_time::report(&self.handle.clock_status, start_skew, limits, "new leader") == Some(Verdict::StepDown) {
                leader_time::stepped_down(&self.handle.clock_status, start_skew.unwrap_or(0), limits, wall, "taking over");
                metrics::counter!("gnomon_leader_election_total", "backend" => backend, "result" => "refused").increment(1);
                if let Err(e) = self.elector.resign(&leadership).await {
                    tracing::warn!(error = %e, "resign failed");
                }
                self.hold_off(leader_time::HOLD_OFF, &mut shutdown).await;
                continue;
            }
            // A clock behind the committed time (within the bound, or the
            // term was refused above) waits until it reaches it: no time-based
            // decision of this term is taken at a time the cluster has
            // already passed, nor at one ahead of this node's own clock (a
            // committed time that a fast clock left ahead stays unreached
            // here until it is true).
            // A committed time further ahead than the bound, of a node that
            // agrees with the cluster's clocks (a reference says so), was
            // left by a wrong clock: waiting for it would stop scheduling
            // for as long, and starting at it would fire early. The term
            // starts from this node's clock.
            let ahead = committed - self.handle.clock.now_millis();
            let poisoned = cluster_skew.is_some() && ahead > i64::try_from(limits.step_down.as_millis()).unwrap_or(i64::MAX);
            let committed = if poisoned {
                metrics::counter!("gnomon_clock_skew_warnings_total").increment(1);
                tracing::error!(
                    ahead_ms = ahead,
                    "the committed leader time is ahead of this node's clock, which agrees with the cluster's, by more than --clock-skew-step-down: a wrong clock set it; this term starts from this node's clock"
                );
                self.handle.clock.now_millis()
            } else {
                committed
            };
            if !self.wait_for_committed_time(committed, &limits, &leadership, &mut shutdown).await {
                let _ = self.elector.resign(&leadership).await;
                if *shutdown.borrow() {
                    break;
                }
                self.hold_off(Duration::from_secs(1), &mut shutdown).await;
                continue;
            }
            metrics::counter!("gnomon_leader_election_total", "backend" => backend, "result" => "acquired").increment(1);
            metrics::gauge!("gnomon_is_leader", "scope" => SCOPE).set(1.0);
            tracing::info!(token = leadership.token, backend, "leading scope {SCOPE}");
            let (cmd_tx, cmd_rx) = mpsc::channel(8192);
            let view = WorkersView::default();
            {
                let mut st = self.handle.write();
                st.term = Some((leadership.token, cmd_tx));
                st.workers = view.clone();
            }
            let fence = Fence { scope: SCOPE.into(), token: leadership.token };
            let clock = Arc::new(LeaderClock::new(self.handle.clock.clone(), committed, start_skew, limits));
            // The term ends when the elector says so or the keeper does.
            let (step_tx, step_rx) = watch::channel(false);
            let forward = tokio::spawn({
                let (mut lost, step_tx) = (leadership.lost.clone(), step_tx.clone());
                async move {
                    if lost.wait_for(|l| *l).await.is_ok() {
                        let _ = step_tx.send(true);
                    }
                }
            });
            let stepped_before = self.handle.clock_status().stepped_down_at;
            let (keeper_stop, keeper_stopped) = watch::channel(false);
            let keeper = tokio::spawn(
                Keeper {
                    store: self.handle.store.clone(),
                    fence: fence.clone(),
                    clock: clock.clone(),
                    skew_known: start_skew.is_some(),
                    server_center,
                    limits,
                    status: self.handle.clock_status.clone(),
                    step_down: step_tx,
                }
                .run(keeper_stopped),
            );
            let runtime = LeaderRuntime::new(LeaderParts {
                store: self.handle.store.clone(),
                fence: fence.clone(),
                clock: clock.clone(),
                config: self.handle.config.leader.clone(),
                commands: cmd_rx,
                lost: step_rx,
                shutdown: shutdown.clone(),
                view,
            });
            let retention =
                tokio::spawn(retention_loop(self.handle.store.clone(), fence.clone(), self.handle.config.leader.clone(), clock.clone()));
            let notifier =
                tokio::spawn(crate::notifier::notify_loop(self.handle.store.clone(), fence, clock, crate::notifier::env_secrets()));
            let exit = runtime.run().await;
            retention.abort();
            notifier.abort();
            forward.abort();
            // The keeper finishes a commit under way (bounded: the store
            // may be gone), so none lands after the term has ended here.
            let _ = keeper_stop.send(true);
            let keeper_abort = keeper.abort_handle();
            if tokio::time::timeout(KEEPER_STOP, keeper).await.is_err() {
                keeper_abort.abort();
            }
            let clock_fault = self.handle.clock_status().stepped_down_at != stepped_before;
            {
                let mut st = self.handle.write();
                st.term = None;
                st.workers = WorkersView::default();
            }
            metrics::gauge!("gnomon_is_leader", "scope" => SCOPE).set(0.0);
            metrics::gauge!("gnomon_workers", "state" => "live").set(0.0);
            let result = match exit {
                LeaderExit::Shutdown => "resigned",
                LeaderExit::Lost | LeaderExit::Fenced => "lost",
            };
            metrics::counter!("gnomon_leader_election_total", "backend" => backend, "result" => result).increment(1);
            tracing::info!(?exit, "leader loops stopped");
            if let Err(e) = self.elector.resign(&leadership).await {
                tracing::warn!(error = %e, "resign failed");
            }
            if exit == LeaderExit::Shutdown {
                break;
            }
            let pause = if clock_fault { leader_time::HOLD_OFF } else { Duration::from_secs(1) };
            self.hold_off(pause, &mut shutdown).await;
        }
        observer.abort();
    }

    /// The committed leader time (0 if none yet), or `None` if the store
    /// cannot say right now.
    async fn committed_leader_time(&self) -> Option<gnomon_core::Millis> {
        for _ in 0..3 {
            match self.handle.store.leadership(SCOPE).await {
                Ok(r) => return Some(r.map_or(0, |r| r.leader_time)),
                Err(e) => tracing::debug!(error = %e, "reading the leader time failed"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    /// Waits until this node's wall clock reaches the committed leader time
    /// (at most the step-down bound, on the monotonic clock). `false`: the
    /// term was lost or the node is shutting down meanwhile.
    async fn wait_for_committed_time(
        &self,
        committed: gnomon_core::Millis,
        limits: &SkewLimits,
        leadership: &gnomon_backend::Leadership,
        shutdown: &mut watch::Receiver<bool>,
    ) -> bool {
        let gap = committed - self.handle.clock.now_millis();
        if gap <= 0 {
            return true;
        }
        tracing::info!(gap_ms = gap, "this node's clock is behind the committed leader time; the term starts when it reaches it");
        let until = Instant::now() + limits.step_down;
        let mut lost = leadership.lost.clone();
        while self.handle.clock.now_millis() < committed && Instant::now() < until {
            let left = (committed - self.handle.clock.now_millis()).clamp(1, 100) as u64;
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(left)) => {}
                _ = lost.wait_for(|l| *l) => return false,
                _ = shutdown.changed() => return false,
            }
        }
        !*lost.borrow() && !*shutdown.borrow()
    }

    /// Waits `pause` before the next campaign, or until shutdown.
    async fn hold_off(&self, pause: Duration, shutdown: &mut watch::Receiver<bool>) {
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// How long a stopping term waits for its clock keeper's last write.
const KEEPER_STOP: Duration = Duration::from_secs(5);

/// How long a cluster's first leader waits for its members' clocks to be
/// measured before it judges its own.
const FIRST_MEASURE: Duration = Duration::from_secs(3);

/// How often the leader prunes old runs and samples the store's size.
const RETENTION_EVERY: Duration = Duration::from_secs(10);
/// Most runs deleted per round, so retention never floods the store.
const PRUNE_MAX: usize = 2000;

/// While a term lasts: deletes terminal runs beyond the retention (on
/// stores that prune) and reports the store's size.
async fn retention_loop(store: Arc<dyn Store>, fence: Fence, config: LeaderConfig, clock: Arc<dyn Clock>) {
    let mut tick = tokio::time::interval(RETENTION_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let before = clock.now_millis().saturating_sub(config.retain_ms);
        match store.prune(&fence, config.retain_runs, before, PRUNE_MAX).await {
            Ok(0) => {}
            Ok(n) => {
                metrics::counter!("gnomon_runs_pruned_total").increment(n);
                tracing::debug!(pruned = n, "retention: deleted old terminal runs");
            }
            Err(gnomon_backend::StoreError::Fenced { .. }) => return,
            Err(e) => tracing::warn!(error = %e, "retention round failed"),
        }
        if let Some(bytes) = store.size_bytes().await {
            metrics::gauge!("gnomon_store_size_bytes", "backend" => store.backend()).set(bytes as f64);
        }
    }
}
