//! The worker side of the `gnomon.worker.v1` protocol: one [`WorkerRuntime`]
//! per worker process, used by `gnomon worker`, by `gnomon dev`'s embedded
//! worker and by Rust programs that register their own handlers.
//!
//! - **Sessions**: connects to one of `servers`, follows `NotLeader`
//!   redirects, reconnects with exponential backoff (100 ms → 2 s, jittered).
//!   Attempts keep running across reconnects and are listed in the next
//!   `Hello` so the leader can reclaim them.
//! - **Persist, then forget**: every report is appended to the spool (a
//!   segment log, see `SegmentLog`) before it is sent, and forgotten only
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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gnomon_core::outcome::RetryHint;
use gnomon_core::spec::Executor;
use gnomon_core::{AttemptState, Millis};
use gnomon_proto::v1::{self, server_message, worker_message};
use gnomon_proto::PROTOCOL_VERSION;
use tokio::sync::{mpsc, watch};

use crate::spool::SegmentLog;
use crate::{execute, ExecOutcome, ExecRequest, HandlerRegistry};

/// How long an attempt runs before the worker sends its `Started`.
const STARTED_AFTER: Duration = Duration::from_millis(20);

/// An attempt the worker holds: queued for a slot, then executing.
struct Running {
    cancel: watch::Sender<bool>,
    token: u64,
    /// Superseded: stop and do not report.
    aborted: bool,
    /// Killed by self-fencing or drain: report `lost`.
    lost: bool,
    /// Its output on the way to the leader.
    live: crate::live::LiveSink,
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
        let http = config.egress.client();
        let rt = Self { config: Arc::new(config), handlers, http, inner: Arc::new(Mutex::new(inner)), slots };
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

    /// Whether this worker runs jobs of an executor kind.
    fn runs_kind(&self, kind: &str) -> bool {
        let enabled = self.config.executors.is_empty() || self.config.executors.iter().any(|k| k == kind);
        enabled && (kind != "handler" || !self.handlers.names().is_empty())
    }

    fn hello(&self) -> v1::Hello {
        let inner = self.lock();
        let executors: Vec<String> = ["shell", "http", "handler"].into_iter().filter(|k| self.runs_kind(k)).map(str::to_string).collect();
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
}

mod attempts;
mod config;
mod connect;
mod tls;

pub use config::{default_prefetch, WorkerConfig, WorkerTls, MAX_CAPACITY, MAX_PREFETCH};

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
        async fn call(&self, ctx: crate::HandlerContext, _payload: serde_json::Value) -> Result<String, crate::HandlerError> {
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
}
