//! The leader runtime: trigger, dispatcher, retry and cancellation, run as
//! one actor that owns the in-memory schedule and batches its store writes.
//!
//! Every store write carries the leadership's fence. The actor stops at once
//! when the `lost` signal fires, dropping any store call in flight (a
//! partitioned database may never answer it), and at once when the store
//! reports it has been fenced out.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use gnomon_backend::{AttemptChange, Fence, FireOutcome, JobAdvance, JobRecord, NewRun, SessionLeases, Store, StoreError, Transition};
use gnomon_core::policy::{decide_overlap, plan_fires, Decision, OverlapDecision, PlanInput};
use gnomon_core::retry::BackoffPolicy;
use gnomon_core::run::run_state_after_attempt;
use gnomon_core::schedule::Schedule;
use gnomon_core::spec::{Executor, MisfirePolicy, OverlapPolicy, RouteSpec};
use gnomon_core::{AttemptState, Clock, Millis, RunState};
use gnomon_proto::v1::{self, server_message, worker_message};
use gnomon_worker::ExecOutcome;
use tokio::sync::{mpsc, oneshot, watch};

use gnomon_core::backpressure::{Backpressure, BackpressureConfig, Pressure};
use gnomon_core::routing::{pick_worker, Candidate};

/// The most ready runs one dispatch pass looks at.
const MAX_DISPATCH_SCAN: usize = 8192;
use crate::sessions::Outbound;

/// The longest the actor sleeps between turns, which bounds how stale the
/// job feed and cancel requests can get (and step-down latency).
pub const MAX_TURN: Duration = Duration::from_millis(250);
/// The most jobs fired in one store transaction. A burst (100,000 jobs due
/// at the same second) is written in chunks, so memory stays bounded and
/// dispatch and reports interleave with the burst instead of waiting for it.
const MAX_FIRE_BATCH: usize = 2048;
/// The worker's longest reconnect backoff, added to a new leader's wait for
/// recovered attempts to be reclaimed.
const RECONNECT_SLACK_MS: Millis = 2_000;
/// How much longer the in-memory lease runs than a store-kept one, so the
/// store's deletion of the session key is what evicts a worker.
const STORE_LEASE_SLACK_MS: Millis = 3_000;
/// The smallest chunk a burst is fired in while it interleaves with
/// dispatch (smaller chunks would spend more on commits than they save).
const MIN_INTERLEAVED_FIRE: usize = 256;
/// How long one turn keeps firing chunks of a burst before it dispatches.
const FIRE_BUDGET: Duration = Duration::from_millis(500);
const POLL_EVERY_MS: Millis = 1000;
/// A worker's prefetch queue is filled only while its recent attempts took
/// at most this long on average (so a queued run starts within about this
/// long)…
const PREFETCH_SHORT_MS: f64 = 100.0;
/// …and none of the attempts it holds was assigned longer ago than this
/// (a slot is not stuck on a slow run).
const PREFETCH_MAX_AGE_MS: Millis = 1_000;
/// Weight of the newest duration in the moving averages above.
const DURATION_EWMA: f64 = 0.2;

#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// How late a scheduled time may be reached and still count as on time.
    pub misfire_grace_ms: i64,
    /// A worker session's lease: it is alive while heartbeats arrive within
    /// this time; after it, its attempts are `lost` and retried elsewhere.
    pub lease_ttl_ms: i64,
    /// How often workers heartbeat (told in `Welcome`).
    pub heartbeat_ms: i64,
    pub backpressure: BackpressureConfig,
    /// Retention, on stores that prune (etcd): terminal runs kept per job…
    pub retain_runs: usize,
    /// …and for how long.
    pub retain_ms: i64,
}

impl Default for LeaderConfig {
    fn default() -> Self {
        Self {
            misfire_grace_ms: 1000,
            lease_ttl_ms: 10_000,
            heartbeat_ms: 2_000,
            backpressure: BackpressureConfig::default(),
            retain_runs: 1000,
            retain_ms: 7 * 24 * 3600 * 1000,
        }
    }
}

/// The backpressure state as `/v1/leader` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PressureInfo {
    pub state: Pressure,
    pub pending: usize,
    pub max_pending: usize,
}

/// What the leader publishes for the API.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub workers: Vec<WorkerInfo>,
    pub pressure: Option<PressureInfo>,
    /// Why runs of a job are waiting in `pending`, by job uid.
    pub waiting: HashMap<String, String>,
}

/// One worker session as `GET /v1/workers` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerInfo {
    pub id: String,
    pub session: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: usize,
    /// Assignments it queues beyond its capacity.
    pub prefetch: usize,
    /// Attempts it holds now (executing or queued).
    pub running: usize,
    pub load: f64,
    pub executors: Vec<String>,
    pub handlers: Vec<String>,
    pub connected: bool,
    pub draining: bool,
    pub lease_expires_at: Millis,
}

/// The leader's published worker sessions and backpressure.
pub type WorkersView = Arc<std::sync::RwLock<Snapshot>>;

/// A worker session, owned by the leader actor.
#[derive(Debug)]
struct Session {
    session_id: String,
    labels: BTreeMap<String, String>,
    capacity: usize,
    /// Attempts it queues beyond `capacity` (its Hello's `prefetch`).
    prefetch: usize,
    /// How much of the queue dispatch may fill now (recomputed each pass):
    /// 0 while it is closed, half of it under yellow or red backpressure.
    queue_open: usize,
    /// Moving average of its attempts' durations (ms), once one has ended.
    recent_ms: Option<f64>,
    executors: HashSet<String>,
    handlers: HashSet<String>,
    /// `None` while the stream is down (the lease keeps running).
    tx: Option<Outbound>,
    lease_until: Millis,
    last_heartbeat: Millis,
    /// Runs whose live attempt this worker holds.
    attempts: HashSet<RunId>,
    /// Of those, the ones its last heartbeats did not list: how many in a
    /// row (see [`LeaderRuntime::reconcile_held`]).
    unlisted: HashMap<RunId, u8>,
    draining: bool,
    /// The session's lease in the store (etcd), and when it was last refreshed.
    store_lease: Option<i64>,
    refreshed_at: Millis,
}

/// What workers report, as the leader batches it.
#[derive(Debug, Clone)]
enum WorkerEvent {
    Started { run_id: String, attempt: u32, at: Millis },
    Finished { worker: String, run_id: String, attempt: u32, outcome: ExecOutcome, started_at: Millis, at: Millis },
}

/// Worker results on their way to the store.
struct EventBatch {
    events: Vec<WorkerEvent>,
    batch: Vec<Transition>,
    /// (worker, run, attempt, rejection) to send once written.
    acks: Vec<(String, String, u32, Option<&'static str>)>,
    /// Slots given back before the write: (worker, run).
    freed: Vec<(String, RunId)>,
}

/// One chunk of due jobs, planned and not yet written.
struct FirePlan {
    due_jobs: Vec<String>,
    new_runs: Vec<NewRun>,
    advances: Vec<JobAdvance>,
    /// Per job: (uid, last scheduled time fired, more due).
    plans: Vec<(String, Option<Millis>, bool)>,
    /// A full chunk: more jobs may be due.
    full: bool,
    now: Millis,
    /// When the write began (each run's `fired_at`).
    stamp: Millis,
    /// Pending runs tracked ahead of the write.
    tracked: Vec<RunId>,
}

/// Assignments chosen by a dispatch pass, not yet persisted.
struct DispatchPlan {
    batch: Vec<Transition>,
    /// The worker of each assignment in `batch`.
    targets: Vec<String>,
    /// Runs whose job was deleted: cancelled.
    dropped: Vec<Transition>,
}

/// Requests from the API to the leader.
#[derive(Debug)]
pub enum LeaderCommand {
    /// Fire a manual run of the job now; replies with the run id.
    /// Fire `count` manual runs of the job now; replies with their ids.
    Trigger { namespace: String, name: String, count: u32, reply: oneshot::Sender<std::result::Result<Vec<String>, StoreError>> },
    /// Something changed in the store (jobs or cancel requests); look now.
    Nudge,
    /// A worker said Hello on this leader; the reply is the session id (the
    /// leader has sent `Welcome`) or the refusal.
    SessionOpen { hello: Box<v1::Hello>, outbound: Outbound, reply: oneshot::Sender<std::result::Result<String, tonic::Status>> },
    /// A message on an open session.
    FromWorker { session: String, msg: worker_message::Msg },
    /// The session's stream ended (its lease keeps running).
    SessionClosed { session: String },
}

/// What the leader keeps of a job's stored record: its metadata, not its spec.
#[derive(Debug, Clone)]
struct JobMeta {
    /// uid, name and namespace, shared with every open run of the job.
    key: Arc<JobKey>,
    version: u64,
    paused: bool,
    created_at: Millis,
    updated_at: Millis,
    last_scheduled_at: Option<Millis>,
}

/// What the leader keeps of a job: only what scheduling and dispatch read,
/// not the whole spec (descriptions, the original strings). Entries are
/// boxed so the map's table stays small. With 100,000 jobs this is the bulk
/// of the leader's memory, about 400 bytes a job.
#[derive(Debug)]
struct JobEntry {
    record: JobMeta,
    schedule: Schedule,
    executor: Arc<Executor>,
    /// The executor as the `Assign` message carries it, serialised once.
    executor_json: Arc<str>,
    timeout: Option<Duration>,
    max_attempts: u32,
    backoff: BackoffPolicy,
    catchup_window_ms: i64,
    overlap: OverlapPolicy,
    misfire: MisfirePolicy,
    route: Option<Box<RouteSpec>>,
    generation: u64,
    /// Moving average of its attempts' durations (ms), once one has ended.
    recent_ms: Option<f64>,
    /// The first `scheduled_at` free for its next manual run.
    manual_next: Millis,
}

/// A job's identity, shared (not copied) by its entry and its open runs.
#[derive(Debug, PartialEq, Eq, Hash)]
struct JobKey {
    uid: String,
    name: String,
    namespace: String,
}

/// A run id, allocated once and shared by every index that names the run.
type RunId = Arc<str>;

#[derive(Debug, Clone)]
struct OpenRun {
    key: Arc<JobKey>,
    scheduled_at: Millis,
    state: RunState,
    attempt: u32,
    ready_since: Millis,
    /// When its live attempt was assigned (0: unknown, recovered).
    assigned_at: Millis,
}

/// Why the runtime ended.
#[derive(Debug, PartialEq, Eq)]
pub enum LeaderExit {
    Lost,
    Fenced,
    Shutdown,
}

pub struct LeaderRuntime {
    store: Arc<dyn Store>,
    fence: Fence,
    clock: Arc<dyn Clock>,
    config: LeaderConfig,
    commands: mpsc::Receiver<LeaderCommand>,
    lost: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    view: WorkersView,

