//! A server node: campaigns for leadership and runs the leader loops while it
//! leads. Shared state for the API lives in [`NodeHandle`].

use std::sync::{Arc, RwLock};
use std::time::Duration;

use gnomon_backend::{Elector, Fence, LeaderInfo, Store};
use gnomon_core::Clock;
use tokio::sync::{mpsc, watch};

use crate::leader::{LeaderCommand, LeaderConfig, LeaderExit, LeaderParts, LeaderRuntime, PressureInfo, WorkerInfo, WorkersView};

pub const SCOPE: &str = "scheduler";

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: String,
    /// The address workers and clients should use to reach this node.
    pub advertise: String,
    pub leader: LeaderConfig,
}

/// What the API needs to know about this node.
#[derive(Debug, Clone)]
pub struct NodeHandle {
    pub config: NodeConfig,
    pub store: Arc<dyn Store>,
    pub elector_backend: &'static str,
    pub elector: Arc<dyn Elector>,
    pub clock: Arc<dyn Clock>,
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
        let handle =
            NodeHandle { config, store, elector_backend: elector.backend(), elector: elector.clone(), clock, state: Arc::default() };
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
            let runtime = LeaderRuntime::new(LeaderParts {
                store: self.handle.store.clone(),
                fence: Fence { scope: SCOPE.into(), token: leadership.token },
                clock: self.handle.clock.clone(),
                config: self.handle.config.leader.clone(),
                commands: cmd_rx,
                lost: leadership.lost.clone(),
                shutdown: shutdown.clone(),
                view,
            });
            let retention = tokio::spawn(retention_loop(
                self.handle.store.clone(),
                Fence { scope: SCOPE.into(), token: leadership.token },
                self.handle.config.leader.clone(),
                self.handle.clock.clone(),
            ));
            let exit = runtime.run().await;
            retention.abort();
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
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}

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
