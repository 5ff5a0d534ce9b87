//! The worker side of the `gnomon.worker.v1` protocol: one [`WorkerRuntime`]
//! per worker process, used by `gnomon worker`, by `gnomon dev`'s embedded
//! worker and by Rust programs that register their own handlers.
//!
//! - **Sessions**: connects to one of `servers`, follows `NotLeader`
//!   redirects, reconnects with exponential backoff (100 ms → 2 s, jittered).
//!   Attempts keep running across reconnects and are listed in the next
//!   `Hello` so the leader can reclaim them.
//! - **Persist, then forget**: every report is appended to the spool (a
//!   segment log, see [`SegmentLog`]) before it is sent, and forgotten only
//!   when the leader acks it; after a reconnect or a restart the spool
//!   is sent again (the leader dedupes by `(run, attempt)`).
//! - **Self-fencing**: when heartbeats have not been acked for
//!   `self_fence_fraction × lease TTL`, every running attempt is killed and
//!   reported `lost`: the leader re-dispatches only after the full TTL, so
//!   the two executions never overlap.
//! - **Tokens**: commands carrying a token lower than the highest seen are
//!   ignored.
//! - **Drain**: on shutdown the worker tells the leader it is draining, lets
//!   running attempts finish for up to `drain_timeout`, kills and reports
//!   what is left as `lost` (so it is retried elsewhere), waits for its
//!   reports to be acked, and returns.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gnomon_core::spec::Executor;
use gnomon_core::{AttemptState, Millis};
use gnomon_proto::v1::{self, server_message, worker_client::WorkerClient, worker_message};
use gnomon_proto::PROTOCOL_VERSION;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::{execute, ExecOutcome, ExecRequest, HandlerRegistry};

/// How long an attempt runs before the worker sends its `Started`.
const STARTED_AFTER: Duration = Duration::from_millis(20);

/// The largest `prefetch` a worker may ask for (the server refuses more).
pub const MAX_PREFETCH: u32 = 65_536;

/// The largest `capacity` a worker may announce (the server refuses more).
/// With a full prefetch queue, a heartbeat listing every attempt held stays
/// under the 8 MiB message limit of both ends.
pub const MAX_CAPACITY: u32 = 65_536;

/// The prefetch queue of a worker that does not choose one: eight times its
/// capacity. This is the most the worker holds, not what it is given: the
/// leader fills a queue only with short runs, only as deep as the worker's
/// recent attempt durations let a queued run start within about 100 ms
/// (the whole depth only for runs of a few milliseconds), and halves it
/// under backpressure.
pub fn default_prefetch(capacity: u32) -> u32 {
    capacity.saturating_mul(8).min(MAX_PREFETCH)
}

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Stable worker id.
    pub id: String,
    /// Server addresses (`host:port`), tried in turn.
    pub servers: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Attempts executed at once.
    pub capacity: u32,
    /// Assignments accepted beyond `capacity`, queued and started as soon
    /// as a slot frees (the leader fills them only with short runs).
    pub prefetch: u32,
    /// Where unacked reports are kept; `None` keeps them in memory only.
    pub spool_dir: Option<PathBuf>,
    pub drain_timeout: Duration,
    /// Fraction of the lease TTL after which unacked heartbeats make the
    /// worker kill its attempts.
    pub self_fence_fraction: f64,
    /// Bearer token for the servers, if they require one.
    pub token: Option<String>,
}

impl WorkerConfig {
    pub fn new(id: impl Into<String>, servers: Vec<String>) -> Self {
        let capacity = 16;
        Self {
            id: id.into(),
            servers,
            labels: BTreeMap::new(),
            capacity,
            prefetch: default_prefetch(capacity),
            spool_dir: None,
            drain_timeout: Duration::from_secs(30),
            self_fence_fraction: 0.7,
            token: None,
        }
    }
}

/// An attempt the worker holds: queued for a slot, then executing.
struct Running {
    cancel: watch::Sender<bool>,
    token: u64,
    /// Superseded: stop and do not report.
    aborted: bool,
    /// Killed by self-fencing or drain: report `lost`.
    lost: bool,
}

struct Inner {
    running: HashMap<(String, u32), Running>,
    spool: BTreeMap<(String, u32), v1::Report>,
    log: Option<SegmentLog>,
    /// The session's messages to the server. Unbounded: a bounded queue that
    /// filled (a large spool re-sent on reconnect) would drop reports until
    /// the next reconnect, leaving their runs `running` on the leader.
    outbound: Option<mpsc::UnboundedSender<v1::WorkerMessage>>,
    max_token: u64,
    /// When the newest acknowledged heartbeat was *sent*: the lease runs
    /// from the leader's receipt of it, which is no earlier, so the fence
    /// counted from here never outlasts the leader's view of the lease
    /// (however late the acknowledgement arrives).
    last_ack: Instant,
    /// Send times of the heartbeats not yet acknowledged, by sequence.
    heartbeats_sent: BTreeMap<u64, Instant>,
    /// Sessions established so far.
    welcomes: u64,
    lease_ttl: Duration,
    draining: bool,
}