    /// Worker sessions by worker id, and worker id by session id.
    sessions: HashMap<String, Session>,
    session_ids: HashMap<String, String>,
    /// Live attempts recovered from the store, waiting for their worker to
    /// reclaim them (or for their lease to run out): run id -> deadline.
    orphans: HashMap<RunId, Millis>,
    round_robin: usize,
    view_dirty: bool,
    pressure: Backpressure,
    /// Why a job's runs cannot be placed right now, by job uid.
    waiting: HashMap<String, String>,

    jobs: HashMap<String, Box<JobEntry>>,
    job_feed_seq: u64,
    fire_heap: BinaryHeap<Reverse<(Millis, String, u64)>>,
    next_generation: u64,
    runs: HashMap<RunId, OpenRun>,
    runs_by_job: HashMap<String, HashSet<RunId>>,
    ready: VecDeque<RunId>,
    retry_heap: BinaryHeap<Reverse<(Millis, RunId)>>,
    /// Runs with a live attempt, and the worker holding it.
    in_flight: HashMap<RunId, String>,
    unwritten_events: Vec<WorkerEvent>,
    /// Attempts a live worker's heartbeats say it does not hold: (worker,
    /// run), ended `lost` at the next turn.
    unheld: Vec<(String, RunId)>,
    cancels_sent: HashSet<(String, u32)>,
    last_poll: Millis,
    /// Session leases kept in the store (etcd), and deletions of their keys.
    leases: Option<Arc<dyn SessionLeases>>,
    lease_deletions: Option<mpsc::Receiver<(String, i64)>>,
    /// Recovered attempts' workers, and the store leases adopted from the
    /// previous leader (worker -> lease), until the worker reconnects.
    orphan_workers: HashMap<RunId, String>,
    adopted: HashMap<String, i64>,
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
}

type Result<T> = std::result::Result<T, StoreError>;

impl LeaderRuntime {
    pub fn new(p: LeaderParts) -> Self {
        let pressure = Backpressure::new(p.config.backpressure);
        let leases = p.store.session_leases();
        Self {
            leases,
            lease_deletions: None,
            orphan_workers: HashMap::new(),
            adopted: HashMap::new(),
            job_signal: None,
            store: p.store,
            fence: p.fence,
            clock: p.clock,
            config: p.config,
            commands: p.commands,
            lost: p.lost,
            shutdown: p.shutdown,
            view: p.view,
            sessions: HashMap::new(),
            session_ids: HashMap::new(),
            orphans: HashMap::new(),
            round_robin: 0,
            view_dirty: true,
            pressure,
            waiting: HashMap::new(),
            jobs: HashMap::new(),
            job_feed_seq: 0,
            fire_heap: BinaryHeap::new(),
            next_generation: 0,
            runs: HashMap::new(),
            runs_by_job: HashMap::new(),
            ready: VecDeque::new(),
            retry_heap: BinaryHeap::new(),
            in_flight: HashMap::new(),
            unwritten_events: Vec::new(),
            unheld: Vec::new(),
            cancels_sent: HashSet::new(),
            last_poll: 0,
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
            let recovered = tokio::select! {
                biased;
                () = lost_signal(lost.clone()) => return LeaderExit::Lost,
                r = self.recover() => r,
            };
            match recovered {
                Ok(()) => break,
                Err(StoreError::Fenced { .. }) => return LeaderExit::Fenced,
                Err(e) => {
                    tracing::warn!(error = %e, "leader recovery failed; retrying");
                    if let Some(exit) = self.pause(Duration::from_millis(500)).await {
                        return exit;
                    }
                }
            }
        }
        tracing::info!(token = self.fence.token, jobs = self.jobs.len(), open_runs = self.runs.len(), "leader loops started");
        loop {
            if let Some(exit) = self.should_stop() {
                return exit;
            }
            let turned = tokio::select! {
                biased;
                () = lost_signal(lost.clone()) => return LeaderExit::Lost,
                r = self.turn() => r,
            };
            match turned {
                Ok(()) => {}
                Err(StoreError::Fenced { token, current, .. }) => {
                    tracing::error!(token, current, "fenced out by a newer leader; stepping down");
                    return LeaderExit::Fenced;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leader turn failed; retrying");
                    if let Some(exit) = self.pause(Duration::from_millis(200)).await {
                        return exit;
                    }
                    continue;
                }
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

    fn should_stop(&self) -> Option<LeaderExit> {
        if *self.shutdown.borrow() {
            return Some(LeaderExit::Shutdown);
        }
        if *self.lost.borrow() {
            return Some(LeaderExit::Lost);
        }
        None
    }

    async fn pause(&mut self, d: Duration) -> Option<LeaderExit> {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            Some((worker, lease)) = next_from(&mut self.lease_deletions) => self.on_lease_deleted(&worker, lease),
            _ = self.lost.changed() => {}
            _ = self.shutdown.changed() => {}
        }
        self.should_stop()
    }

    /// A session key was deleted in the store: its lease ran out (the worker
    /// stopped heartbeating) or was revoked. Evict that worker's attempts.
    fn on_lease_deleted(&mut self, worker: &str, lease: i64) {
        let now = self.clock.now_millis();
        if let Some(s) = self.sessions.get_mut(worker).filter(|s| s.store_lease == Some(lease)) {
            tracing::warn!(worker, lease, "worker session lease deleted in the store; evicting");
            metrics::counter!("gnomon_worker_lease_deletions_total").increment(1);
            s.lease_until = Millis::MIN / 2;
        }
        if self.adopted.get(worker) == Some(&lease) {
            self.adopted.remove(worker);
            for (id, w) in &self.orphan_workers {
                if w == worker {
                    self.orphans.insert(id.clone(), now);
                }
            }
        }
    }

    /// Loads jobs and open runs. Attempts that were live under a previous
    /// leader wait one lease TTL for their worker to reconnect and reclaim
    /// them (its `Hello` lists them); after that they are `lost`.
    async fn recover(&mut self) -> Result<()> {
        // Subscribe before the first read, so no write falls in between.
        if self.job_signal.is_none() {
            self.job_signal = self.store.job_change_signal();
        }
        let changes = self.store.job_changes(0).await?;
        self.job_feed_seq = changes.seq;
        for job in changes.upserted {
            self.upsert_job(job);
        }
        let now = self.clock.now_millis();
        let mut orphaned = Vec::new();
        for run in self.store.open_runs().await? {
            let open = OpenRun {
                key: self.job_key(&run.job_uid, &run.job, &run.namespace),
                scheduled_at: run.scheduled_at,
                state: run.state,
                attempt: run.attempt,
                ready_since: run.next_attempt_at.unwrap_or(run.fired_at),
                assigned_at: 0,
            };
            let id: RunId = Arc::from(run.id.as_str());
            self.track(id.clone(), open);
            match run.state {
                RunState::Pending => self.ready.push_back(id),
                RunState::Retrying => self.retry_heap.push(Reverse((run.next_attempt_at.unwrap_or(now), id))),
                RunState::Assigned | RunState::Running => orphaned.push(id),
                _ => {}
            }
        }
        // One lease TTL, plus the worker's longest reconnect backoff (2 s):
        // a worker that was connected to the old leader gets a full lease to
        // find this one.
        match self.leases.clone() {
            // Without store leases: a worker that was connected to the old
            // leader gets a full lease (plus its longest reconnect backoff,
            // 2 s) to find this one.
            None => {
                for id in orphaned {
                    self.orphans.insert(id, now + self.config.lease_ttl_ms + RECONNECT_SLACK_MS);
                }
            }
            // With them: adopt the live sessions' leases. An attempt of a
            // worker whose lease is alive waits what is left of it; one of
            // a worker without a live lease is lost now.
            Some(leases) => {
                self.lease_deletions = Some(leases.deletions());
                let live: HashMap<String, (i64, i64)> =
                    leases.live().await?.into_iter().map(|l| (l.worker, (l.lease, l.remaining_ms))).collect();
                for id in orphaned {
                    let worker = self.store.get_run(&id).await?.and_then(|d| d.attempts.last().map(|a| a.worker.clone()));
                    let deadline = match worker.as_ref().and_then(|w| live.get(w)) {
                        Some((lease, remaining)) => {
                            if let Some(w) = &worker {
                                self.adopted.insert(w.clone(), *lease);
                            }
                            now + remaining + RECONNECT_SLACK_MS
                        }
                        None => now,
                    };
                    if let Some(w) = worker {
                        self.orphan_workers.insert(id.clone(), w);
                    }
                    self.orphans.insert(id, deadline);
                }
                tracing::info!(adopted = self.adopted.len(), "adopted live worker session leases from the store");
            }
        }
        self.last_poll = now;
        Ok(())
    }

    fn upsert_job(&mut self, record: JobRecord) {
        let compiled = match record.spec.compile() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(job = %record.name, error = %e, "stored job no longer validates; not scheduling it");
                self.jobs.remove(&record.uid);
                return;
            }
        };
        self.next_generation += 1;
        let generation = self.next_generation;
        // What the previous version learned carries over.
        let previous = self.jobs.get(&record.uid);
        let previous_last = previous.and_then(|j| j.record.last_scheduled_at);
        let recent_ms = previous.and_then(|j| j.recent_ms);
        let manual_next = previous.map_or(0, |j| j.manual_next);
        let record = JobMeta {
            last_scheduled_at: record.last_scheduled_at.max(previous_last),
            key: Arc::new(JobKey { uid: record.uid, name: record.name, namespace: record.namespace }),
            version: record.version,
            paused: record.paused,
            created_at: record.created_at,
            updated_at: record.updated_at,
        };
        let entry = Box::new(JobEntry {
            record,
            schedule: compiled.schedule,
            executor_json: serde_json::to_string(&compiled.spec.executor).unwrap_or_default().into(),
            executor: Arc::new(compiled.spec.executor),
            timeout: compiled.timeout,
            max_attempts: compiled.max_attempts,
            backoff: compiled.backoff,
            catchup_window_ms: compiled.catchup_window_ms,
            overlap: compiled.spec.overlap,
            misfire: compiled.spec.misfire,
            route: compiled.spec.route.map(Box::new),
            generation,
            recent_ms,
            manual_next,
        });
        if !entry.record.paused {
            if let Some(due) = entry.schedule.next_after(self.base_of(&entry)) {
                self.fire_heap.push(Reverse((due, entry.record.key.uid.clone(), generation)));
            }
        }
        self.jobs.insert(entry.record.key.uid.clone(), entry);
    }

