//! The leader runtime: trigger, dispatcher, retry and cancellation, run as
//! one actor that owns the in-memory schedule and batches its store writes.
//!
//! Every store write carries the leadership's fence. The actor stops at once
//! when the `lost` signal fires, dropping any store call in flight (a
//! partitioned database may never answer it), and at once when the store
//! reports it has been fenced out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gnomon_backend::{AttemptChange, Fence, FireOutcome, JobRecord, NewRun, SessionLeases, Store, StoreError, Transition};
use gnomon_core::outcome::{ExecOutcome, RetryHint};

use gnomon_core::{AttemptState, Clock, Millis, RunState};
use gnomon_proto::v1::{self, server_message, worker_message};
use tokio::sync::{mpsc, oneshot, watch};

use gnomon_core::backpressure::Pressure;

use crate::outbound::Outbound;

/// The longest the actor sleeps between turns, which bounds how stale the
/// job feed and cancel requests can get (and step-down latency).
pub const MAX_TURN: Duration = Duration::from_millis(250);
use gnomon_engine::RECONNECT_SLACK_MS;
/// How much longer the in-memory lease runs than a store-kept one, so the
/// store's deletion of the session key is what evicts a worker.
const STORE_LEASE_SLACK_MS: Millis = 3_000;
pub use gnomon_engine::OVERRUN_GRACE_MS;

mod asks;
mod backfills;
mod claim;
mod dispatch;
mod jobs;
mod plan;
mod release;
mod results;
mod runs;
mod turn;
mod view;
mod workers;

pub use claim::{AskClaim, Withdrawal};
pub use gnomon_engine::fair::NsCounts;
pub use gnomon_engine::view::NamespaceUsage;
pub use view::{PressureInfo, Snapshot, WorkerInfo};

use results::*;

// The components the leader plans over live in the engine crate.
use gnomon_engine::runbook::*;
use gnomon_engine::sessions::*;
use gnomon_engine::{Cache, Engine};

/// The leader's inbox: its commands and asks.
type Inbox = gnomon_engine::inbox::Inbox<LeaderCommand, asks::Ask>;
use gnomon_engine::{admission, notify};

/// The leader's maps and sets hash with fixed keys, so that the order in
/// which it walks them, and so everything it does, depends only on its
/// inputs: a simulation seed replays exactly. (Their keys are run, job and
/// worker ids the server or an authenticated worker chose.)
pub use gnomon_engine::{HashMap, HashSet};

/// The leader's published worker sessions and backpressure.
pub type WorkersView = Arc<std::sync::RwLock<Snapshot>>;

pub use gnomon_engine::LeaderConfig;

type Result<T> = std::result::Result<T, StoreError>;

/// What a trigger did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Triggered {
    pub ids: Vec<String>,
    /// The idempotency key's run existed already: nothing was created.
    pub existed: bool,
}

/// What a manual trigger asks for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TriggerRequest {
    /// How many runs (1 with a key).
    pub count: u32,
    /// The idempotency key that names the run.
    pub key: Option<String>,
    /// The values it sets of the job's params (the rest keep their defaults).
    pub params: gnomon_core::params::Params,
    /// The body of the webhook call the run is for (with a key: a repeat
    /// must carry the same).
    pub payload: Option<String>,
    /// Who asks: an API caller or a webhook.
    pub origin: Origin,
    /// Whether the leader or the caller decides its fate: a caller that
    /// stops waiting withdraws it, unless the leader planned it first.
    pub claim: AskClaim,
}

/// Where a trigger comes from, as its runs' reason says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Origin {
    /// `POST /v1/jobs/{name}/trigger`, the CLI or the console.
    #[default]
    Api,
    /// A signed `POST /v1/hooks/{namespace}/{job}`.
    Webhook,
}

impl TriggerRequest {
    /// `count` runs with the job's default params.
    pub fn runs(count: u32) -> TriggerRequest {
        TriggerRequest { count, ..Default::default() }
    }
}