/// A worker process's runtime. Cheap to clone.
#[derive(Clone)]
pub struct WorkerRuntime {
    config: Arc<WorkerConfig>,
    handlers: HandlerRegistry,
    http: reqwest::Client,
    inner: Arc<Mutex<Inner>>,
    /// One permit per slot: an attempt executes only while it holds one, so
    /// at most `capacity` run at once; the rest wait in FIFO order.
    slots: Arc<tokio::sync::Semaphore>,
}

fn now_ms() -> Millis {
    chrono::Utc::now().timestamp_millis()
}

fn outcome_of(state: AttemptState) -> v1::Outcome {
    match state {
        AttemptState::Succeeded => v1::Outcome::Succeeded,
        AttemptState::TimedOut => v1::Outcome::TimedOut,
        AttemptState::Cancelled => v1::Outcome::Cancelled,
        AttemptState::Lost => v1::Outcome::Lost,
        _ => v1::Outcome::Failed,
    }
}

fn msg(m: worker_message::Msg) -> v1::WorkerMessage {
    v1::WorkerMessage { msg: Some(m) }
}

impl WorkerRuntime {
    pub fn new(config: WorkerConfig, handlers: HandlerRegistry) -> Self {
        let inner = Inner {
            running: HashMap::new(),
            spool: BTreeMap::new(),
            log: None,
            outbound: None,
            max_token: 0,
            last_ack: Instant::now(),
            heartbeats_sent: BTreeMap::new(),
            welcomes: 0,
            lease_ttl: Duration::from_secs(10),
            draining: false,
        };
        let slots = Arc::new(tokio::sync::Semaphore::new(config.capacity.max(1) as usize));
        let rt = Self { config: Arc::new(config), handlers, http: reqwest::Client::new(), inner: Arc::new(Mutex::new(inner)), slots };
        rt.load_spool();
        rt
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Attempts held now, executing or queued.
    pub fn running(&self) -> usize {
        self.lock().running.len()
    }

    /// Attempts executing now (holding a slot).
    pub fn executing(&self) -> usize {
        (self.config.capacity.max(1) as usize).saturating_sub(self.slots.available_permits())
    }

    /// Reports written but not yet acked.
    pub fn unacked(&self) -> usize {
        self.lock().spool.len()
    }

    fn load_spool(&self) {
        let Some(dir) = &self.config.spool_dir else { return };
        let loaded = match SegmentLog::open(dir) {
            Ok((log, reports)) => {
                let mut inner = self.lock();
                inner.log = Some(log);
                for r in reports {
                    inner.spool.insert((r.run_id.clone(), r.attempt), r);
                }
                inner.spool.len()
            }
            Err(e) => {
                tracing::error!(dir = %dir.display(), error = %e, "cannot open the report spool; reports are kept in memory only");
                0
            }
        };
        if loaded > 0 {
            tracing::info!(reports = loaded, "re-sending spooled reports");
        }
    }

    /// Persists a report, then sends it if a session is up.
    fn spool_report(&self, report: v1::Report) {
        Self::spool_locked(&mut self.lock(), report);
    }

    /// [`Self::spool_report`] under the caller's lock: an attempt taken out
    /// of `running` in the same critical section is, for every heartbeat,
    /// either still listed or already reported (queued ahead of the
    /// heartbeat), never neither.
    fn spool_locked(inner: &mut Inner, report: v1::Report) {
        let key = (report.run_id.clone(), report.attempt);
        if let Some(log) = inner.log.as_mut() {
            if let Err(e) = log.append(&key, &report) {
                tracing::error!(error = %e, run = %report.run_id, "cannot spool report; keeping it in memory");
            }
        }
        inner.spool.insert(key, report.clone());
        if let Some(tx) = &inner.outbound {
            let _ = tx.send(msg(worker_message::Msg::Report(report)));
        }
    }

    fn acked(&self, run: &str, attempt: u32) {
        let mut inner = self.lock();
        let key = (run.to_string(), attempt);
        inner.spool.remove(&key);
        if let Some(log) = inner.log.as_mut() {
            log.ack(&key);
        }
    }

    fn start_attempt(&self, a: v1::Assign) {
        let executor: Executor = match serde_json::from_str(&a.executor_json) {
            Ok(e) => e,
            Err(e) => {
                let now = now_ms();
                self.spool_report(v1::Report {
                    run_id: a.run_id,
                    attempt: a.attempt,
                    outcome: v1::Outcome::Failed as i32,
                    output: format!("worker cannot read the executor spec: {e}"),
                    started_at_ms: now,
                    ended_at_ms: now,
                    token: a.token,
                    ..Default::default()
                });
                return;
            }
        };
        let key = (a.run_id.clone(), a.attempt);
        let (cancel_tx, cancel_rx) = watch::channel(false);
        {
            let mut inner = self.lock();
            if inner.running.contains_key(&key) || inner.spool.contains_key(&key) {
                return; // a duplicate Assign: already running or done
            }
            inner.running.insert(key.clone(), Running { cancel: cancel_tx, token: a.token, aborted: false, lost: false });
        }
        let request = ExecRequest {
            run_id: a.run_id.clone(),
            attempt: a.attempt,
            job: a.job.clone(),
            namespace: a.namespace.clone(),
            scheduled_at: a.scheduled_at_ms,
            token: a.token,
            worker_id: self.config.id.clone(),
            executor,
            timeout: (a.timeout_ms > 0).then(|| Duration::from_millis(a.timeout_ms)),
        };
        let rt = self.clone();
        let mut cancel_rx = cancel_rx;
        tokio::spawn(async move {
            // Wait for a slot (FIFO); a Cancel, Abort or self-fence while
            // queued ends the attempt without running it.
            let permit = tokio::select! {
                biased;
                _ = cancel_rx.wait_for(|c| *c) => None,
                p = rt.slots.clone().acquire_owned() => p.ok(),
            };
            // Stopped while it waited (a slot may have freed at that moment),
            // or the fence lapsed meanwhile: it never starts.
            let permit = permit.filter(|_| !*cancel_rx.borrow());
            let permit = match permit {
                Some(p) if rt.fence_lapsed() => {
                    drop(p);
                    if let Some(r) = rt.lock().running.get_mut(&key) {
                        r.lost = true;
                    }
                    None
                }
                p => p,
            };
            let started = now_ms();
            let outcome = match permit.as_ref() {
                Some(_) => {
                    // `Started` goes out once the attempt has run for a
                    // moment; one that ends sooner is reported by its
                    // `Report` alone (which carries its start time), so a
                    // short attempt costs one message, not two.
                    let run = execute(&request, &rt.http, &rt.handlers, cancel_rx);
                    tokio::pin!(run);
                    tokio::select! {
                        biased;
                        outcome = &mut run => outcome,
                        _ = tokio::time::sleep(STARTED_AFTER) => {
                            if let Some(tx) = rt.lock().outbound.clone() {
                                let _ = tx.send(msg(worker_message::Msg::Started(v1::Started {
                                    run_id: key.0.clone(),
                                    attempt: key.1,
                                    started_at_ms: started,
                                })));
                            }
                            run.await
                        }
                    }
                }
                None => ExecOutcome { state: AttemptState::Cancelled, exit_code: None, output: "cancelled before it started".into() },
            };
            // Stamped before the slot is given back, so the next attempt's
            // start never precedes this one's end.
            let ended = now_ms();
            drop(permit);
            let mut inner = rt.lock();
            let Some(state) = inner.running.remove(&key) else { return };
            if state.aborted {
                drop(inner);
                tracing::info!(run = %key.0, attempt = key.1, "superseded attempt stopped; not reported");
                return;
            }
            let outcome_state = if state.lost { AttemptState::Lost } else { outcome.state };
            let http_status = matches!(request.executor, Executor::Http(_)).then_some(outcome.exit_code).flatten();
            // Out of `running` and into the spool (and the stream) at once.
            Self::spool_locked(
                &mut inner,
                v1::Report {
                    run_id: key.0.clone(),
                    attempt: key.1,
                    outcome: outcome_of(outcome_state) as i32,
                    exit_code: if http_status.is_some() { None } else { outcome.exit_code },
                    http_status: http_status.and_then(|s| u32::try_from(s).ok()),
                    output: outcome.output,
                    started_at_ms: started,
                    ended_at_ms: ended,
                    token: state.token,
                },
            );
        });
    }

    /// Stops an attempt. `report_as`: `None` aborts it silently (superseded),
    /// `Some(lost)` reports it cancelled (`false`) or lost (`true`).
    fn stop_attempt(&self, run: &str, attempt: u32, report_as: Option<bool>) {
        let mut inner = self.lock();
        if let Some(r) = inner.running.get_mut(&(run.to_string(), attempt)) {
            match report_as {
                None => r.aborted = true,
                Some(lost) => r.lost = lost,
            }
            let _ = r.cancel.send(true);
        }
    }

    /// No heartbeat sent within the safety fraction of the lease has been
    /// acknowledged: this worker may no longer be the holder of anything.
    fn fence_lapsed(&self) -> bool {
        let inner = self.lock();
        inner.last_ack.elapsed() > inner.lease_ttl.mul_f64(self.config.self_fence_fraction)
    }

    /// Self-fencing: kill everything running and report it lost.
    fn fence_self(&self, why: &str) {
        let keys: Vec<(String, u32)> = self.lock().running.keys().cloned().collect();
        if keys.is_empty() {
            return;
        }
        tracing::warn!(attempts = keys.len(), why, "self-fencing: killing running attempts");
        for (run, attempt) in keys {
            self.stop_attempt(&run, attempt, Some(true));
        }
    }

    fn handle(&self, m: server_message::Msg) {
        match m {
            server_message::Msg::Assign(a) => {
                let stale = {
                    let mut inner = self.lock();
                    if a.token < inner.max_token {
                        true
                    } else {
                        inner.max_token = a.token;
                        false
                    }
                };
                if stale {
                    tracing::warn!(run = %a.run_id, token = a.token, "assignment with a stale token ignored");
                    return;
                }
                // A worker whose fence has lapsed (it was frozen, or cut off)
                // may have been declared dead and its attempts given to
                // another: what arrives before a fresh acknowledgement is
                // dropped, not queued (the leader ends it lost).
                if self.fence_lapsed() {
                    tracing::warn!(run = %a.run_id, attempt = a.attempt, "assignment dropped: no heartbeat acknowledged within the fence");
                    return;
                }
                self.start_attempt(a);
            }
            server_message::Msg::Cancel(c) => {
                if c.token >= self.lock().max_token {
                    self.stop_attempt(&c.run_id, c.attempt, Some(false));
                }
            }
            server_message::Msg::Abort(a) => {
                if a.token >= self.lock().max_token {
                    tracing::warn!(run = %a.run_id, attempt = a.attempt, reason = %a.reason, "attempt aborted by the leader");
                    self.stop_attempt(&a.run_id, a.attempt, None);
                    self.acked(&a.run_id, a.attempt);
                }
            }
            server_message::Msg::Ack(ack) => {
                if let Some(seq) = ack.heartbeat_seq {
                    let mut inner = self.lock();
                    if let Some(sent) = inner.heartbeats_sent.get(&seq).copied() {
                        inner.last_ack = inner.last_ack.max(sent);
                    }
                    inner.heartbeats_sent.retain(|s, _| *s > seq);
                }
                if let Some(r) = ack.report {
                    if !ack.rejected_reason.is_empty() {
                        tracing::warn!(run = %r.run_id, attempt = r.attempt, reason = %ack.rejected_reason, "report rejected by the leader");
                    }
                    self.acked(&r.run_id, r.attempt);
                }
            }
            server_message::Msg::Welcome(_) | server_message::Msg::NotLeader(_) => {}
        }
    }

    fn hello(&self) -> v1::Hello {
        let inner = self.lock();
        let mut executors = vec!["shell".to_string(), "http".to_string()];
        if !self.handlers.names().is_empty() {
            executors.push("handler".into());
        }
        v1::Hello {
            worker_id: self.config.id.clone(),
            labels: self.config.labels.clone().into_iter().collect(),
            capacity: self.config.capacity,
            executors,
            handlers: self.handlers.names(),
            running: inner
                .running
                .iter()
                .filter(|(_, r)| !r.lost)
                .map(|(k, _)| v1::AttemptRef { run_id: k.0.clone(), attempt: k.1 })
                .collect(),
            protocol_version: PROTOCOL_VERSION,
            prefetch: self.config.prefetch,
        }
    }

    /// Runs sessions until `shutdown` turns true and the drain is done.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        // Self-fencing watchdog.
        let watchdog = {
            let rt = self.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if rt.fence_lapsed() {
                        rt.fence_self("no heartbeat acked within the safety fraction of the lease");
                    }
                }
            })
        };
        let mut backoff = Duration::from_millis(100);
        let mut next = 0usize;
        let mut redirect: Option<String> = None;
        let mut drain_deadline: Option<Instant> = None;
        loop {
            if *shutdown.borrow() && drain_deadline.is_none() {
                drain_deadline = Some(Instant::now() + self.config.drain_timeout);
                self.lock().draining = true;
            }
            if let Some(deadline) = drain_deadline {
                if Instant::now() >= deadline {
                    self.fence_self("drain timeout");
                }
                let (running, unacked) = (self.running(), self.unacked());
                if running == 0 && (unacked == 0 || Instant::now() >= deadline + Duration::from_secs(5)) {
                    break;
                }
            }
            let addr = redirect.take().unwrap_or_else(|| {
                let a = self.config.servers[next % self.config.servers.len().max(1)].clone();
                next += 1;
                a
            });
            let welcomed = self.lock().welcomes;
            let end = self.session(&addr, &mut shutdown, &mut drain_deadline).await;
            // After a session that was established, reconnect quickly again:
            // a worker must find a new leader well within its lease.
            if self.lock().welcomes != welcomed {
                backoff = Duration::from_millis(100);
            }
            match end {
                SessionEnd::Redirect(to) => {
                    tracing::info!(from = %addr, to = %to, "not the leader; following the redirect");
                    redirect = Some(to);
                    backoff = Duration::from_millis(100);
                    continue;
                }
                SessionEnd::Refused(why) => tracing::error!(server = %addr, why, "session refused"),
                SessionEnd::Lost(why) => tracing::warn!(server = %addr, why, "session ended; reconnecting"),
                SessionEnd::Drained => break,
            }
            let jitter = rand::random::<f64>() * 0.3 + 0.85;
            tokio::select! {
                _ = tokio::time::sleep(backoff.mul_f64(jitter)) => {}
                _ = shutdown.changed() => {}
            }
            // Capped at 2 s: a worker must be back well within a new
            // leader's lease TTL to reclaim its running attempts.
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
        watchdog.abort();
        tracing::info!(worker = %self.config.id, "worker stopped");
    }

    async fn session(&self, addr: &str, shutdown: &mut watch::Receiver<bool>, drain_deadline: &mut Option<Instant>) -> SessionEnd {
        let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
            Ok(e) => e
                .connect_timeout(Duration::from_secs(3))
                .http2_keep_alive_interval(Duration::from_secs(2))
                .keep_alive_timeout(Duration::from_secs(3)),
            Err(e) => return SessionEnd::Refused(format!("bad server address {addr:?}: {e}")),
        };
        let channel = match endpoint.connect().await {
            Ok(c) => c,
            Err(e) => return SessionEnd::Lost(format!("connect: {e}")),
        };
        let mut client = WorkerClient::new(channel).max_decoding_message_size(8 << 20);
        let (tx, rx) = mpsc::unbounded_channel::<v1::WorkerMessage>();
        // The session's lease starts when the leader receives this Hello,
        // so the fence counts from its sending: a worker frozen before it
        // reads the Welcome must not count from the Welcome's late arrival.
        let hello_sent = Instant::now();
        let _ = tx.send(msg(worker_message::Msg::Hello(self.hello())));
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
        if let Some(token) = &self.config.token {
            if let Ok(v) = format!("Bearer {token}").parse() {
                request.metadata_mut().insert("authorization", v);
            }
        }
        let mut inbound = match client.session(request).await {
            Ok(r) => r.into_inner(),
            Err(status) => return SessionEnd::from_status(&status),
        };
        let welcome = match inbound.message().await {
            Ok(Some(v1::ServerMessage { msg: Some(server_message::Msg::Welcome(w)) })) => w,
            Ok(Some(v1::ServerMessage { msg: Some(server_message::Msg::NotLeader(n)) })) => {
                return if n.leader_address.is_empty() || n.leader_address == addr {
                    SessionEnd::Lost("no leader yet".into())
                } else {
                    SessionEnd::Redirect(n.leader_address)
                };
            }
            Ok(_) => return SessionEnd::Lost("the server did not answer Hello".into()),
            Err(status) => return SessionEnd::from_status(&status),
        };
        for r in &welcome.superseded {
            self.stop_attempt(&r.run_id, r.attempt, None);
        }
        let heartbeat_every = Duration::from_millis(welcome.heartbeat_interval_ms.max(50));
        {
            let mut inner = self.lock();
            inner.max_token = inner.max_token.max(welcome.leader_token);
            inner.lease_ttl = Duration::from_millis(welcome.lease_ttl_ms.max(500));
            inner.last_ack = inner.last_ack.max(hello_sent);
            inner.heartbeats_sent.clear();
            inner.welcomes += 1;
            inner.outbound = Some(tx.clone());
            for r in inner.spool.values() {
                let _ = tx.send(msg(worker_message::Msg::Report(r.clone())));
            }
        }
        tracing::info!(server = %addr, session = %welcome.session_id, token = welcome.leader_token, "session established");
        let mut seq = 0u64;
        let mut ticker = tokio::time::interval(heartbeat_every);
        let end = loop {
            tokio::select! {
                _ = ticker.tick() => {
                    seq += 1;
                    let (held, attempts, draining) = {
                        let inner = self.lock();
                        let attempts: Vec<v1::AttemptRef> =
                            inner.running.keys().map(|k| v1::AttemptRef { run_id: k.0.clone(), attempt: k.1 }).collect();
                        (inner.running.len() as u32, attempts, inner.draining)
                    };
                    let running = self.executing() as u32;
                    let queued = held.saturating_sub(running);
                    let load = f64::from(running) / f64::from(self.config.capacity.max(1));
                    let hb = v1::Heartbeat { seq, running, load, attempts, draining, queued };
                    self.lock().heartbeats_sent.insert(seq, Instant::now());
                    if tx.send(msg(worker_message::Msg::Heartbeat(hb))).is_err() {
                        break SessionEnd::Lost("outbound queue closed".into());
                    }
                    if let Some(deadline) = *drain_deadline {
                        if Instant::now() >= deadline {
                            self.fence_self("drain timeout");
                        }
                        if self.running() == 0 && self.unacked() == 0 {
                            break SessionEnd::Drained;
                        }
                        if self.running() == 0 && Instant::now() >= deadline + Duration::from_secs(5) {
                            break SessionEnd::Drained;
                        }
                    }
                }
                m = inbound.message() => match m {
                    Ok(Some(v1::ServerMessage { msg: Some(m) })) => self.handle(m),
                    Ok(Some(_)) => {}
                    Ok(None) => break SessionEnd::Lost("the server closed the session".into()),
                    Err(status) => break SessionEnd::Lost(status.to_string()),
                },
                _ = shutdown.changed(), if drain_deadline.is_none() => {
                    *drain_deadline = Some(Instant::now() + self.config.drain_timeout);
                    self.lock().draining = true;
                    tracing::info!(running = self.running(), "draining: no new assignments; waiting for running attempts");
                }
            }
        };
        self.lock().outbound = None;
        end
    }
}