    /// The time after which a job's schedule is considered: its persisted
    /// `last_scheduled_at`, but never before the job (or its latest version)
    /// existed, so an update or a resume does not replay times that were
    /// never scheduled under this version.
    fn base_of(&self, entry: &JobEntry) -> Millis {
        let version_start = if entry.record.version > 1 { entry.record.updated_at } else { entry.record.created_at };
        entry.record.last_scheduled_at.map_or(version_start, |last| last.max(version_start))
    }

    /// The shared id of an open run (a new one if the run is not open).
    fn rid(&self, id: &str) -> RunId {
        self.runs.get_key_value(id).map(|(k, _)| k.clone()).unwrap_or_else(|| Arc::from(id))
    }

    /// The job's shared key (from its entry), or a new one for a run of a
    /// job the leader does not schedule (deleted, or no longer valid).
    fn job_key(&self, uid: &str, name: &str, namespace: &str) -> Arc<JobKey> {
        match self.jobs.get(uid) {
            Some(j) => j.record.key.clone(),
            None => Arc::new(JobKey { uid: uid.into(), name: name.into(), namespace: namespace.into() }),
        }
    }

    /// Tracks a newly created pending run and queues it for dispatch.
    fn track_pending(&mut self, run: NewRun, now: Millis) -> RunId {
        let id: RunId = Arc::from(run.id().as_str());
        let open = OpenRun {
            key: self.job_key(&run.job_uid, &run.job, &run.namespace),
            scheduled_at: run.scheduled_at,
            state: RunState::Pending,
            attempt: 0,
            ready_since: now,
            assigned_at: 0,
        };
        self.track(id.clone(), open);
        self.ready.push_back(id.clone());
        id
    }

    fn track(&mut self, id: RunId, run: OpenRun) {
        match self.runs_by_job.get_mut(run.key.uid.as_str()) {
            Some(set) => {
                set.insert(id.clone());
            }
            None => {
                self.runs_by_job.insert(run.key.uid.clone(), HashSet::from([id.clone()]));
            }
        }
        self.runs.insert(id, run);
    }

    fn untrack(&mut self, id: &str) {
        if let Some(run) = self.runs.remove(id) {
            if let Some(set) = self.runs_by_job.get_mut(run.key.uid.as_str()) {
                set.remove(id);
                if set.is_empty() {
                    self.runs_by_job.remove(run.key.uid.as_str());
                }
            }
        }
        self.release(id);
    }

    /// Forgets which worker holds `id`'s attempt.
    fn release(&mut self, id: &str) {
        self.orphans.remove(id);
        if let Some(worker) = self.in_flight.remove(id) {
            if let Some(s) = self.sessions.get_mut(&worker) {
                s.attempts.remove(id);
                self.view_dirty = true;
            }
        }
    }

    fn send_to(&self, worker: &str, msg: server_message::Msg) -> bool {
        match self.sessions.get(worker).and_then(|s| s.tx.as_ref()) {
            Some(tx) => tx.send(Ok(v1::ServerMessage { msg: Some(msg) })).is_ok(),
            None => false,
        }
    }

    /// Asks the worker holding the run's attempt to stop it.
    fn send_cancel(&mut self, run_id: &str, attempt: u32) {
        if let Some(worker) = self.in_flight.get(run_id).cloned() {
            self.send_to(&worker, server_message::Msg::Cancel(v1::Cancel { run_id: run_id.into(), attempt, token: self.fence.token }));
        }
        self.cancels_sent.insert((run_id.to_string(), attempt));
    }

    fn job_counts(&self, job_uid: &str) -> (usize, usize, usize) {
        let Some(ids) = self.runs_by_job.get(job_uid) else { return (0, 0, 0) };
        let mut open = 0;
        let mut waiting = 0;
        let mut active = 0;
        for id in ids {
            if let Some(r) = self.runs.get(id) {
                open += 1;
                if matches!(r.state, RunState::Pending | RunState::Retrying) {
                    waiting += 1;
                }
                if r.state.is_active() {
                    active += 1;
                }
            }
        }
        (open, waiting, active)
    }

    async fn turn(&mut self) -> Result<()> {
        let now = self.clock.now_millis();
        if now - self.last_poll >= POLL_EVERY_MS {
            self.poll_store().await?;
            self.last_poll = now;
        }
        self.handle_commands().await?;
        self.expire_leases(now).await?;
        self.update_pressure();
        // Firing comes first: a burst is written in chunks until it is done
        // or the turn's fire budget is spent, then dispatch gets its turn.
        // Under red backpressure due jobs wait (they are not dropped).
        // A burst larger than one chunk writes its full chunks on their own
        // until the budget is spent; the last chunk goes into the turn's one
        // write together with the results and the assignments, so a run
        // fired now can be assigned in the same commit.
        //
        // While the workers can take the fired runs at once, a burst is
        // fired one chunk per turn instead, each chunk in the turn's write
        // with the results and assignments: the workers run chunk N while
        // the store writes chunk N+1.
        let budget = std::time::Instant::now() + FIRE_BUDGET;
        let interleaved = self.interleaved_fire_chunk();
        let limit = interleaved.unwrap_or(MAX_FIRE_BATCH);
        let mut last_chunk = None;
        while !self.pressure.defers_fires() && std::time::Instant::now() < budget {
            let Some(plan) = self.plan_fire(now, limit).await? else { break };
            if !plan.full || interleaved.is_some() {
                last_chunk = Some(plan);
                break;
            }
            self.write_fire(plan).await?;
        }
        self.release_retries(now).await?;
        self.record_and_dispatch(now, last_chunk).await
    }

    async fn poll_store(&mut self) -> Result<()> {
        let changes = self.store.job_changes(self.job_feed_seq).await?;
        for uid in changes.deleted {
            self.jobs.remove(&uid);
        }
        for job in changes.upserted {
            let changed = self.jobs.get(&job.uid).is_none_or(|j| j.record.version != job.version);
            if changed {
                self.upsert_job(job);
            }
        }
        self.job_feed_seq = changes.seq;
        for run in self.store.cancel_requests().await? {
            let key = (run.id.clone(), run.attempt);
            if self.in_flight.contains_key(run.id.as_str()) && !self.cancels_sent.contains(&key) {
                self.send_cancel(&run.id, run.attempt);
            }
        }
        Ok(())
    }

    async fn handle_commands(&mut self) -> Result<()> {
        while let Ok(cmd) = self.commands.try_recv() {
            self.on_command(cmd).await?;
        }
        if self.last_poll == 0 {
            self.poll_store().await?;
            self.last_poll = self.clock.now_millis();
        }
        Ok(())
    }

    async fn on_command(&mut self, cmd: LeaderCommand) -> Result<()> {
        match cmd {
            LeaderCommand::Nudge => self.last_poll = 0,
            LeaderCommand::Trigger { namespace, name, count, reply } => {
                let result = self.trigger(&namespace, &name, count).await;
                if let Err(StoreError::Fenced { .. }) = &result {
                    let _ = reply.send(result.clone());
                    return result.map(|_| ());
                }
                let _ = reply.send(result);
            }
            LeaderCommand::SessionOpen { hello, outbound, reply } => {
                let worker = hello.worker_id.clone();
                let old_lease = self.sessions.get(&worker).and_then(|s| s.store_lease).or_else(|| self.adopted.get(&worker).copied());
                let result = self.open_session(*hello, outbound);
                if result.is_ok() {
                    if let Some(leases) = self.leases.clone() {
                        let ttl = Duration::from_millis(u64::try_from(self.config.lease_ttl_ms).unwrap_or(10_000));
                        match leases.register(&self.fence, &worker, ttl).await {
                            Ok(lease) => {
                                let now = self.clock.now_millis();
                                if let Some(s) = self.sessions.get_mut(&worker) {
                                    s.store_lease = Some(lease);
                                    s.refreshed_at = now;
                                }
                                self.adopted.remove(&worker);
                                if let Some(old) = old_lease.filter(|o| *o != lease) {
                                    tokio::spawn(async move { leases.release(old).await });
                                }
                            }
                            Err(e @ StoreError::Fenced { .. }) => {
                                let _ = reply.send(Err(tonic::Status::unavailable("leadership changed; reconnect")));
                                return Err(e);
                            }
                            Err(e) => {
                                tracing::warn!(worker = %worker, error = %e, "cannot register the session lease in the store; the in-memory lease still applies")
                            }
                        }
                    }
                }
                let _ = reply.send(result);
            }
            LeaderCommand::FromWorker { session, msg } => self.on_worker_message(&session, msg),
            LeaderCommand::SessionClosed { session } => {
                if let Some(worker) = self.session_ids.remove(&session) {
                    if let Some(s) = self.sessions.get_mut(&worker).filter(|s| s.session_id == session) {
                        s.tx = None;
                        self.view_dirty = true;
                        tracing::info!(worker = %worker, "worker session stream closed; its lease keeps running");
                    }
                }
            }
        }
        Ok(())
    }