/// Why a trigger created nothing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TriggerError {
    /// The store failed (or the job does not exist: `NotFound`).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The params do not fit the job's declaration.
    #[error("{0}")]
    Params(gnomon_core::SpecError),
    /// The idempotency key names a run created with other params or
    /// another payload.
    #[error("the idempotency key names run {id}, which was created with other params or another payload")]
    KeyReused { id: String },
    /// A webhook call for a job that takes none (any more).
    #[error("the job takes no webhook calls")]
    NoWebhook,
    /// The runs would pass one of the namespace's quotas; none was created.
    #[error(transparent)]
    Quota(#[from] gnomon_core::quota::QuotaExceeded),
}

/// Requests from the API to the leader.
#[derive(Debug)]
pub enum LeaderCommand {
    /// Fire `count` manual runs of the job now; replies with their ids.
    /// With an idempotency `key` (and a count of 1), the run that key names:
    /// created, or found as it is.
    Trigger {
        namespace: String,
        name: String,
        request: TriggerRequest,
        reply: oneshot::Sender<std::result::Result<Triggered, TriggerError>>,
    },
    /// Start a backfill, if its namespace's quotas allow; replies with
    /// its record as created.
    Backfill { new: gnomon_backend::NewBackfill, reply: oneshot::Sender<std::result::Result<gnomon_backend::BackfillRecord, TriggerError>> },
    /// Something changed in the store (jobs or cancel requests); look now.
    Nudge,
    /// A run was changed in the store by the API (a cancel): reload it, and
    /// look at the cancel requests now.
    RunChanged { run_id: String },
    /// A worker said Hello on this leader; the reply is the session id (the
    /// leader has sent `Welcome`) or the refusal.
    SessionOpen {
        hello: Box<v1::Hello>,
        /// The namespaces its credential limits it to (`None`: all).
        namespaces: Option<Arc<[String]>>,
        outbound: Outbound,
        reply: oneshot::Sender<std::result::Result<String, tonic::Status>>,
    },
    /// A message on an open session.
    FromWorker { session: String, msg: worker_message::Msg },
    /// The session's stream ended (its lease keeps running).
    SessionClosed { session: String },
}

/// A session's store lease, registered off the turn.
#[derive(Debug)]
pub(super) struct LeaseRegistered {
    worker: String,
    /// The session it was asked for.
    session: String,
    /// The worker's store lease before it (released once this one is its).
    old: Option<i64>,
    result: Result<i64>,
}

/// What one [`LeaderRuntime::step`] came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// A turn ran.
    Done,
    /// A store call failed: the state is rebuilt from the store next step.
    Failed,
    /// The term is over.
    Exit(LeaderExit),
}

/// Why the runtime ended.
#[derive(Debug, PartialEq, Eq)]
pub enum LeaderExit {
    Lost,
    Fenced,
    Shutdown,
}

/// The leader actor. Its state is in two parts:
/// - the **cache** (`Cache`): jobs, timers and open runs as the store has
///   them. It is a cache of the store and nothing else: on any store error
///   but `Fenced` (and on any write whose outcome is unknown) it is dropped
///   and rebuilt from the store before the next turn (crash-only; no error
///   path undoes anything by hand);
/// - what the store does not have: the worker sessions (live connections;
///   which attempts each holds is recomputed from the store on a rebuild),
///   worker reports not yet written (an inbox), and the store-kept session
///   leases adopted from a previous leader.
pub struct LeaderRuntime {
    /// The state and the decisions (no I/O).
    engine: Engine,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    commands: mpsc::Receiver<LeaderCommand>,
    lost: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    view: WorkersView,
    /// The output running attempts stream, for readers.
    live: crate::live::LiveOutputs,
    /// The worker sessions' streams, by session id: a session's messages
    /// go out here.
    outlets: HashMap<String, Outbound>,
    /// What came in and is not written yet (kept across a rebuild).
    inbox: Inbox,
    /// What the turn under way wrote, for its metrics.
    stats: TurnStats,
    /// Session leases kept in the store (etcd), and deletions of their keys.
    leases: Option<Arc<dyn SessionLeases>>,
    lease_deletions: Option<mpsc::Receiver<(String, i64)>>,
    /// Store leases registered off the turn, as they come back.
    lease_events: (mpsc::UnboundedSender<LeaseRegistered>, mpsc::UnboundedReceiver<LeaseRegistered>),
    /// Job writes pushed by the store (etcd watch), so they apply at once.
    job_signal: Option<mpsc::Receiver<()>>,
}

