//! What the leader tests share: a store, a term, a runtime on a manual
//! clock, worker messages, and reads of what was fired.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use gnomon_backend::sqlite::SqliteStore;
use gnomon_backend::{Fence, LeaderInfo, Precondition, Store};
use gnomon_core::spec::parse_job_json;
use gnomon_core::ManualClock;
use gnomon_proto::v1::{self, server_message, worker_message};
use gnomon_proto::PROTOCOL_VERSION;
use gnomon_server::leader::{LeaderCommand, LeaderConfig, LeaderParts, LeaderRuntime};
use tokio::sync::{mpsc, oneshot, watch};

pub(crate) use super::faulty;

pub(crate) async fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("g.db").display());
    (dir, Arc::new(SqliteStore::open(&url).await.unwrap()))
}

pub(crate) async fn term(store: &Arc<dyn Store>) -> Fence {
    let token = store.next_epoch("scheduler").await.unwrap();
    let fence = Fence { scope: "scheduler".into(), token };
    store.fence(&fence, &LeaderInfo::default(), 0).await.unwrap();
    fence
}

/// A job that fires every second.
pub(crate) async fn every_second_job(store: &Arc<dyn Store>) {
    let spec = parse_job_json(br#"{"name":"tick","schedule":{"every":"1s"},"executor":{"handler":{"name":"noop"}}}"#)
        .unwrap()
        .compile()
        .unwrap()
        .spec;
    store.put_job(&spec, Precondition::DoesNotExist, 1_000_000).await.unwrap();
}

pub(crate) fn runtime(
    store: Arc<dyn Store>,
    fence: Fence,
    clock: ManualClock,
) -> (LeaderRuntime, watch::Sender<bool>, watch::Sender<bool>) {
    let (rt, commands, lost, shut) = runtime_with_commands(store, fence, clock);
    std::mem::forget(commands);
    (rt, lost, shut)
}

/// The runtime and the sender of its command channel (sessions, triggers).
pub(crate) fn runtime_with_commands(
    store: Arc<dyn Store>,
    fence: Fence,
    clock: ManualClock,
) -> (LeaderRuntime, mpsc::Sender<LeaderCommand>, watch::Sender<bool>, watch::Sender<bool>) {
    runtime_with_commands_live(store, fence, clock, Default::default())
}

/// [`runtime_with_commands`], keeping live output in `live`.
pub(crate) fn runtime_with_commands_live(
    store: Arc<dyn Store>,
    fence: Fence,
    clock: ManualClock,
    live: gnomon_server::live::LiveOutputs,
) -> (LeaderRuntime, mpsc::Sender<LeaderCommand>, watch::Sender<bool>, watch::Sender<bool>) {
    let (cmd_tx, cmd_rx) = mpsc::channel(64);
    let (lost_tx, lost_rx) = watch::channel(false);
    let (shut_tx, shut_rx) = watch::channel(false);
    let rt = LeaderRuntime::new(LeaderParts {
        store,
        fence,
        clock: Arc::new(clock),
        config: LeaderConfig::default(),
        commands: cmd_rx,
        lost: lost_rx,
        shutdown: shut_rx,
        view: Default::default(),
        live,
        seed: 1,
    });
    (rt, cmd_tx, lost_tx, shut_tx)
}

/// The next message on a session's outbound queue that `pick` accepts;
/// panics on one that `forbid` matches first, or after 10 s.
pub(crate) async fn next_msg<T>(
    rx: &mut mpsc::UnboundedReceiver<Result<v1::ServerMessage, tonic::Status>>,
    what: &str,
    forbid: impl Fn(&server_message::Msg) -> bool,
    pick: impl Fn(&server_message::Msg) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = tokio::time::timeout_at(deadline, rx.recv()).await.unwrap_or_else(|_| panic!("no {what} within 10 s"));
        let msg = m.expect("session open").expect("not an error").msg.expect("a message");
        assert!(!forbid(&msg), "got {msg:?} while waiting for {what}");
        if let Some(v) = pick(&msg) {
            return v;
        }
    }
}

pub(crate) fn heartbeat(seq: u64, attempts: &[(&str, u32)]) -> worker_message::Msg {
    worker_message::Msg::Heartbeat(v1::Heartbeat {
        seq,
        attempts: attempts.iter().map(|(r, a)| v1::AttemptRef { run_id: r.to_string(), attempt: *a }).collect(),
        ..Default::default()
    })
}

/// A store that fails only when told to.
pub(crate) fn faulty(sqlite: &Arc<dyn Store>, clock: &ManualClock) -> Arc<faulty::FaultyStore> {
    use rand::SeedableRng;
    let rates = faulty::FaultRates { write_before: 0.0, write_after: 0.0, read: 0.0, delay: 0.0, max_delay_ms: 1 };
    Arc::new(faulty::FaultyStore::new(sqlite.clone(), clock.clone(), rand::rngs::StdRng::seed_from_u64(1), rates))
}

pub(crate) async fn put(store: &Arc<dyn Store>, json: &str, at: i64) -> gnomon_backend::JobRecord {
    let spec = parse_job_json(json.as_bytes()).unwrap().compile().unwrap().spec;
    store.put_job(&spec, Precondition::None, at).await.unwrap()
}

/// The non-manual instants of a job that have a record (a run or a skip).
pub(crate) async fn instants(store: &Arc<dyn Store>, job: &str) -> Vec<i64> {
    let filter = gnomon_backend::RunFilter { job: Some(job.into()), ..Default::default() };
    let mut v: Vec<i64> =
        store.list_runs(&filter, 1000, None).await.unwrap().runs.iter().filter(|r| !r.manual).map(|r| r.scheduled_at).collect();
    v.sort();
    v
}

/// Steps the manual clock `n` times by `ms`, giving the leader real time
/// to take a turn after each.
/// The job's instants once at least `n` have fired (or after 20 s of real
/// time): a loaded machine may fire the last one a little after the last
/// step; the check is on what fired, not how fast.
pub(crate) async fn instants_once(store: &Arc<dyn Store>, job: &str, n: usize) -> Vec<i64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = instants(store, job).await;
    while got.len() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        got = instants(store, job).await;
    }
    got
}

pub(crate) async fn advance(clock: &ManualClock, n: usize, ms: i64) {
    for _ in 0..n {
        clock.advance(ms);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub(crate) fn clock_now(clock: &ManualClock) -> i64 {
    use gnomon_core::Clock;
    clock.now_millis()
}

/// Opens a worker session for a `noop`-handler worker.
pub(crate) async fn open_session(
    commands: &mpsc::Sender<LeaderCommand>,
    id: &str,
) -> (mpsc::UnboundedReceiver<Result<v1::ServerMessage, tonic::Status>>, String) {
    let (out_tx, out) = mpsc::unbounded_channel();
    let (reply, session) = oneshot::channel();
    let hello = v1::Hello {
        worker_id: id.into(),
        capacity: 1,
        executors: vec!["handler".into()],
        handlers: vec!["noop".into()],
        protocol_version: PROTOCOL_VERSION,
        ..Default::default()
    };
    commands.send(LeaderCommand::SessionOpen { hello: Box::new(hello), namespaces: None, outbound: out_tx, reply }).await.unwrap();
    (out, session.await.unwrap().expect("welcomed"))
}

pub(crate) async fn job_with(store: &Arc<dyn Store>, json: &str) {
    let spec = parse_job_json(json.as_bytes()).unwrap().compile().unwrap().spec;
    store.put_job(&spec, Precondition::DoesNotExist, 1_000_000).await.unwrap();
}