    /// Registers a worker session (answering `Welcome`), reclaiming the
    /// attempts it still runs, or refuses it.
    #[allow(clippy::result_large_err)] // tonic::Status is what the service returns
    fn open_session(&mut self, hello: v1::Hello, outbound: Outbound) -> std::result::Result<String, tonic::Status> {
        let now = self.clock.now_millis();
        let worker = hello.worker_id.clone();
        if let Some(old) = self.sessions.get(&worker) {
            if old.tx.as_ref().is_some_and(|tx| !tx.is_closed()) && now - old.last_heartbeat < 2 * self.config.heartbeat_ms {
                return Err(tonic::Status::already_exists(format!("worker id {worker:?} already has a live session")));
            }
        }
        let session_id = format!("{worker}-{:08x}", rand::random::<u32>());
        let mut attempts = self
            .sessions
            .remove(&worker)
            .map(|s| {
                self.session_ids.remove(&s.session_id);
                s.attempts
            })
            .unwrap_or_default();
        let listed: HashSet<&str> = hello.running.iter().map(|r| r.run_id.as_str()).collect();
        // Attempts it held but no longer lists: its report may still be
        // spooled; give it one lease to arrive, then they are lost.
        for id in attempts.iter().filter(|id| !listed.contains(&id.as_ref())) {
            self.orphans.insert(id.clone(), now + self.config.lease_ttl_ms);
        }
        let mut reclaimed = Vec::new();
        let mut superseded = Vec::new();
        for r in &hello.running {
            let current = self.runs.get(r.run_id.as_str()).is_some_and(|run| run.state.is_active() && run.attempt == r.attempt);
            let ours = self.orphans.contains_key(r.run_id.as_str()) || self.in_flight.get(r.run_id.as_str()) == Some(&worker);
            if current && ours {
                self.orphans.remove(r.run_id.as_str());
                if let Some(prev) = self.in_flight.insert(self.rid(&r.run_id), worker.clone()) {
                    if prev != worker {
                        if let Some(s) = self.sessions.get_mut(&prev) {
                            s.attempts.remove(r.run_id.as_str());
                        }
                    }
                }
                attempts.insert(self.rid(&r.run_id));
                reclaimed.push(r.clone());
            } else {
                superseded.push(r.clone());
            }
        }
        let welcome = v1::Welcome {
            session_id: session_id.clone(),
            lease_ttl_ms: u64::try_from(self.config.lease_ttl_ms).unwrap_or(10_000),
            heartbeat_interval_ms: u64::try_from(self.config.heartbeat_ms).unwrap_or(2_000),
            leader_token: self.fence.token,
            reclaimed,
            superseded,
        };
        if outbound.send(Ok(v1::ServerMessage { msg: Some(server_message::Msg::Welcome(welcome)) })).is_err() {
            return Err(tonic::Status::unavailable("the session closed during Hello"));
        }
        tracing::info!(worker = %worker, session = %session_id, capacity = hello.capacity, labels = ?hello.labels, "worker session opened");
        self.sessions.insert(
            worker.clone(),
            Session {
                session_id: session_id.clone(),
                labels: hello.labels.into_iter().collect(),
                capacity: usize::try_from(hello.capacity).unwrap_or(1),
                prefetch: usize::try_from(hello.prefetch).unwrap_or(0),
                queue_open: 0,
                recent_ms: None,
                executors: hello.executors.into_iter().collect(),
                handlers: hello.handlers.into_iter().collect(),
                tx: Some(outbound),
                lease_until: now + self.config.lease_ttl_ms,
                last_heartbeat: now,
                attempts,
                unlisted: HashMap::new(),
                draining: false,
                store_lease: None,
                refreshed_at: now,
            },
        );
        self.session_ids.insert(session_id.clone(), worker);
        self.view_dirty = true;
        Ok(session_id)
    }

    fn on_worker_message(&mut self, session: &str, msg: worker_message::Msg) {
        let Some(worker) = self.session_ids.get(session).cloned() else { return };
        let now = self.clock.now_millis();
        match msg {
            worker_message::Msg::Heartbeat(hb) => {
                if let Some(s) = self.sessions.get_mut(&worker) {
                    s.lease_until = now + self.config.lease_ttl_ms;
                    s.last_heartbeat = now;
                    // The store lease: refreshed at 0.7×TTL, with one retry
                    // at 0.95×TTL if that fails (seed 003).
                    let ttl = self.config.lease_ttl_ms;
                    if let (Some(leases), Some(lease)) = (self.leases.clone(), s.store_lease) {
                        if now - s.refreshed_at >= ttl * 7 / 10 {
                            s.refreshed_at = now;
                            tokio::spawn(async move {
                                if !matches!(leases.refresh(lease).await, Ok(true)) {
                                    tokio::time::sleep(Duration::from_millis(u64::try_from(ttl / 4).unwrap_or(0))).await;
                                    let _ = leases.refresh(lease).await;
                                }
                            });
                        }
                    }
                    if s.draining != hb.draining {
                        tracing::info!(worker = %worker, draining = hb.draining, "worker drain state changed");
                    }
                    s.draining = hb.draining;
                    self.view_dirty = true;
                }
                self.reconcile_held(&worker, &hb.attempts, now);
                self.send_to(&worker, server_message::Msg::Ack(v1::Ack { heartbeat_seq: Some(hb.seq), ..Default::default() }));
            }
            worker_message::Msg::Started(st) => {
                self.unwritten_events.push(WorkerEvent::Started { run_id: st.run_id, attempt: st.attempt, at: st.started_at_ms });
            }
            worker_message::Msg::Report(r) => {
                let state = match v1::Outcome::try_from(r.outcome).unwrap_or(v1::Outcome::Failed) {
                    v1::Outcome::Succeeded => AttemptState::Succeeded,
                    v1::Outcome::TimedOut => AttemptState::TimedOut,
                    v1::Outcome::Cancelled => AttemptState::Cancelled,
                    v1::Outcome::Lost => AttemptState::Lost,
                    v1::Outcome::Failed | v1::Outcome::Unspecified => AttemptState::Failed,
                };
                let exit_code = r.exit_code.or(r.http_status.and_then(|s| i32::try_from(s).ok()));
                let mut output = r.output;
                if output.len() > gnomon_worker::MAX_OUTPUT_BYTES {
                    let cut = output.len() - gnomon_worker::MAX_OUTPUT_BYTES;
                    let cut = (cut..output.len()).find(|i| output.is_char_boundary(*i)).unwrap_or(output.len());
                    output = output[cut..].to_string();
                }
                self.unwritten_events.push(WorkerEvent::Finished {
                    worker,
                    run_id: r.run_id,
                    attempt: r.attempt,
                    outcome: ExecOutcome { state, exit_code, output },
                    started_at: r.started_at_ms,
                    at: r.ended_at_ms.max(r.started_at_ms),
                });
            }
            worker_message::Msg::Hello(_) => {}
        }
    }

    /// A heartbeat lists every attempt the worker holds, executing or
    /// queued. An attempt the leader has it holding that two heartbeats in a
    /// row did not list, assigned more than a heartbeat interval before,
    /// and with no report of it waiting to be written, never reached the
    /// worker or was dropped by it: it is ended `lost` at the next turn
    /// ([`Self::expire_leases`]) and retried per its job's policy, instead
    /// of staying `assigned` for as long as the worker lives. Two in a row,
    /// because a report can leave the worker just after a heartbeat that no
    /// longer lists its attempt, and an assignment can cross a heartbeat.
    fn reconcile_held(&mut self, worker: &str, listed: &[v1::AttemptRef], now: Millis) {
        let Some(s) = self.sessions.get(worker) else { return };
        if s.attempts.is_empty() && s.unlisted.is_empty() {
            return;
        }
        let listed: HashSet<(&str, u32)> = listed.iter().map(|a| (a.run_id.as_str(), a.attempt)).collect();
        let reported: HashSet<&str> = self
            .unwritten_events
            .iter()
            .filter_map(|e| match e {
                WorkerEvent::Finished { worker: w, run_id, .. } if w == worker => Some(run_id.as_str()),
                _ => None,
            })
            .collect();
        let mut unlisted = HashMap::new();
        let mut gone = Vec::new();
        for id in &s.attempts {
            let Some(run) = self.runs.get(id) else { continue };
            if listed.contains(&(&**id, run.attempt))
                || reported.contains(&**id)
                || self.orphans.contains_key(id)
                || now - run.assigned_at <= self.config.heartbeat_ms
            {
                continue;
            }
            let misses = s.unlisted.get(id).copied().unwrap_or(0) + 1;
            if misses >= 2 {
                gone.push((worker.to_string(), id.clone()));
            } else {
                unlisted.insert(id.clone(), misses);
            }
        }
        if let Some(s) = self.sessions.get_mut(worker) {
            s.unlisted = unlisted;
        }
        self.unheld.extend(gone);
    }

    /// Sessions whose lease ran out lose their attempts (retried elsewhere
    /// per the job's policy); recovered attempts nobody reclaimed likewise.
    async fn expire_leases(&mut self, now: Millis) -> Result<()> {
        // With a store lease, the store's deletion of the session key decides
        // (`on_lease_deleted`); the in-memory lease is the fallback, a little
        // later, for when the store cannot be heard.
        let expired: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.lease_until + if s.store_lease.is_some() { STORE_LEASE_SLACK_MS } else { 0 } < now)
            .map(|(w, _)| w.clone())
            .collect();
        let mut batch = Vec::new();
        for worker in expired {
            let Some(s) = self.sessions.remove(&worker) else { continue };
            self.session_ids.remove(&s.session_id);
            if let (Some(leases), Some(lease)) = (self.leases.clone(), s.store_lease) {
                tokio::spawn(async move { leases.release(lease).await });
            }
            self.view_dirty = true;
            tracing::warn!(worker = %worker, attempts = s.attempts.len(), "worker lease expired; its attempts are lost");
            metrics::counter!("gnomon_worker_leases_expired_total").increment(1);
            for id in s.attempts {
                if self.in_flight.get(&id) == Some(&worker) {
                    self.in_flight.remove(&id);
                    if let Some(t) = self.end_attempt(&id, AttemptState::Lost, None, format!("worker {worker} lease expired"), now) {
                        batch.push(t);
                    }
                }
            }
        }
        // Attempts a live worker does not hold (`reconcile_held`), unless
        // their report came in since.
        let mut aborts = Vec::new();
        for (worker, id) in std::mem::take(&mut self.unheld) {
            let reported = self
                .unwritten_events
                .iter()
                .any(|e| matches!(e, WorkerEvent::Finished { worker: w, run_id, .. } if *w == worker && **run_id == *id));
            if reported || self.in_flight.get(&id) != Some(&worker) {
                continue;
            }
            let Some(attempt) = self.runs.get(&id).map(|r| r.attempt) else { continue };
            tracing::warn!(worker = %worker, run = %id, attempt, "the worker does not hold an attempt assigned to it; ending it lost");
            metrics::counter!("gnomon_attempts_unheld_total").increment(1);
            // Its slot frees when the transition is mirrored; if the write
            // fails, the next heartbeats find it again.
            let why = format!("worker {worker} did not hold the attempt (its assignment never reached it)");
            if let Some(t) = self.end_attempt(&id, AttemptState::Lost, None, why, now) {
                batch.push(t);
                aborts.push((worker, id.to_string(), attempt));
            }
        }
        let overdue: Vec<RunId> = self.orphans.iter().filter(|(_, d)| **d < now).map(|(id, _)| id.clone()).collect();
        for id in overdue {
            self.orphans.remove(&*id);
            self.orphan_workers.remove(&*id);
            if let Some(worker) = self.in_flight.remove(&*id) {
                if let Some(s) = self.sessions.get_mut(&worker) {
                    s.attempts.remove(&*id);
                }
            }
            if let Some(t) = self.end_attempt(&id, AttemptState::Lost, None, "no worker reclaimed the attempt within its lease".into(), now)
            {
                batch.push(t);
            }
        }
        self.apply(batch).await?;
        // Should the assignment still turn up, the worker drops it.
        for (worker, run_id, attempt) in aborts {
            let reason = "the attempt was ended lost: the worker did not hold it".to_string();
            self.send_to(&worker, server_message::Msg::Abort(v1::Abort { run_id, attempt, token: self.fence.token, reason }));
        }
        self.publish_view();
        Ok(())
    }