enum SessionEnd {
    Redirect(String),
    Refused(String),
    Lost(String),
    Drained,
}

impl SessionEnd {
    /// A refusal (bad Hello, duplicate id, auth) or a transient loss.
    fn from_status(status: &tonic::Status) -> SessionEnd {
        match status.code() {
            tonic::Code::FailedPrecondition | tonic::Code::InvalidArgument | tonic::Code::AlreadyExists | tonic::Code::Unauthenticated => {
                SessionEnd::Refused(status.message().to_string())
            }
            _ => SessionEnd::Lost(status.to_string()),
        }
    }
}

/// The on-disk spool: reports appended to segment files (`seg-N.log`,
/// records of `u32` length + protobuf), written but not fsynced. A segment is
/// deleted once every report in it is acked and a newer segment is being
/// written. After a restart every report still on disk is sent again; the
/// leader dedupes by `(run, attempt)`, so one acked just before the crash is
/// harmless. (One file per report cost an inode create and delete per
/// result: it capped a worker near 2,000 results a second.)
struct SegmentLog {
    dir: PathBuf,
    current: Option<(u64, std::fs::File, u64)>,
    next_id: u64,
    /// Unacked reports per segment, and each report's segment.
    pending: BTreeMap<u64, std::collections::HashSet<(String, u32)>>,
    segment_of: HashMap<(String, u32), u64>,
}