pub struct LeaderParts {
    pub store: Arc<dyn Store>,
    pub fence: Fence,
    pub clock: Arc<dyn Clock>,
    pub config: LeaderConfig,
    pub commands: mpsc::Receiver<LeaderCommand>,
    pub lost: watch::Receiver<bool>,
    pub shutdown: watch::Receiver<bool>,
    /// Where the leader publishes its worker sessions.
    pub view: WorkersView,
    /// Where the leader keeps the output running attempts stream.
    pub live: crate::live::LiveOutputs,
    /// The seed of the leader's random numbers (retry jitter): an input,
    /// so the same inputs give the same turns.
    pub seed: u64,
}

impl LeaderRuntime {
    pub fn new(p: LeaderParts) -> Self {
        let leases = p.store.session_leases();
        let now = p.clock.now_millis();
        Self {
            engine: Engine::new(p.fence, p.config, now, p.seed),
            leases,
            lease_deletions: None,
            lease_events: mpsc::unbounded_channel(),
            job_signal: None,
            store: p.store,
            clock: p.clock,
            commands: p.commands,
            lost: p.lost,
            shutdown: p.shutdown,
            view: p.view,
            live: p.live,
            outlets: HashMap::default(),
            stats: TurnStats::default(),
            inbox: Inbox::default(),
        }
    }

    /// Runs until leadership is lost, the store fences us out, or shutdown.
    pub async fn run(mut self) -> LeaderExit {
        // A store call that hangs (a partitioned database answers nothing)
        // must not keep a deposed leader in office: every step races the
        // elector's verdict and is dropped, mid-call, when leadership is
        // lost. Its writes are fenced, so a half-sent one cannot land.
        let lost = self.lost.clone();
        loop {
            if let Some(exit) = self.should_stop() {
                return exit;
            }
            let stepped = tokio::select! {
                biased;
                () = lost_signal(lost.clone()) => return LeaderExit::Lost,
                r = self.step() => r,
            };
            match stepped {
                Step::Exit(exit) => return exit,
                Step::Failed => {
                    // The cache is rebuilt before the next turn; back off a
                    // little more after each failed rebuild (store down).
                    let backoff = self.engine.freshness.backoff_ms();
                    if let Some(exit) = self.pause(Duration::from_millis(backoff)).await {
                        return exit;
                    }
                    continue;
                }
                Step::Done => {}
            }
            let waited = tokio::select! {
                biased;
                () = lost_signal(lost.clone()) => return LeaderExit::Lost,
                w = self.wait_for_work() => w,
            };
            if let Some(exit) = waited {
                return exit;
            }
        }
    }

    /// One turn of the leader: rebuilds the cache first if it is stale,
    /// then handles what is queued, fires, dispatches and writes. This is
    /// the one place that applies the crash-only rule: a store error other
    /// than `Fenced` marks the cache stale, and nothing else is undone.
    /// Deterministic given the clock, the queued commands and the store's
    /// answers (the simulation drives the leader through it).
    pub async fn step(&mut self) -> Step {
        if let Some(exit) = self.should_stop() {
            return Step::Exit(exit);
        }
        self.tick();
        if self.engine.freshness.is_stale() {
            match self.rebuild().await {
                Ok(()) => {}
                Err(StoreError::Fenced { .. }) => return Step::Exit(LeaderExit::Fenced),
                Err(e) => {
                    let failures = self.engine.freshness.rebuild_failed();
                    tracing::warn!(error = %e, failures, "rebuilding the leader's state from the store failed; retrying");
                    return Step::Failed;
                }
            }
        }
        match self.turn().await {
            Ok(()) => Step::Done,
            Err(StoreError::Fenced { token, current, .. }) => {
                tracing::error!(token, current, "fenced out by a newer leader; stepping down");
                Step::Exit(LeaderExit::Fenced)
            }
            Err(e) => {
                self.mark_stale(&e);
                Step::Failed
            }
        }
    }

    /// The crash-only rule: after a store error (or a write whose outcome
    /// is unknown) the cache is no longer trusted.
    fn mark_stale(&mut self, e: &StoreError) {
        tracing::warn!(error = %e, "store call failed; the leader rebuilds its state from the store before its next turn");
        metrics::counter!("gnomon_leader_rebuilds_total").increment(1);
        self.engine.freshness.distrust();
    }