    fn update_pressure(&mut self) {
        let before = self.pressure.state();
        let capacity: usize = self.sessions.values().filter(|s| s.tx.is_some() && !s.draining).map(|s| s.capacity).sum();
        let pending = self.ready.len();
        let after = self.pressure.update(pending, self.free_slots(), capacity);
        if after != before {
            let max_pending = self.pressure.config.max_pending;
            if after == Pressure::Red || before == Pressure::Red {
                tracing::warn!(from = before.as_str(), to = after.as_str(), pending, max_pending, "backpressure changed");
            } else {
                tracing::info!(from = before.as_str(), to = after.as_str(), pending, max_pending, "backpressure changed");
            }
        }
        metrics::gauge!("gnomon_backpressure_state").set(after.level());
        metrics::gauge!("gnomon_pending_runs").set(pending as f64);
        self.view.write().unwrap_or_else(|p| p.into_inner()).pressure =
            Some(PressureInfo { state: after, pending, max_pending: self.pressure.config.max_pending });
    }

    fn publish_view(&mut self) {
        if !self.view_dirty {
            return;
        }
        self.view_dirty = false;
        let mut list: Vec<WorkerInfo> = self
            .sessions
            .iter()
            .map(|(id, s)| WorkerInfo {
                id: id.clone(),
                session: s.session_id.clone(),
                labels: s.labels.clone(),
                capacity: s.capacity,
                prefetch: s.prefetch,
                running: s.attempts.len(),
                load: s.attempts.len() as f64 / s.capacity.max(1) as f64,
                executors: {
                    let mut v: Vec<String> = s.executors.iter().cloned().collect();
                    v.sort();
                    v
                },
                handlers: {
                    let mut v: Vec<String> = s.handlers.iter().cloned().collect();
                    v.sort();
                    v
                },
                connected: s.tx.is_some(),
                draining: s.draining,
                lease_expires_at: s.lease_until,
            })
            .collect();
        list.sort_by(|a, b| a.id.cmp(&b.id));
        metrics::gauge!("gnomon_workers", "state" => "live").set(list.iter().filter(|w| w.connected).count() as f64);
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        view.workers = list;
        view.waiting = self.waiting.clone();
    }

    /// Creates `count` manual runs in one store write. Each gets its own
    /// `scheduled_at` (now, now+1 ms, …, starting past the last instant this
    /// leader gave the job's manual runs, skipping the instants the job's
    /// schedule fires at, and bumped past any instant the store already
    /// has), so its id stays unique and never takes a scheduled fire's.
    async fn trigger(&mut self, namespace: &str, name: &str, count: u32) -> Result<Vec<String>> {
        let Some(job) = self.store.get_job(namespace, name).await? else {
            return Err(StoreError::NotFound(format!("job {namespace}/{name}")));
        };
        let now = self.clock.now_millis();
        let mut created: Vec<String> = Vec::new();
        // Back-to-back triggers of many runs would otherwise collide with the
        // previous call's instants and retry their way past them.
        if !self.jobs.contains_key(&job.uid) {
            self.upsert_job(job.clone());
        }
        let mut next = self.jobs.get(&job.uid).map_or(now, |j| j.manual_next.max(now));
        for _ in 0..100 {
            let want = count as usize - created.len();
            if want == 0 {
                break;
            }
            let instants = manual_instants(self.jobs.get(&job.uid).map(|j| &j.schedule), next, want);
            let runs: Vec<NewRun> = instants
                .iter()
                .map(|at| NewRun {
                    job_uid: job.uid.clone(),
                    namespace: job.namespace.clone(),
                    job: job.name.clone(),
                    scheduled_at: *at,
                    fired_at: now,
                    state: RunState::Pending,
                    reason: Some("manual trigger".into()),
                    manual: true,
                })
                .collect();
            next = instants.last().map_or(next, |t| t + 1);
            let outcomes = self.store.fire(&self.fence, &runs, &[]).await?;
            if let Some(j) = self.jobs.get_mut(&job.uid) {
                j.manual_next = j.manual_next.max(next);
            }
            for (run, outcome) in runs.into_iter().zip(outcomes) {
                if outcome != FireOutcome::Created {
                    continue;
                }
                metrics::counter!("gnomon_runs_total", "state" => "pending").increment(1);
                created.push(self.track_pending(run, now).to_string());
            }
        }
        if created.len() < count as usize {
            return Err(StoreError::Backend("could not find free scheduled_at instants for the manual runs".into()));
        }
        Ok(created)
    }

    /// The size of a fire chunk that goes out with dispatch in the same
    /// turn (about what this turn can assign: the free room, plus the slots
    /// the results waiting to be written free, less the runs already
    /// pending), or `None` when a burst should be fired in full chunks back
    /// to back: no worker is connected, or the pending runs already
    /// outnumber what the workers can take at once (their slots plus
    /// prefetch queues).
    fn interleaved_fire_chunk(&self) -> Option<usize> {
        let absorb: usize = self.sessions.values().filter(|s| s.tx.is_some() && !s.draining).map(|s| s.capacity + s.prefetch).sum();
        (absorb > 0 && self.ready.len() < absorb).then(|| {
            let room = (self.dispatch_room() + self.unwritten_events.len()).saturating_sub(self.ready.len());
            room.clamp(MIN_INTERLEAVED_FIRE, MAX_FIRE_BATCH)
        })
    }

    /// Takes up to `limit` due jobs (one chunk) off the timer heap and plans
    /// their runs (`full` when more may be due); nothing is written except
    /// `replace` cancellations.
    async fn plan_fire(&mut self, now: Millis, limit: usize) -> Result<Option<FirePlan>> {
        let mut due_jobs = Vec::new();
        while let Some(Reverse((due, uid, generation))) = self.fire_heap.peek().cloned() {
            if due > now || due_jobs.len() >= limit {
                break;
            }
            self.fire_heap.pop();
            if self.jobs.get(&uid).is_some_and(|j| j.generation == generation && !j.record.paused) {
                due_jobs.push(uid);
            }
        }
        if due_jobs.is_empty() {
            return Ok(None);
        }
        let full = due_jobs.len() >= limit;
        let mut new_runs = Vec::new();
        let mut advances = Vec::new();
        let mut replace_cancels = Vec::new();
        let mut plans = Vec::new();
        for uid in &due_jobs {
            let Some(entry) = self.jobs.get(uid) else { continue };
            let plan = plan_fires(&PlanInput {
                schedule: &entry.schedule,
                after: self.base_of(entry),
                now,
                misfire: entry.misfire,
                catchup_window_ms: entry.catchup_window_ms,
                grace_ms: self.config.misfire_grace_ms,
            });
            let (mut open, mut waiting, _) = self.job_counts(uid);
            for planned in &plan.times {
                let (state, reason) = match &planned.decision {
                    Decision::Skip(reason) => (RunState::Skipped, Some(reason.clone())),
                    Decision::Fire => match decide_overlap(entry.overlap, open, waiting) {
                        OverlapDecision::Fire => (RunState::Pending, None),
                        OverlapDecision::FireAndCancelOpen => {
                            replace_cancels.push(uid.clone());
                            (RunState::Pending, Some("overlap: replaced the previous run".into()))
                        }
                        OverlapDecision::Skip(reason) => (RunState::Skipped, Some(reason)),
                    },
                };
                if state == RunState::Pending {
                    open += 1;
                    waiting += 1;
                    if entry.overlap == OverlapPolicy::Replace {
                        open = 1;
                        waiting = 1;
                    }
                }
                new_runs.push(NewRun {
                    job_uid: uid.clone(),
                    namespace: entry.record.key.namespace.clone(),
                    job: entry.record.key.name.clone(),
                    scheduled_at: planned.scheduled_at,
                    fired_at: now,
                    state,
                    reason,
                    manual: false,
                });
            }
            if let Some(last) = plan.last_scheduled_at {
                advances.push(JobAdvance { job_uid: uid.clone(), last_scheduled_at: last });
            }
            plans.push((uid.clone(), plan.last_scheduled_at, plan.more));
        }
        // Replace: cancel what is open before the new run goes out.
        for uid in replace_cancels {
            self.cancel_open_runs_of(&uid, now).await?;
        }
        // Stamp fired_at as late as possible: when the write begins, not when
        // the turn began (planning a large batch takes time).
        let stamp = self.clock.now_millis();
        for run in &mut new_runs {
            run.fired_at = stamp;
        }
        Ok(Some(FirePlan { due_jobs, new_runs, advances, plans, full, now, stamp, tracked: Vec::new() }))
    }

    /// Writes a fire chunk on its own.
    async fn write_fire(&mut self, plan: FirePlan) -> Result<()> {
        match self.store.fire(&self.fence, &plan.new_runs, &plan.advances).await {
            Ok(outcomes) => {
                self.finish_fire(plan, outcomes);
                Ok(())
            }
            Err(e) => {
                self.undo_fire(plan);
                Err(e)
            }
        }
    }

    /// Nothing was written: forget the runs tracked ahead of the write and
    /// put the jobs back to be tried again.
    fn undo_fire(&mut self, plan: FirePlan) {
        for id in &plan.tracked {
            self.untrack(id);
        }
        for uid in &plan.due_jobs {
            if let Some(j) = self.jobs.get(uid) {
                self.fire_heap.push(Reverse((plan.now, uid.clone(), j.generation)));
            }
        }
    }