const SEGMENT_BYTES: u64 = 4 << 20;

impl SegmentLog {
    fn path(dir: &std::path::Path, id: u64) -> PathBuf {
        dir.join(format!("seg-{id:012}.log"))
    }

    fn open(dir: &std::path::Path) -> std::io::Result<(SegmentLog, Vec<v1::Report>)> {
        std::fs::create_dir_all(dir)?;
        let mut ids: Vec<u64> = std::fs::read_dir(dir)?
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_prefix("seg-")?.strip_suffix(".log")?.parse().ok()))
            .collect();
        ids.sort_unstable();
        let mut log = SegmentLog {
            dir: dir.to_path_buf(),
            current: None,
            next_id: ids.last().map_or(1, |l| l + 1),
            pending: BTreeMap::new(),
            segment_of: HashMap::new(),
        };
        let mut reports = Vec::new();
        for id in ids {
            let bytes = std::fs::read(Self::path(dir, id))?;
            let mut rest = bytes.as_slice();
            while rest.len() >= 4 {
                let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                if rest.len() < 4 + len {
                    break; // a torn last record
                }
                if let Ok(r) = <v1::Report as prost::Message>::decode(&rest[4..4 + len]) {
                    let key = (r.run_id.clone(), r.attempt);
                    log.pending.entry(id).or_default().insert(key.clone());
                    log.segment_of.insert(key, id);
                    reports.push(r);
                }
                rest = &rest[4 + len..];
            }
            if !log.pending.contains_key(&id) {
                let _ = std::fs::remove_file(Self::path(dir, id));
            }
        }
        Ok((log, reports))
    }

    fn append(&mut self, key: &(String, u32), report: &v1::Report) -> std::io::Result<()> {
        use std::io::Write;
        if self.current.as_ref().is_none_or(|(_, _, size)| *size >= SEGMENT_BYTES) {
            let id = self.next_id;
            self.next_id += 1;
            let file = std::fs::OpenOptions::new().create(true).append(true).open(Self::path(&self.dir, id))?;
            if let Some((old, _, _)) = self.current.replace((id, file, 0)) {
                if self.pending.get(&old).is_none_or(|p| p.is_empty()) {
                    self.pending.remove(&old);
                    let _ = std::fs::remove_file(Self::path(&self.dir, old));
                }
            }
        }
        let body = prost::Message::encode_to_vec(report);
        let mut record = Vec::with_capacity(4 + body.len());
        record.extend_from_slice(&(body.len() as u32).to_le_bytes());
        record.extend_from_slice(&body);
        let Some((id, file, size)) = self.current.as_mut() else { return Ok(()) };
        file.write_all(&record)?;
        *size += record.len() as u64;
        self.pending.entry(*id).or_default().insert(key.clone());
        self.segment_of.insert(key.clone(), *id);
        Ok(())
    }

    fn ack(&mut self, key: &(String, u32)) {
        let Some(id) = self.segment_of.remove(key) else { return };
        let empty = self.pending.get_mut(&id).is_some_and(|p| {
            p.remove(key);
            p.is_empty()
        });
        let is_current = self.current.as_ref().is_some_and(|(c, _, _)| *c == id);
        if empty && !is_current {
            self.pending.remove(&id);
            let _ = std::fs::remove_file(Self::path(&self.dir, id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handler that records how many calls run at once and blocks until
    /// released.
    struct Gate {
        now: Arc<std::sync::atomic::AtomicUsize>,
        peak: Arc<std::sync::atomic::AtomicUsize>,
        order: Arc<Mutex<Vec<String>>>,
        release: Arc<tokio::sync::Semaphore>,
    }

    #[async_trait::async_trait]
    impl crate::Handler for Gate {
        async fn call(&self, ctx: crate::HandlerContext, _payload: serde_json::Value) -> Result<String, String> {
            use std::sync::atomic::Ordering::SeqCst;
            let n = self.now.fetch_add(1, SeqCst) + 1;
            self.peak.fetch_max(n, SeqCst);
            self.order.lock().unwrap().push(ctx.run_id.clone());
            self.release.acquire().await.map_err(|e| e.to_string())?.forget();
            self.now.fetch_sub(1, SeqCst);
            Ok(String::new())
        }
    }

    /// A worker whose only handler is a [`Gate`] (shared back), given
    /// `assigns` runs r0, r1, ….
    fn gated_worker(capacity: u32, prefetch: u32, assigns: usize) -> (WorkerRuntime, Arc<Gate>) {
        let gate = Arc::new(Gate {
            now: Default::default(),
            peak: Default::default(),
            order: Default::default(),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
        });
        let mut handlers = HandlerRegistry::default();
        handlers.register("gate", gate.clone());
        let mut config = WorkerConfig::new("w", vec![]);
        config.capacity = capacity;
        config.prefetch = prefetch;
        let rt = WorkerRuntime::new(config, handlers);
        for i in 0..assigns {
            rt.handle(server_message::Msg::Assign(assign(&format!("r{i}"))));
        }
        (rt, gate)
    }

    fn assign(run: &str) -> v1::Assign {
        v1::Assign {
            run_id: run.into(),
            attempt: 1,
            token: 1,
            job: "j".into(),
            namespace: "default".into(),
            executor_json: r#"{"handler":{"name":"gate"}}"#.into(),
            ..Default::default()
        }
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..1000 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("timed out waiting for {what}");
    }

    /// A worker that wakes from a freeze (no heartbeat acknowledged within
    /// the fence) drops the assignments that arrived meanwhile: the leader
    /// may already have given them to another worker. And a queued attempt
    /// whose slot frees after the fence lapsed never starts: it is reported
    /// lost.
    #[tokio::test]
    async fn a_worker_whose_fence_lapsed_starts_nothing() {
        let (rt, gate) = gated_worker(1, 1, 0);
        rt.lock().lease_ttl = Duration::from_secs(10);
        rt.lock().last_ack = Instant::now() - Duration::from_secs(8);
        rt.handle(server_message::Msg::Assign(assign("late")));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(rt.running(), 0, "an assignment that arrives while fenced is dropped");
        assert!(gate.order.lock().unwrap().is_empty());

        // Fresh: r0 executes, r1 waits for the slot. Then the fence lapses
        // before the slot frees.
        rt.lock().last_ack = Instant::now();
        rt.handle(server_message::Msg::Assign(assign("r0")));
        rt.handle(server_message::Msg::Assign(assign("r1")));
        until("r0 executing", || gate.order.lock().unwrap().len() == 1).await;
        rt.lock().last_ack = Instant::now() - Duration::from_secs(8);
        gate.release.add_permits(1);
        until("both ended", || rt.running() == 0).await;
        assert_eq!(*gate.order.lock().unwrap(), vec!["r0".to_string()], "r1 never ran");
        let spool = rt.lock().spool.clone();
        let r1 = spool.get(&("r1".to_string(), 1)).expect("r1 reported");
        assert_eq!(r1.outcome, v1::Outcome::Lost as i32, "{r1:?}");
    }

    /// The fence runs from when the acknowledged heartbeat was sent, not
    /// from when its acknowledgement arrived.
    #[test]
    fn an_ack_counts_from_the_heartbeats_send_time() {
        let rt = WorkerRuntime::new(WorkerConfig::new("w", vec![]), HandlerRegistry::default());
        let sent = Instant::now() - Duration::from_secs(6);
        {
            let mut inner = rt.lock();
            inner.lease_ttl = Duration::from_secs(10);
            inner.last_ack = sent - Duration::from_secs(1);
            inner.heartbeats_sent.insert(7, sent);
        }
        rt.handle(server_message::Msg::Ack(v1::Ack { heartbeat_seq: Some(7), ..Default::default() }));
        assert_eq!(rt.lock().last_ack, sent);
        assert!(!rt.fence_lapsed(), "6 s < 7 s");
        rt.lock().last_ack = sent - Duration::from_secs(2);
        assert!(rt.fence_lapsed(), "8 s > 7 s");
        // An ack of a heartbeat it never sent moves nothing.
        rt.handle(server_message::Msg::Ack(v1::Ack { heartbeat_seq: Some(99), ..Default::default() }));
        assert_eq!(rt.lock().last_ack, sent - Duration::from_secs(2));
    }

    #[tokio::test]
    async fn capacity_bounds_execution_and_the_queue_runs_in_order() {
        let (rt, gate) = gated_worker(2, 3, 5);
        let (peak, order, release) = (gate.peak.clone(), gate.order.clone(), gate.release.clone());
        until("two executing", || order.lock().unwrap().len() == 2).await;
        assert_eq!(rt.running(), 5, "held: two executing, three queued");
        assert_eq!(rt.executing(), 2);
        // A queued attempt that is cancelled ends without running.
        rt.handle(server_message::Msg::Cancel(v1::Cancel { run_id: "r3".into(), attempt: 1, token: 1 }));
        until("the cancelled one reported", || rt.lock().spool.contains_key(&("r3".to_string(), 1))).await;
        assert_eq!(rt.lock().spool[&("r3".to_string(), 1)].outcome, v1::Outcome::Cancelled as i32);
        release.add_permits(10);
        until("all ended", || rt.unacked() == 5).await;
        assert_eq!(peak.load(std::sync::atomic::Ordering::SeqCst), 2, "never more than capacity at once");
        assert_eq!(*order.lock().unwrap(), vec!["r0", "r1", "r2", "r4"], "FIFO, without the cancelled one");
        assert_eq!(rt.running(), 0);
    }

    #[tokio::test]
    async fn self_fencing_reports_queued_attempts_lost() {
        let (rt, gate) = gated_worker(1, 2, 3);
        let order = gate.order.clone();
        until("one executing", || order.lock().unwrap().len() == 1).await;
        rt.fence_self("test");
        until("all reported", || rt.unacked() == 3).await;
        let spool = rt.lock().spool.clone();
        assert!(spool.values().all(|r| r.outcome == v1::Outcome::Lost as i32), "{spool:?}");
        assert_eq!(order.lock().unwrap().len(), 1, "the queued ones never ran");
    }

    fn report(run: &str) -> v1::Report {
        v1::Report { run_id: run.into(), attempt: 1, outcome: v1::Outcome::Succeeded as i32, output: "x".repeat(100), ..Default::default() }
    }

    #[test]
    fn the_spool_keeps_unacked_reports_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, loaded) = SegmentLog::open(dir.path()).unwrap();
        assert!(loaded.is_empty());
        for i in 0..5 {
            log.append(&(format!("r{i}"), 1), &report(&format!("r{i}"))).unwrap();
        }
        log.ack(&("r1".into(), 1));
        log.ack(&("r3".into(), 1));
        drop(log);
        let (_, loaded) = SegmentLog::open(dir.path()).unwrap();
        let mut runs: Vec<String> = loaded.iter().map(|r| r.run_id.clone()).collect();
        runs.sort();
        // Acked reports in a live segment may come back (the leader dedupes);
        // unacked ones always do.
        for r in ["r0", "r2", "r4"] {
            assert!(runs.contains(&r.to_string()), "{r} survives: {runs:?}");
        }
    }

    #[test]
    fn fully_acked_segments_are_deleted_and_torn_records_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = SegmentLog::open(dir.path()).unwrap();
        log.append(&("a".into(), 1), &report("a")).unwrap();
        log.current.as_mut().unwrap().2 = SEGMENT_BYTES; // force a rotation
        log.append(&("b".into(), 1), &report("b")).unwrap();
        log.ack(&("a".into(), 1));
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(files, 1, "the acked, rotated segment is gone");
        drop(log);
        // A torn tail (a crash mid-write) is skipped.
        let seg = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
        let mut bytes = std::fs::read(&seg).unwrap();
        bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2]);
        std::fs::write(&seg, bytes).unwrap();
        let (_, loaded) = SegmentLog::open(dir.path()).unwrap();
        assert_eq!(loaded.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), vec!["b"]);
    }
}