    /// Distrusts the cache as a store error would: the next step rebuilds
    /// it from the store first (for benchmarks and tests).
    pub fn invalidate(&mut self) {
        self.engine.freshness.distrust();
    }

    /// Drops the cache and loads it again from the store, as a new term
    /// does, keeping the worker sessions (which attempts each holds is
    /// taken from the store) and the unwritten worker results.
    async fn rebuild(&mut self) -> Result<()> {
        let began = std::time::Instant::now();
        // The jobs as the dropped cache had them: a change is judged against
        // the version this leader knew.
        let earlier = self.engine.cache.jobs.take_for_rebuild();
        self.engine.cache = Cache::default();
        self.engine.cache.jobs.set_earlier(earlier);
        self.engine.reports.forget_unheld();
        self.engine.sessions.clear_unlisted();
        self.engine.notes.reset();
        self.recover().await?;
        self.engine.cache.jobs.loaded();
        self.engine.freshness.rebuilt();
        metrics::histogram!("gnomon_leader_rebuild_seconds").record(began.elapsed().as_secs_f64());
        tracing::info!(
            token = self.engine.fence.token,
            jobs = self.engine.cache.jobs.len(),
            open_runs = self.engine.cache.runs.len(),
            backfills = self.engine.cache.backfills.len(),
            ms = began.elapsed().as_millis() as u64,
            "leader state loaded from the store"
        );
        Ok(())
    }

    /// Reads the clock for the step that begins: a turn, or a message
    /// taken between turns. Nothing else reads it.
    fn tick(&mut self) {
        self.engine.now = self.clock.now_millis();
    }

    fn should_stop(&self) -> Option<LeaderExit> {
        if *self.shutdown.borrow() {
            return Some(LeaderExit::Shutdown);
        }
        if *self.lost.borrow() {
            return Some(LeaderExit::Lost);
        }
        None
    }

    /// Waits `d` after a failed step, acking heartbeats meanwhile.
    async fn pause(&mut self, d: Duration) -> Option<LeaderExit> {
        let until = tokio::time::Instant::now() + d;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => break,
                Some(cmd) = self.commands.recv() => {
                    self.tick();
                    if let Err(e) = self.on_command(cmd).await {
                        self.mark_stale(&e);
                    }
                    continue;
                }
                Some((worker, lease)) = next_from(&mut self.lease_deletions) => {
                    self.tick();
                    self.engine.on_lease_deleted(&worker, lease);
                }
                Some(registered) = self.lease_events.1.recv() => {
                    self.tick();
                    if let Err(e) = self.on_lease_registered(registered) {
                        self.mark_stale(&e);
                    }
                    continue;
                }
                _ = self.lost.changed() => {}
                _ = self.shutdown.changed() => {}
            }
            break;
        }
        self.should_stop()
    }
}

/// What one turn wrote: how many store writes, how many rows (runs,
/// advances, transitions, backfill records) they carried.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct TurnStats {
    writes: u32,
    rows: usize,
}

impl TurnStats {
    /// A store write of `rows` rows, begun at `began`, is done.
    pub(super) fn wrote(&mut self, rows: usize, began: std::time::Instant) {
        self.writes += 1;
        self.rows += rows;
        metrics::histogram!("gnomon_leader_write_seconds").record(began.elapsed().as_secs_f64());
    }

    /// The turn is over: its writes and rows go to the metrics (a turn
    /// that wrote nothing is not counted), and the counts start again.
    pub(super) fn end_turn(&mut self) -> (u32, usize) {
        let done = (std::mem::take(&mut self.writes), std::mem::take(&mut self.rows));
        if done.0 > 0 {
            metrics::histogram!("gnomon_leader_turn_writes").record(f64::from(done.0));
            metrics::histogram!("gnomon_leader_turn_rows").record(done.1 as f64);
        }
        done
    }
}

/// Resolves once the elector says leadership is lost; never if it dropped
/// the signal without saying so.
pub(super) async fn lost_signal(mut lost: watch::Receiver<bool>) {
    if lost.wait_for(|l| *l).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The next message of an optional store feed (session-key deletions, job
/// writes); never, without one.
pub(super) async fn next_from<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