    /// The fire is committed: track its new pending runs and schedule each
    /// job's next fire.
    fn finish_fire(&mut self, plan: FirePlan, outcomes: Vec<FireOutcome>) {
        let FirePlan { new_runs, plans, now, stamp, tracked, .. } = plan;
        let tracked: HashSet<RunId> = tracked.into_iter().collect();
        let committed = self.clock.now_millis();
        metrics::histogram!("gnomon_store_fire_seconds").record((committed - stamp).max(0) as f64 / 1000.0);
        // Metric handles looked up once per chunk, not once per run.
        let lateness = metrics::histogram!("gnomon_fire_lateness_seconds");
        let mut created: HashMap<&'static str, u64> = HashMap::new();
        for (run, outcome) in new_runs.into_iter().zip(outcomes) {
            if outcome != FireOutcome::Created {
                // It existed already. Tracked ahead of the write, it stays
                // tracked only if this write assigned it (the store had it
                // pending); otherwise the store's copy is not ours to drive.
                let id = run.id();
                if tracked.contains(id.as_str()) && !self.in_flight.contains_key(id.as_str()) {
                    self.untrack(&id);
                }
                continue;
            }
            *created.entry(run.state.as_str()).or_default() += 1;
            if run.state == RunState::Pending {
                // Lateness up to the commit: when the run became durable.
                lateness.record((committed - run.scheduled_at).max(0) as f64 / 1000.0);
                if !tracked.contains(run.id().as_str()) {
                    self.track_pending(run, now);
                }
            }
        }
        for (state, n) in created {
            metrics::counter!("gnomon_runs_total", "state" => state).increment(n);
        }
        for (uid, last, more) in plans {
            let Some(entry) = self.jobs.get_mut(&uid) else { continue };
            if let Some(last) = last {
                entry.record.last_scheduled_at = Some(entry.record.last_scheduled_at.map_or(last, |l| l.max(last)));
            }
            let generation = entry.generation;
            let next = if more { Some(now) } else { entry.schedule.next_after(entry.record.last_scheduled_at.unwrap_or(now).max(now)) };
            if let Some(next) = next {
                self.fire_heap.push(Reverse((next, uid, generation)));
            }
        }
    }

    async fn cancel_open_runs_of(&mut self, job_uid: &str, now: Millis) -> Result<()> {
        let ids: Vec<RunId> = self.runs_by_job.get(job_uid).map(|s| s.iter().cloned().collect()).unwrap_or_default();
        let mut batch = Vec::new();
        for id in ids {
            let Some(run) = self.runs.get(&*id) else { continue };
            match run.state {
                RunState::Pending | RunState::Retrying => batch.push(Transition {
                    run_id: id.to_string(),
                    from: run.state,
                    from_attempt: run.attempt,
                    to: RunState::Cancelled,
                    to_attempt: run.attempt,
                    reason: Some("overlap: replaced by a newer run".into()),
                    next_attempt_at: None,
                    attempt: None,
                    at: now,
                }),
                RunState::Assigned | RunState::Running => {
                    let attempt = run.attempt;
                    self.send_cancel(&id, attempt);
                }
                _ => {}
            }
        }
        self.apply(batch).await
    }

    async fn release_retries(&mut self, now: Millis) -> Result<()> {
        let mut batch = Vec::new();
        while let Some(Reverse((at, id))) = self.retry_heap.peek().cloned() {
            if at > now {
                break;
            }
            self.retry_heap.pop();
            if let Some(run) = self.runs.get(&id).filter(|r| r.state == RunState::Retrying) {
                batch.push(Transition {
                    run_id: id.to_string(),
                    from: RunState::Retrying,
                    from_attempt: run.attempt,
                    to: RunState::Pending,
                    to_attempt: run.attempt,
                    reason: None,
                    next_attempt_at: None,
                    attempt: None,
                    at: now,
                });
            }
        }
        self.apply(batch).await
    }

    /// Writes a batch of transitions and mirrors the applied ones in memory.
    async fn apply(&mut self, batch: Vec<Transition>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let applied = self.store.transition(&self.fence, &batch).await?;
        for (t, ok) in batch.into_iter().zip(applied) {
            if !ok {
                // Someone else moved the run (a user cancel): resync it.
                self.resync(&t.run_id).await?;
                continue;
            }
            self.mirror(&t);
        }
        Ok(())
    }

    fn mirror(&mut self, t: &Transition) {
        metrics::counter!("gnomon_runs_total", "state" => t.to.as_str()).increment(1);
        self.mirror_state(t);
    }

    /// [`Self::mirror`] without counting it in `gnomon_runs_total` (for a
    /// batch that counts its transitions once per state).
    fn mirror_state(&mut self, t: &Transition) {
        if t.to.is_terminal() {
            self.untrack(&t.run_id);
            return;
        }
        let Some(run) = self.runs.get_mut(t.run_id.as_str()) else { return };
        run.state = t.to;
        run.attempt = t.to_attempt;
        match t.to {
            RunState::Pending => {
                run.ready_since = t.at;
                self.ready.push_back(self.rid(&t.run_id));
            }
            RunState::Retrying => {
                self.release(&t.run_id);
                self.retry_heap.push(Reverse((t.next_attempt_at.unwrap_or(t.at), self.rid(&t.run_id))));
            }
            _ => {}
        }
    }

    async fn resync(&mut self, id: &str) -> Result<()> {
        match self.store.get_run(id).await? {
            Some(detail) if !detail.run.state.is_terminal() => {
                if let Some(run) = self.runs.get_mut(id) {
                    run.state = detail.run.state;
                    run.attempt = detail.run.attempt;
                }
            }
            _ => self.untrack(id),
        }
        Ok(())
    }

    /// The transition that ends `attempt`'s run attempt with `outcome`.
    fn end_attempt(&self, id: &str, outcome: AttemptState, exit_code: Option<i32>, output: String, now: Millis) -> Option<Transition> {
        let run = self.runs.get(id)?;
        if !run.state.is_active() {
            return None;
        }
        let (max_attempts, backoff) = self.jobs.get(&run.key.uid).map(|j| (j.max_attempts, j.backoff)).unwrap_or((1, Default::default()));
        let to = run_state_after_attempt(outcome, run.attempt, max_attempts);
        let next_attempt_at =
            (to == RunState::Retrying).then(|| now + i64::try_from(backoff.delay_random(run.attempt).as_millis()).unwrap_or(i64::MAX / 2));
        let reason = match to {
            RunState::Failed => Some(format!("attempt {} of {max_attempts} ended {}", run.attempt, outcome.as_str())),
            RunState::Retrying => Some(format!("attempt {} ended {}; retrying", run.attempt, outcome.as_str())),
            RunState::Cancelled => Some("cancelled".into()),
            _ => None,
        };
        Some(Transition {
            run_id: id.to_string(),
            from: run.state,
            from_attempt: run.attempt,
            to,
            to_attempt: run.attempt,
            reason,
            next_attempt_at,
            attempt: Some(AttemptChange::End { attempt: run.attempt, state: outcome, exit_code, output, started_at: None }),
            at: now,
        })
    }

