//! A server node: campaigns for leadership and runs the leader loops while it
//! leads. Shared state for the API lives in [`NodeHandle`].

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use gnomon_backend::{Elector, Fence, LeaderInfo, Store};
use gnomon_core::Clock;
use tokio::sync::{mpsc, watch};

use crate::leader::{LeaderCommand, LeaderConfig, LeaderExit, PressureInfo, WorkerInfo, WorkersView};
use crate::leader_time::{self, ClockStatus, Meters, SharedStatus, SkewLimits};

mod admission;
mod term;

use admission::Admission;

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
    live: crate::live::LiveOutputs,
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

    /// The output of the attempts running now (empty on a follower).
    pub fn live(&self) -> crate::live::LiveOutputs {
        self.read().live.clone()
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

    /// Namespace `ns`'s use of its quotas, when this leader holds anything
    /// of it (`None` on a follower).
    pub fn namespace_usage(&self, ns: &str) -> Option<crate::leader::NamespaceUsage> {
        let view = self.read().workers.clone();
        let usage = view.read().unwrap_or_else(|p| p.into_inner()).namespaces.get(ns).cloned();
        usage
    }

    /// Every namespace this leader holds anything of.
    pub fn namespace_usages(&self) -> std::collections::BTreeMap<String, crate::leader::NamespaceUsage> {
        let view = self.read().workers.clone();
        let all = view.read().unwrap_or_else(|p| p.into_inner()).namespaces.clone();
        all
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
        let me = LeaderInfo {
            holder: self.handle.config.node_id.clone(),
            address: self.handle.config.advertise.clone(),
            backend: self.elector.backend().to_string(),
        };
        metrics::gauge!("gnomon_is_leader", "scope" => SCOPE).set(0.0);
        let meters = Arc::new(Meters::default());
        let observer = {
            let h = self.handle.clone();
            tokio::spawn(leader_time::observe(
                h.store.clone(),
                SCOPE,
                h.clock.clone(),
                meters.clone(),
                h.clock_status.clone(),
                self.handle.config.clock,
                move || h.leading_token().is_some(),
            ))
        };
        // Campaign, admit the term (its clock against the committed leader
        // time), lead until the term ends, give it back; again.
        while !*shutdown.borrow() {
            let Some(leadership) = self.campaign(&me, &mut shutdown).await else { break };
            let start = match self.admit(&leadership, &meters, &mut shutdown).await {
                Admission::Start(start) => start,
                Admission::Refused(pause) => {
                    self.hold_off(pause, &mut shutdown).await;
                    continue;
                }
                Admission::Shutdown => break,
            };
            let (exit, clock_fault) = self.lead(&leadership, start, &shutdown).await;
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
        let now = clock.now_millis();
        let before = now.saturating_sub(config.retain_ms);
        // Keyed runs are the records that refuse a repeated key or a
        // replayed webhook call: kept at least this long, whatever else.
        let keep_keyed_after = now.saturating_sub(gnomon_backend::KEYED_RUN_HOLD_MS);
        match store.prune(&fence, config.retain_runs, before, keep_keyed_after, PRUNE_MAX).await {
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