    /// Builds the batch that records the worker results received since the
    /// last write. The slots of finished attempts are freed at once, so this
    /// turn's dispatch can refill them in the same store write; [`Self::undo_events`]
    /// puts them back if that write fails.
    fn prepare_worker_events(&mut self) -> EventBatch {
        let events = std::mem::take(&mut self.unwritten_events);
        // Build the batch against a scratch copy of the states so that a
        // start and an end of the same attempt in one batch chain correctly.
        let mut scratch: HashMap<String, (RunState, u32)> = HashMap::new();
        let mut batch = Vec::new();
        // Reports to ack once the batch is written: (worker, run, attempt, rejection).
        let mut acks: Vec<(String, String, u32, Option<&'static str>)> = Vec::new();
        // How long the ended attempts took: (worker, job, ms), for prefetch.
        let mut durations: Vec<(String, Arc<JobKey>, f64)> = Vec::new();
        // A start whose end is in the same batch is not written on its own:
        // the end carries the start time (one attempt write instead of two).
        let ending: HashSet<(&str, u32)> = events
            .iter()
            .filter_map(|e| match e {
                WorkerEvent::Finished { run_id, attempt, .. } => Some((run_id.as_str(), *attempt)),
                WorkerEvent::Started { .. } => None,
            })
            .collect();
        for e in &events {
            match e {
                WorkerEvent::Started { run_id, attempt, at } => {
                    if ending.contains(&(run_id.as_str(), *attempt)) {
                        continue;
                    }
                    let Some(run) = self.runs.get(run_id.as_str()) else { continue };
                    let (state, current) = scratch.get(run_id).copied().unwrap_or((run.state, run.attempt));
                    if state == RunState::Assigned && current == *attempt {
                        batch.push(Transition {
                            run_id: run_id.clone(),
                            from: state,
                            from_attempt: current,
                            to: RunState::Running,
                            to_attempt: current,
                            reason: None,
                            next_attempt_at: None,
                            attempt: Some(AttemptChange::Start { attempt: *attempt }),
                            at: *at,
                        });
                        scratch.insert(run_id.clone(), (RunState::Running, current));
                    }
                }
                WorkerEvent::Finished { worker, run_id, attempt, outcome, started_at, at } => {
                    let Some(run) = self.runs.get(run_id.as_str()) else {
                        acks.push((worker.clone(), run_id.clone(), *attempt, Some("unknown run, or its result is already recorded")));
                        continue;
                    };
                    let (state, current) = scratch.get(run_id).copied().unwrap_or((run.state, run.attempt));
                    let holder = self.in_flight.get(run_id.as_str()) == Some(worker) || self.orphans.contains_key(run_id.as_str());
                    if current != *attempt || !state.is_active() || !holder {
                        acks.push((worker.clone(), run_id.clone(), *attempt, Some("superseded attempt: the run has moved on")));
                        continue;
                    }
                    let Some(mut t) = self.end_attempt(run_id, outcome.state, outcome.exit_code, outcome.output.clone(), *at) else {
                        acks.push((worker.clone(), run_id.clone(), *attempt, Some("the attempt is no longer live")));
                        continue;
                    };
                    t.from = state;
                    if let Some(AttemptChange::End { started_at: st, .. }) = t.attempt.as_mut() {
                        *st = Some(*started_at);
                    }
                    scratch.insert(run_id.clone(), (t.to, current));
                    batch.push(t);
                    acks.push((worker.clone(), run_id.clone(), *attempt, None));
                    if matches!(outcome.state, AttemptState::Succeeded | AttemptState::Failed | AttemptState::TimedOut) {
                        durations.push((worker.clone(), run.key.clone(), (*at - *started_at).max(0) as f64));
                    }
                }
            }
        }
        for (worker, job, ms) in durations {
            let ewma = |old: Option<f64>| Some(old.map_or(ms, |o| o + DURATION_EWMA * (ms - o)));
            if let Some(s) = self.sessions.get_mut(&worker) {
                s.recent_ms = ewma(s.recent_ms);
            }
            if let Some(j) = self.jobs.get_mut(&job.uid) {
                j.recent_ms = ewma(j.recent_ms);
            }
        }
        // The worker no longer runs these: their slots are free.
        let mut freed = Vec::new();
        for t in &batch {
            if matches!(t.attempt, Some(AttemptChange::End { .. })) {
                if let Some(worker) = self.in_flight.get(t.run_id.as_str()) {
                    if let Some(s) = self.sessions.get_mut(worker) {
                        if let Some(id) = s.attempts.take(t.run_id.as_str()) {
                            freed.push((worker.clone(), id));
                        }
                    }
                }
            }
        }
        EventBatch { events, batch, acks, freed }
    }

    /// The write failed: keep the results until they are written (persist,
    /// then act) and hold their slots again.
    fn undo_events(&mut self, eb: EventBatch) {
        for (worker, id) in eb.freed {
            if self.in_flight.get(&id) == Some(&worker) {
                if let Some(s) = self.sessions.get_mut(&worker) {
                    s.attempts.insert(id);
                }
            }
        }
        let mut events = eb.events;
        events.append(&mut self.unwritten_events);
        self.unwritten_events = events;
    }

    /// The results are persisted: mirror them, then ack (and abort what was
    /// superseded).
    async fn finish_events(&mut self, eb: EventBatch, applied: Vec<bool>) -> Result<()> {
        let mut moved: HashMap<&'static str, u64> = HashMap::new();
        for (t, ok) in eb.batch.iter().zip(applied) {
            if ok {
                *moved.entry(t.to.as_str()).or_default() += 1;
                self.mirror_state(t);
            } else {
                // Someone else moved the run (a user cancel): resync it.
                self.resync(&t.run_id).await?;
            }
        }
        for (state, n) in moved {
            metrics::counter!("gnomon_runs_total", "state" => state).increment(n);
        }
        for t in &eb.batch {
            if matches!(t.attempt, Some(AttemptChange::End { .. })) {
                self.release(&t.run_id);
                self.cancels_sent.retain(|(id, _)| id != &t.run_id);
            }
        }
        for (worker, run_id, attempt, rejection) in eb.acks {
            if let Some(reason) = rejection {
                tracing::info!(worker = %worker, run = %run_id, attempt, reason, "report rejected");
                self.send_to(
                    &worker,
                    server_message::Msg::Abort(v1::Abort {
                        run_id: run_id.clone(),
                        attempt,
                        token: self.fence.token,
                        reason: reason.into(),
                    }),
                );
            }
            self.send_to(
                &worker,
                server_message::Msg::Ack(v1::Ack {
                    heartbeat_seq: None,
                    report: Some(v1::AttemptRef { run_id, attempt }),
                    rejected_reason: rejection.unwrap_or_default().to_string(),
                }),
            );
        }
        Ok(())
    }

    /// The turn's one store write: the last fire chunk, worker results and
    /// new assignments (one commit, one fsync on the SQL stores). Then the
    /// results are acked and the assignments sent.
    async fn record_and_dispatch(&mut self, now: Millis, mut fire: Option<FirePlan>) -> Result<()> {
        // Track the chunk's pending runs ahead of the write so that this
        // dispatch can place them; undone if the write fails.
        if let Some(f) = fire.as_mut() {
            for run in &f.new_runs {
                if run.state == RunState::Pending && !self.runs.contains_key(run.id().as_str()) {
                    let id = self.track_pending(run.clone(), now);
                    f.tracked.push(id);
                }
            }
        }
        let mut eb = self.prepare_worker_events();
        let mut plan = self.prepare_dispatch(now);
        let (n_events, n_dropped) = (eb.batch.len(), plan.dropped.len());
        if fire.is_none() && n_events + n_dropped + plan.batch.len() == 0 {
            return Ok(());
        }
        // Stamp the fire and the assignments when the write begins, not when
        // the turn began (so a run's fired_at never follows its assigned_at).
        let stamp = self.clock.now_millis();
        if let Some(f) = fire.as_mut() {
            f.stamp = stamp;
            for run in &mut f.new_runs {
                run.fired_at = stamp;
            }
        }
        for t in &mut plan.batch {
            t.at = stamp;
        }
        // One slice for the store, moved (results carry their output), and
        // split back into its parts after the write.
        let mut all = std::mem::take(&mut eb.batch);
        all.append(&mut plan.dropped);
        all.append(&mut plan.batch);
        let (runs, advances) = fire.as_ref().map(|f| (&f.new_runs[..], &f.advances[..])).unwrap_or((&[], &[]));
        let began = std::time::Instant::now();
        let result = self.store.fire_and_transition(&self.fence, runs, advances, &all).await;
        metrics::histogram!("gnomon_store_turn_write_seconds").record(began.elapsed().as_secs_f64());
        plan.batch = all.split_off(n_events + n_dropped);
        plan.dropped = all.split_off(n_events);
        eb.batch = all;
        let wrote = match result {
            Ok(w) => w,
            Err(e) => {
                self.undo_dispatch(&plan);
                self.undo_events(eb);
                if let Some(f) = fire {
                    self.undo_fire(f);
                }
                return Err(e);
            }
        };
        let mut applied = match wrote.applied {
            Ok(a) => a,
            Err(e) => {
                // The fire committed, the rest did not (a store without
                // one-transaction turn writes).
                self.undo_dispatch(&plan);
                self.undo_events(eb);
                if let Some(f) = fire {
                    self.finish_fire(f, wrote.fired);
                }
                return Err(e);
            }
        };
        let assigned = applied.split_off(n_events + n_dropped);
        let dropped = applied.split_off(n_events);
        self.finish_events(eb, applied).await?;
        for (t, ok) in plan.dropped.iter().zip(dropped) {
            if ok {
                self.mirror(t);
            } else {
                self.resync(&t.run_id).await?;
            }
        }
        self.finish_dispatch(plan, assigned, now).await?;
        if let Some(f) = fire {
            self.finish_fire(f, wrote.fired);
        }
        Ok(())
    }

    /// The workers a job may run on, sorted by id, as routing candidates.
    fn candidates_for(&self, job: &JobEntry) -> Vec<Candidate<'_>> {
        let (kind, handler) = match job.executor.as_ref() {
            Executor::Shell(_) => ("shell", None),
            Executor::Http(_) => ("http", None),
            Executor::Handler(h) => ("handler", Some(h.name.as_str())),
        };
        // A run known to be slow never waits in a queue: it stays pending
        // until a slot frees on any worker.
        let job_is_slow = job.recent_ms.is_some_and(|m| m > PREFETCH_SHORT_MS);
        let mut out: Vec<Candidate<'_>> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.tx.is_some() && !s.draining && s.executors.contains(kind))
            .filter(|(_, s)| handler.is_none_or(|h| s.handlers.contains(h)))
            .filter(|(_, s)| job.route.as_ref().is_none_or(|r| r.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v))))
            .map(|(id, s)| {
                let queue = if job_is_slow { 0 } else { s.queue_open };
                Candidate { limit: s.capacity + queue, ..Candidate::new(id.as_str(), s.attempts.len(), s.capacity) }
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(b.id));
        out
    }

    fn free_slots(&self) -> usize {
        self.room(false)
    }

    /// Free slots plus the prefetch queues dispatch may fill now.
    fn dispatch_room(&self) -> usize {
        self.room(true)
    }

    /// What the connected, non-draining workers can take: free slots, and
    /// with `queues` the open part of their prefetch queues.
    fn room(&self, queues: bool) -> usize {
        self.sessions
            .values()
            .filter(|s| s.tx.is_some() && !s.draining)
            .map(|s| (s.capacity + if queues { s.queue_open } else { 0 }).saturating_sub(s.attempts.len()))
            .sum()
    }

    /// Opens a worker's prefetch queue only while its attempts are short on
    /// average and none it holds is old, and only as deep as lets a queued
    /// run start within about [`PREFETCH_SHORT_MS`]: `capacity` slots
    /// working through attempts of the recent average length empty a queue
    /// of `capacity × PREFETCH_SHORT_MS / average` in that time (runs of a
    /// few milliseconds get the worker's whole `prefetch`). Otherwise runs
    /// wait in `pending`, where whichever worker frees a slot first takes
    /// them. Backpressure above green halves the part of the queue it may
    /// fill.
    fn update_prefetch(&mut self, now: Millis) {
        let runs = &self.runs;
        for s in self.sessions.values_mut() {
            let open = s.prefetch > 0
                && s.recent_ms.is_some_and(|m| m <= PREFETCH_SHORT_MS)
                && s.attempts.iter().all(|id| runs.get(id).is_some_and(|r| now - r.assigned_at <= PREFETCH_MAX_AGE_MS));
            s.queue_open = match (open, s.recent_ms) {
                (true, Some(avg)) => self.pressure.queue_allowance(s.prefetch.min(queue_depth(s.capacity, avg))),
                _ => 0,
            };
        }
    }

    /// Picks workers for ready runs and reserves their slots; the caller
    /// persists the plan, then [`Self::finish_dispatch`] sends it.
    fn prepare_dispatch(&mut self, now: Millis) -> DispatchPlan {
        self.update_prefetch(now);
        let mut free = self.dispatch_room();
        let mut batch: Vec<Transition> = Vec::new();
        let mut targets: Vec<String> = Vec::new();
        let mut batch_jobs: HashSet<String> = HashSet::new();
        let mut deferred = Vec::new();
        let mut dropped = Vec::new();
        let mut scanned = 0;
        if free == 0 {
            // Nothing can be placed: say why for the runs at the front.
            let mut reasons = Vec::new();
            for id in self.ready.iter().take(16) {
                let Some(run) = self.runs.get(id) else { continue };
                let Some(job) = self.jobs.get(&run.key.uid) else { continue };
                let strategy = job.route.as_ref().map(|r| r.strategy).unwrap_or_default();
                reasons.push((run.key.uid.clone(), waiting_reason(job, strategy, self.candidates_for(job).is_empty())));
            }
            for (job_uid, why) in reasons {
                if self.waiting.get(&job_uid) != Some(&why) {
                    self.waiting.insert(job_uid, why);
                    self.view_dirty = true;
                }
            }
        }
        while free > 0 && scanned < MAX_DISPATCH_SCAN {
            let Some(id) = self.ready.pop_front() else { break };
            scanned += 1;
            let Some(run) = self.runs.get(&id) else { continue };
            if run.state != RunState::Pending || self.in_flight.contains_key(&id) {
                continue;
            }
            let Some(job) = self.jobs.get(&run.key.uid) else {
                // Its job was deleted: it can never run.
                dropped.push(Transition {
                    run_id: id.to_string(),
                    from: RunState::Pending,
                    from_attempt: run.attempt,
                    to: RunState::Cancelled,
                    to_attempt: run.attempt,
                    reason: Some("its job was deleted before it ran".into()),
                    next_attempt_at: None,
                    attempt: None,
                    at: now,
                });
                continue;
            };
            // forbid / buffer_one / replace: a waiting run starts only after the active one ends.
            if matches!(job.overlap, OverlapPolicy::Forbid | OverlapPolicy::BufferOne | OverlapPolicy::Replace) {
                let (_, _, active) = self.job_counts(&run.key.uid);
                if active > 0 || batch_jobs.contains(&run.key.uid) {
                    deferred.push(id);
                    continue;
                }
            }
            let strategy = job.route.as_ref().map(|r| r.strategy).unwrap_or_default();
            let candidates = self.candidates_for(job);
            let mut rr = self.round_robin;
            let Some(i) = pick_worker(strategy, &run.key.name, &candidates, &mut rr) else {
                let why = waiting_reason(job, strategy, candidates.is_empty());
                let job_uid = run.key.uid.clone();
                if self.waiting.get(&job_uid) != Some(&why) {
                    self.waiting.insert(job_uid, why);
                    self.view_dirty = true;
                }
                deferred.push(id);
                continue;
            };
            let worker = candidates[i].id.to_string();
            drop(candidates);
            let job_uid = run.key.uid.clone();
            if self.waiting.remove(&job_uid).is_some() {
                self.view_dirty = true;
            }
            let Some(run) = self.runs.get(&id) else { continue };
            self.round_robin = rr;
            let attempt = run.attempt + 1;
            let job_uid = run.key.uid.clone();
            batch_jobs.insert(job_uid);
            // Reserve the slot now so the rest of this pass sees it taken.
            if let Some(s) = self.sessions.get_mut(&worker) {
                s.attempts.insert(id.clone());
            }
            self.in_flight.insert(id.clone(), worker.clone());
            free -= 1;
            batch.push(Transition {
                run_id: id.to_string(),
                from: RunState::Pending,
                from_attempt: attempt - 1,
                to: RunState::Assigned,
                to_attempt: attempt,
                reason: None,
                next_attempt_at: None,
                attempt: Some(AttemptChange::Assign { attempt, worker: worker.clone(), token: self.fence.token }),
                at: now,
            });
            targets.push(worker);
        }
        for id in deferred.into_iter().rev() {
            self.ready.push_front(id);
        }
        DispatchPlan { batch, targets, dropped }
    }

    /// The assignment write failed: free the slots and requeue the runs.
    fn undo_dispatch(&mut self, plan: &DispatchPlan) {
        for t in plan.batch.iter().rev() {
            self.release(&t.run_id);
            self.ready.push_front(Arc::from(t.run_id.as_str()));
        }
    }

    /// The assignments are persisted: send them.
    async fn finish_dispatch(&mut self, plan: DispatchPlan, applied: Vec<bool>, now: Millis) -> Result<()> {
        let DispatchPlan { batch, targets, .. } = plan;
        if batch.is_empty() {
            return Ok(());
        }
        self.view_dirty = true;
        let (assigned, latency) =
            (metrics::counter!("gnomon_runs_total", "state" => "assigned"), metrics::histogram!("gnomon_dispatch_latency_seconds"));
        for ((t, ok), worker) in batch.into_iter().zip(applied).zip(targets) {
            if !ok {
                self.release(&t.run_id);
                self.resync(&t.run_id).await?;
                continue;
            }
            assigned.increment(1);
            let Some(run) = self.runs.get_mut(t.run_id.as_str()) else { continue };
            run.state = RunState::Assigned;
            run.attempt = t.to_attempt;
            run.assigned_at = t.at;
            latency.record((now - run.ready_since).max(0) as f64 / 1000.0);
            let Some(job) = self.jobs.get(&run.key.uid) else { continue };
            let assign = v1::Assign {
                run_id: t.run_id.clone(),
                attempt: t.to_attempt,
                token: self.fence.token,
                job: run.key.name.clone(),
                namespace: run.key.namespace.clone(),
                scheduled_at_ms: run.scheduled_at,
                executor_json: job.executor_json.to_string(),
                timeout_ms: job.timeout.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0),
                idempotency_key: t.run_id.clone(),
            };
            if !self.send_to(&worker, server_message::Msg::Assign(assign)) {
                tracing::warn!(worker = %worker, run = %t.run_id, "assignment persisted but not deliverable; its lease decides");
            }
        }
        Ok(())
    }

    async fn wait_for_work(&mut self) -> Option<LeaderExit> {
        self.publish_view();
        if !self.unwritten_events.is_empty() || (!self.ready.is_empty() && self.dispatch_room() > 0 && self.ready_has_dispatchable()) {
            tokio::task::yield_now().await;
            return self.should_stop();
        }
        let now = self.clock.now_millis();
        let mut wake = now + MAX_TURN.as_millis() as i64;
        if let Some(Reverse((due, _, _))) = self.fire_heap.peek().filter(|_| !self.pressure.defers_fires()) {
            wake = wake.min(*due);
        }
        if let Some(Reverse((due, _))) = self.retry_heap.peek() {
            wake = wake.min(*due);
        }
        let sleep = Duration::from_millis(u64::try_from(wake - now).unwrap_or(0));
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            Some(cmd) = self.commands.recv() => {
                if let Err(e) = self.on_command(cmd).await {
                    tracing::warn!(error = %e, "command failed");
                }
                // Group commit without a timer: let the session tasks forward
                // what they have already read, then the turn drains the queue
                // and one store write carries all of it. While that write
                // runs, more results queue up for the next one. (A fixed 2 ms
                // window only added latency: it did not raise throughput.)
                tokio::task::yield_now().await;
            }
            Some((worker, lease)) = next_from(&mut self.lease_deletions) => self.on_lease_deleted(&worker, lease),
            Some(()) = next_from(&mut self.job_signal) => self.last_poll = 0,
            _ = self.lost.changed() => {}
            _ = self.shutdown.changed() => {}
        }
        self.should_stop()
    }

    fn ready_has_dispatchable(&self) -> bool {
        self.ready.iter().take(64).any(|id| {
            self.runs.get(id).is_some_and(|r| {
                r.state == RunState::Pending
                    && self.jobs.get(&r.key.uid).is_none_or(|j| {
                        (j.overlap == OverlapPolicy::Allow || self.job_counts(&r.key.uid).2 == 0)
                            && self.candidates_for(j).iter().any(|c| c.has_room())
                    })
            })
        })
    }
}

/// The queue a worker of `capacity` slots empties within about
/// [`PREFETCH_SHORT_MS`] when its attempts take `avg_ms` each (durations are
/// whole milliseconds, so anything shorter counts as 1 ms).
fn queue_depth(capacity: usize, avg_ms: f64) -> usize {
    let depth = capacity as f64 * PREFETCH_SHORT_MS / avg_ms.max(1.0);
    depth.min(usize::MAX as f64) as usize
}

/// Resolves once the elector says leadership is lost; never if it dropped
/// the signal without saying so.
async fn lost_signal(mut lost: watch::Receiver<bool>) {
    if lost.wait_for(|l| *l).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Why a run of `job` cannot be placed on any worker now.
fn waiting_reason(job: &JobEntry, strategy: gnomon_core::spec::RouteStrategy, no_candidates: bool) -> String {
    if no_candidates {
        let needs = match job.executor.as_ref() {
            Executor::Shell(_) => "the shell executor".to_string(),
            Executor::Http(_) => "the http executor".to_string(),
            Executor::Handler(h) => format!("handler {:?}", h.name),
        };
        let labels = job.route.as_ref().filter(|r| !r.labels.is_empty()).map(|r| format!(" and labels {:?}", r.labels));
        format!("no connected worker offers {needs}{}", labels.unwrap_or_default())
    } else if strategy == gnomon_core::spec::RouteStrategy::ConsistentHash {
        "its consistent-hash worker is at capacity".to_string()
    } else {
        "every eligible worker is at capacity".to_string()
    }
}

/// The next message of an optional store feed (session-key deletions, job
/// writes); never, without one.
async fn next_from<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// `n` instants from `from` on (1 ms apart) for manual runs, skipping those
/// `schedule` fires at: a manual run there would take that fire's run id,
/// and the scheduled fire would then find it and be merged into it, a
/// missed fire. Schedules fire at most every 100 ms, so few are skipped.
fn manual_instants(schedule: Option<&Schedule>, from: Millis, n: usize) -> Vec<Millis> {
    let mut out = Vec::with_capacity(n);
    let mut t = from;
    let mut fire = schedule.and_then(|s| s.next_after(from - 1));
    while out.len() < n {
        if fire == Some(t) {
            fire = schedule.and_then(|s| s.next_after(t));
        } else {
            out.push(t);
        }
        t += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_instants_skip_the_schedules_own_fires() {
        let every = Schedule::Every { every_ms: 1000 };
        let got = manual_instants(Some(&every), 999, 4);
        assert_eq!(got, vec![999, 1001, 1002, 1003], "1000 is the schedule's");
        let many = manual_instants(Some(&every), 500, 3000);
        assert_eq!(many.len(), 3000);
        assert!(many.iter().all(|t| t % 1000 != 0), "no whole second taken");
        assert!(many.windows(2).all(|w| w[0] < w[1]));
        let at = Schedule::At { at_ms: 5 };
        assert_eq!(manual_instants(Some(&at), 3, 4), vec![3, 4, 6, 7]);
        assert_eq!(manual_instants(None, 3, 2), vec![3, 4]);
    }

    #[test]
    fn a_queue_is_as_deep_as_its_slots_empty_in_about_100_ms() {
        assert_eq!(queue_depth(4, 50.0), 8);
        assert_eq!(queue_depth(4, 100.0), 4, "at the gate: one run per slot");
        assert_eq!(queue_depth(1, 99.0), 1);
        assert_eq!(queue_depth(256, 0.0), 25_600, "sub-millisecond runs count as 1 ms");
        assert_eq!(queue_depth(50, 0.4), 5_000);
    }
}
