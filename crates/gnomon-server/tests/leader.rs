//! Leader runtime: step-down on loss (invariant 5) and on being fenced
//! (invariant 2), with an injected clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gnomon_backend::sqlite::SqliteStore;
use gnomon_backend::{Fence, LeaderInfo, Precondition, Store};
use gnomon_core::spec::parse_job_json;
use gnomon_core::AttemptState;
use gnomon_core::ManualClock;
use gnomon_core::RunState;
use gnomon_proto::v1::{self, server_message, worker_message};
use gnomon_proto::PROTOCOL_VERSION;
use gnomon_server::leader::{LeaderCommand, LeaderConfig, LeaderExit, LeaderParts, LeaderRuntime, TriggerRequest};
use tokio::sync::{mpsc, oneshot, watch};

#[path = "sim/store.rs"]
#[allow(dead_code)]
mod faulty;

async fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("g.db").display());
    (dir, Arc::new(SqliteStore::open(&url).await.unwrap()))
}

async fn term(store: &Arc<dyn Store>) -> Fence {
    let token = store.next_epoch("scheduler").await.unwrap();
    let fence = Fence { scope: "scheduler".into(), token };
    store.fence(&fence, &LeaderInfo::default(), 0).await.unwrap();
    fence
}

/// A job that fires every second.
async fn every_second_job(store: &Arc<dyn Store>) {
    let spec = parse_job_json(br#"{"name":"tick","schedule":{"every":"1s"},"executor":{"handler":{"name":"noop"}}}"#)
        .unwrap()
        .compile()
        .unwrap()
        .spec;
    store.put_job(&spec, Precondition::DoesNotExist, 1_000_000).await.unwrap();
}

fn runtime(store: Arc<dyn Store>, fence: Fence, clock: ManualClock) -> (LeaderRuntime, watch::Sender<bool>, watch::Sender<bool>) {
    let (rt, commands, lost, shut) = runtime_with_commands(store, fence, clock);
    std::mem::forget(commands);
    (rt, lost, shut)
}

/// The runtime and the sender of its command channel (sessions, triggers).
fn runtime_with_commands(
    store: Arc<dyn Store>,
    fence: Fence,
    clock: ManualClock,
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
    });
    (rt, cmd_tx, lost_tx, shut_tx)
}

#[tokio::test]
async fn leader_loops_stop_within_a_second_of_loss() {
    let (_d, store) = store().await;
    let fence = term(&store).await;
    let (rt, lost, _shut) = runtime(store, fence, ManualClock::new(1_000_000));
    let task = tokio::spawn(rt.run());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    lost.send(true).unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops").unwrap();
    assert_eq!(exit, LeaderExit::Lost);
    assert!(t0.elapsed() < Duration::from_secs(1), "stopped after {:?}", t0.elapsed());
}

#[tokio::test]
async fn a_fenced_leader_steps_down_and_writes_nothing() {
    let (_d, store) = store().await;
    let clock = ManualClock::new(1_000_000);
    every_second_job(&store).await;
    let old = term(&store).await;
    let (rt, _lost, _shut) = runtime(store.clone(), old, clock.clone());
    let task = tokio::spawn(rt.run());
    // The leader fires while it holds the current token.
    clock.advance(3_000);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let before = store.list_runs(&Default::default(), 1000, None).await.unwrap().runs.len();
    assert!(before >= 3, "fired {before} runs");
    // A newer term fences it out; its next write fails and it stops.
    term(&store).await;
    clock.advance(5_000);
    let exit = tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops").unwrap();
    assert_eq!(exit, LeaderExit::Fenced);
    let after = store.list_runs(&Default::default(), 1000, None).await.unwrap().runs.len();
    assert_eq!(after, before, "no run was created under the stale token");
}

/// A partitioned database answers nothing: a leader whose store call hangs
/// must still step down the moment its elector says it lost. Here the call
/// hangs on SQLite's write lock, held by another connection for longer than
/// the test waits (the store's busy timeout is 10 s).
#[tokio::test]
async fn a_leader_blocked_in_a_store_call_steps_down_on_loss() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&format!("sqlite://{}", path.display())).await.unwrap());
    let clock = ManualClock::new(1_000_000);
    every_second_job(&store).await;
    let fence = term(&store).await;
    let (rt, lost, _shut) = runtime(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Another connection takes the write lock; the leader's next fire blocks.
    let mut blocker = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display())).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut blocker).await.unwrap();
    clock.advance(3_000);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished());
    lost.send(true).unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(6), task).await.expect("stepped down while its store call still hung").unwrap();
    assert_eq!(exit, LeaderExit::Lost);
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
}

/// The next message on a session's outbound queue that `pick` accepts;
/// panics on one that `forbid` matches first, or after 10 s.
async fn next_msg<T>(
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

fn heartbeat(seq: u64, attempts: &[(&str, u32)]) -> worker_message::Msg {
    worker_message::Msg::Heartbeat(v1::Heartbeat {
        seq,
        attempts: attempts.iter().map(|(r, a)| v1::AttemptRef { run_id: r.to_string(), attempt: *a }).collect(),
        ..Default::default()
    })
}

/// An attempt the leader has a live worker holding, but that the worker's
/// heartbeats do not list (its assignment never reached it), is ended
/// `lost` and retried, and the worker is told to drop it should it turn up;
/// while the heartbeats list it, nothing happens.
#[tokio::test]
async fn an_assignment_a_live_worker_does_not_hold_is_ended_lost_and_retried() {
    let (_d, store) = store().await;
    let clock = ManualClock::new(1_000_000);
    let spec = parse_job_json(
        br#"{"name":"once","retry":{"max_attempts":2,"backoff":{"initial":"1s","max":"1s","jitter":0}},"executor":{"handler":{"name":"noop"}}}"#,
    )
    .unwrap()
    .compile()
    .unwrap()
    .spec;
    store.put_job(&spec, Precondition::DoesNotExist, 1_000_000).await.unwrap();
    let fence = term(&store).await;
    let (rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());

    let (mut out, session) = open_session(&commands, "w1").await;
    let (reply, ids) = oneshot::channel();
    commands
        .send(LeaderCommand::Trigger { namespace: "default".into(), name: "once".into(), request: TriggerRequest::runs(1), reply })
        .await
        .unwrap();
    let run = ids.await.unwrap().unwrap().ids.remove(0);
    let is_abort = |m: &server_message::Msg| matches!(m, server_message::Msg::Abort(_));
    let assigned = next_msg(&mut out, "the assignment", is_abort, |m| match m {
        server_message::Msg::Assign(a) => Some(a.attempt),
        _ => None,
    })
    .await;
    assert_eq!(assigned, 1);
    let send = |msg| {
        let commands = commands.clone();
        let session = session.clone();
        async move { commands.send(LeaderCommand::FromWorker { session, msg }).await.unwrap() }
    };
    let acked = |seq: u64| {
        move |m: &server_message::Msg| match m {
            server_message::Msg::Ack(a) if a.heartbeat_seq == Some(seq) => Some(()),
            _ => None,
        }
    };

    // Heartbeats that list the attempt: it stays assigned.
    clock.advance(2_500);
    for seq in 1..=4 {
        send(heartbeat(seq, &[(&run, 1)])).await;
        next_msg(&mut out, "a heartbeat ack", is_abort, acked(seq)).await;
    }
    let detail = store.get_run(&run).await.unwrap().unwrap();
    assert_eq!((detail.run.state, detail.run.attempt), (RunState::Assigned, 1), "{detail:?}");

    // One heartbeat without it is not enough (a report may be on its way)…
    send(heartbeat(5, &[])).await;
    next_msg(&mut out, "a heartbeat ack", is_abort, acked(5)).await;
    send(heartbeat(6, &[(&run, 1)])).await;
    next_msg(&mut out, "a heartbeat ack", is_abort, acked(6)).await;
    assert_eq!(store.get_run(&run).await.unwrap().unwrap().run.state, RunState::Assigned);
    // …two in a row are: attempt 1 ends lost and the worker is told to drop it.
    send(heartbeat(7, &[])).await;
    send(heartbeat(8, &[])).await;
    let aborted = next_msg(
        &mut out,
        "the abort",
        |_| false,
        |m| match m {
            server_message::Msg::Abort(a) => Some((a.run_id.clone(), a.attempt)),
            _ => None,
        },
    )
    .await;
    assert_eq!(aborted, (run.clone(), 1));
    let detail = store.get_run(&run).await.unwrap().unwrap();
    assert_eq!(detail.run.state, RunState::Retrying, "{detail:?}");
    assert_eq!(detail.attempts[0].state, AttemptState::Lost, "{detail:?}");

    // The retry goes out after its backoff, as attempt 2, and its report is
    // recorded as usual.
    clock.advance(1_500);
    let retried = next_msg(&mut out, "the retry", is_abort, |m| match m {
        server_message::Msg::Assign(a) => Some(a.attempt),
        _ => None,
    })
    .await;
    assert_eq!(retried, 2);
    let now = 1_000_000 + 4_000;
    send(worker_message::Msg::Report(v1::Report {
        run_id: run.clone(),
        attempt: 2,
        outcome: v1::Outcome::Succeeded as i32,
        started_at_ms: now,
        ended_at_ms: now,
        ..Default::default()
    }))
    .await;
    next_msg(&mut out, "the report's ack", is_abort, |m| match m {
        server_message::Msg::Ack(a) if a.report.as_ref().is_some_and(|r| r.run_id == run) => Some(()),
        _ => None,
    })
    .await;
    let detail = store.get_run(&run).await.unwrap().unwrap();
    assert_eq!(detail.run.state, RunState::Succeeded, "{detail:?}");
    let states: Vec<AttemptState> = detail.attempts.iter().map(|a| a.state).collect();
    assert_eq!(states, vec![AttemptState::Lost, AttemptState::Succeeded]);
    task.abort();
}

/// A store that fails only when told to.
fn faulty(sqlite: &Arc<dyn Store>, clock: &ManualClock) -> Arc<faulty::FaultyStore> {
    use rand::SeedableRng;
    let rates = faulty::FaultRates { write_before: 0.0, write_after: 0.0, read: 0.0, delay: 0.0, max_delay_ms: 1 };
    Arc::new(faulty::FaultyStore::new(sqlite.clone(), clock.clone(), rand::rngs::StdRng::seed_from_u64(1), rates))
}

async fn put(store: &Arc<dyn Store>, json: &str, at: i64) -> gnomon_backend::JobRecord {
    let spec = parse_job_json(json.as_bytes()).unwrap().compile().unwrap().spec;
    store.put_job(&spec, Precondition::None, at).await.unwrap()
}

/// The non-manual instants of a job that have a record (a run or a skip).
async fn instants(store: &Arc<dyn Store>, job: &str) -> Vec<i64> {
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
async fn instants_once(store: &Arc<dyn Store>, job: &str, n: usize) -> Vec<i64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = instants(store, job).await;
    while got.len() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        got = instants(store, job).await;
    }
    got
}

async fn advance(clock: &ManualClock, n: usize, ms: i64) {
    for _ in 0..n {
        clock.advance(ms);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A store write that fails must not cost a due job its timer or a
/// retrying run its retry: the leader rebuilds its state from the store
/// and carries on (before, the turn dropped the fire chunk it had taken off
/// the timer heap when the retry release failed, and the retry with it).
#[tokio::test]
async fn failed_writes_lose_no_due_fire_and_no_retry() {
    use gnomon_backend::{AttemptChange, NewRun, Transition};
    let (_d, sqlite) = store().await;
    let clock = ManualClock::new(1_000_000);
    every_second_job(&sqlite).await;
    let flaky = put(
        &sqlite,
        r#"{"name":"flaky","retry":{"max_attempts":3,"backoff":{"initial":"1s","max":"1s","jitter":0}},"executor":{"handler":{"name":"noop"}}}"#,
        1_000_000,
    )
    .await;
    let fence = term(&sqlite).await;
    // A run of `flaky` whose first attempt was lost: retrying at 1_002_000.
    let run = NewRun {
        job_uid: flaky.uid.clone(),
        namespace: "default".into(),
        job: "flaky".into(),
        scheduled_at: 999_000,
        fired_at: 999_000,
        state: RunState::Pending,
        reason: None,
        manual: true,
        key: None,
        params: None,
        payload: None,
        upstream: None,
    };
    let id = run.id();
    sqlite.fire(&fence, &[run], &[]).await.unwrap();
    let t = |from, fa, to, ta, attempt, next| Transition {
        run_id: id.clone(),
        from,
        from_attempt: fa,
        to,
        to_attempt: ta,
        reason: None,
        next_attempt_at: next,
        attempt: Some(attempt),
        at: 999_500,
        notify: Vec::new(),
    };
    let assign = AttemptChange::Assign { attempt: 1, worker: "gone".into(), token: fence.token };
    let end = AttemptChange::End { attempt: 1, state: AttemptState::Lost, exit_code: None, output: String::new(), started_at: None };
    let applied = sqlite
        .transition(
            &fence,
            &[
                t(RunState::Pending, 0, RunState::Assigned, 1, assign, None),
                t(RunState::Assigned, 1, RunState::Retrying, 1, end, Some(1_002_000)),
            ],
        )
        .await
        .unwrap();
    assert_eq!(applied, vec![true, true]);

    let store = faulty(&sqlite, &clock);
    let (rt, _lost, _shut) = runtime(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The turn that fires `tick` and releases the retry meets failing writes.
    store.fail_next_writes(4);
    clock.set(1_002_200);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    advance(&clock, 8, 500).await;
    let want: Vec<i64> = (1..=6).map(|s| 1_000_000 + s * 1000).collect();
    assert_eq!(instants_once(&sqlite, "tick", want.len()).await, want, "every second fired once");
    let state = sqlite.get_run(&id).await.unwrap().unwrap().run.state;
    assert_eq!(state, RunState::Pending, "the retry was released (no worker to take it)");
    assert!(store.injected() >= 4, "the writes did fail");
    task.abort();
}

/// A manual trigger whose write landed although the leader was told it
/// failed (a connection lost during the commit): the client gets an error,
/// and the run that exists still runs (before, it stayed `pending` for the
/// rest of the term: the leader never tracked it).
#[tokio::test]
async fn a_trigger_whose_write_landed_unseen_still_runs() {
    let (_d, sqlite) = store().await;
    let clock = ManualClock::new(1_000_000);
    put(&sqlite, r#"{"name":"once","executor":{"handler":{"name":"noop"}}}"#, 1_000_000).await;
    let fence = term(&sqlite).await;
    let store = faulty(&sqlite, &clock);
    let (rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    let (mut out, _session) = open_session(&commands, "w1").await;

    store.fail_next_writes_after_commit(1);
    let (reply, ids) = oneshot::channel();
    commands
        .send(LeaderCommand::Trigger { namespace: "default".into(), name: "once".into(), request: TriggerRequest::runs(1), reply })
        .await
        .unwrap();
    assert!(ids.await.unwrap().is_err(), "the leader could not know the outcome");
    let runs = sqlite.list_runs(&Default::default(), 10, None).await.unwrap().runs;
    assert_eq!(runs.len(), 1, "the write did land");
    let run = runs[0].id.clone();
    let assigned = next_msg(
        &mut out,
        "the assignment of the run that landed",
        |_| false,
        |m| match m {
            server_message::Msg::Assign(a) => Some(a.run_id.clone()),
            _ => None,
        },
    )
    .await;
    assert_eq!(assigned, run);
    task.abort();
}

/// Re-applying a job (same schedule) never drops an instant that is due
/// but not yet fired, whatever the writer's clock says: at the instant
/// itself, or far ahead of the leader (before, both dropped instants: the
/// new version's timeline started at its `updated_at`).
#[tokio::test]
async fn re_applying_a_job_drops_no_due_instant() {
    let (_d, sqlite) = store().await;
    let clock = ManualClock::new(1_000_000);
    let json = r#"{"name":"tick","schedule":{"every":"1s"},"executor":{"handler":{"name":"noop"}}}"#;
    put(&sqlite, json, 1_000_000).await;
    let fence = term(&sqlite).await;
    let (rt, _lost, _shut) = runtime(sqlite.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    advance(&clock, 1, 500).await;
    // A replica stamps the re-apply at the due instant, before the leader
    // has fired it…
    put(&sqlite, json, 1_001_000).await;
    advance(&clock, 3, 500).await;
    // …and one whose clock is 9 s ahead.
    put(&sqlite, json, clock_now(&clock) + 9_000).await;
    advance(&clock, 8, 500).await;
    let want: Vec<i64> = (1..=6).map(|s| 1_000_000 + s * 1000).collect();
    assert_eq!(instants_once(&sqlite, "tick", want.len()).await, want);
    task.abort();
}

fn clock_now(clock: &ManualClock) -> i64 {
    use gnomon_core::Clock;
    clock.now_millis()
}

/// A `pending` run cancelled through the API no longer counts as open for
/// `forbid`: the next scheduled time fires instead of being skipped.
#[tokio::test]
async fn a_cancelled_pending_run_does_not_block_forbid() {
    let (_d, sqlite) = store().await;
    let clock = ManualClock::new(1_000_000);
    put(&sqlite, r#"{"name":"tick","schedule":{"every":"1s"},"overlap":"forbid","executor":{"handler":{"name":"noop"}}}"#, 1_000_000).await;
    let fence = term(&sqlite).await;
    let (rt, commands, _lost, _shut) = runtime_with_commands(sqlite.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    // No worker: the first fire stays pending, the next are skipped.
    advance(&clock, 5, 500).await;
    let filter = gnomon_backend::RunFilter { job: Some("tick".into()), ..Default::default() };
    // A loaded machine may record the skips a little after the last step.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut runs = sqlite.list_runs(&filter, 100, None).await.unwrap().runs;
    while !runs.iter().any(|r| r.state == RunState::Skipped) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        runs = sqlite.list_runs(&filter, 100, None).await.unwrap().runs;
    }
    let pending: Vec<_> = runs.iter().filter(|r| r.state == RunState::Pending).collect();
    assert_eq!(pending.len(), 1, "{runs:?}");
    let blocker = pending[0].id.clone();
    assert!(runs.iter().any(|r| r.state == RunState::Skipped), "{runs:?}");
    // The API cancels it (and tells this node's leader).
    sqlite.request_cancel(&blocker, clock_now(&clock)).await.unwrap();
    commands.send(LeaderCommand::RunChanged { run_id: blocker.clone() }).await.unwrap();
    advance(&clock, 3, 500).await;
    let runs = sqlite.list_runs(&filter, 100, None).await.unwrap().runs;
    let pending: Vec<_> = runs.iter().filter(|r| r.state == RunState::Pending).map(|r| r.id.clone()).collect();
    assert_eq!(pending.len(), 1, "the next time fired: {runs:?}");
    assert_ne!(pending[0], blocker);
    task.abort();
}

/// A manual run never shares an id with a scheduled fire, whatever the
/// schedule becomes: runs triggered ahead of the clock (a bulk trigger
/// takes now, now+1 ms, …) and then a schedule change that fires at one of
/// their instants. Before, the manual runs avoided only the schedule of
/// their day, and the new schedule's fire met a manual run's id and was
/// swallowed by it.
#[tokio::test]
async fn a_schedule_change_cannot_land_on_a_manual_run() {
    let (_d, sqlite) = store().await;
    let clock = ManualClock::new(1_000_000);
    put(&sqlite, r#"{"name":"j","schedule":{"every":"7s"},"executor":{"handler":{"name":"noop"}}}"#, 1_000_000).await;
    let fence = term(&sqlite).await;
    let (rt, commands, _lost, _shut) = runtime_with_commands(sqlite.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    let (reply, ids) = oneshot::channel();
    commands
        .send(LeaderCommand::Trigger { namespace: "default".into(), name: "j".into(), request: TriggerRequest::runs(2500), reply })
        .await
        .unwrap();
    let ids = ids.await.unwrap().expect("triggered");
    assert_eq!(ids.ids.len(), 2500);
    // Every second, from the change on (1_000_000): 1_002_000 is also the
    // instant of one of the manual runs.
    put(&sqlite, r#"{"name":"j","schedule":{"every":"1s"},"executor":{"handler":{"name":"noop"}}}"#, 1_000_000).await;
    advance(&clock, 10, 500).await;
    let got = instants(&sqlite, "j").await;
    let want: Vec<i64> = (1..=5).map(|s| 1_000_000 + s * 1000).collect();
    assert_eq!(got, want, "every second fired once, as a scheduled run");
    let filter = gnomon_backend::RunFilter { job: Some("j".into()), ..Default::default() };
    let mut runs = Vec::new();
    let mut cursor = None;
    loop {
        let page = sqlite.list_runs(&filter, 1000, cursor).await.unwrap();
        runs.extend(page.runs);
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    let manual: Vec<i64> = runs.iter().filter(|r| r.manual).map(|r| r.scheduled_at).collect();
    assert_eq!(manual.len(), 2500, "every manual run is there");
    assert!(manual.contains(&1_002_000), "a manual run shares its instant with a scheduled one");
    let ids: std::collections::HashSet<&str> = runs.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids.len(), runs.len(), "run ids are unique");
    task.abort();
}

/// A schedule change that a leader never saw (it was written while no
/// leader ran, or just before a failover): the new leader fires what the
/// old schedule had due up to the change, under the old schedule, and the
/// new schedule from the change on, as a leader that saw it does. Before,
/// the new leader replayed the whole gap from the last fire under the new
/// schedule (and never fired the old schedule's due time).
#[tokio::test]
async fn a_schedule_change_no_leader_saw_keeps_both_timelines() {
    let (_d, sqlite) = store().await;
    let clock = ManualClock::new(1_000_000);
    put(&sqlite, r#"{"name":"j","schedule":{"every":"2s"},"executor":{"handler":{"name":"noop"}}}"#, 1_000_000).await;
    let (rt, _lost, _shut) = runtime(sqlite.clone(), term(&sqlite).await, clock.clone());
    let first = tokio::spawn(rt.run());
    advance(&clock, 9, 500).await;
    first.abort();
    let _ = first.await;
    assert_eq!(instants(&sqlite, "j").await, vec![1_002_000, 1_004_000], "the first term's fires");
    // No leader from 1_004_500: 1_006_000 falls due under the old schedule,
    // then the schedule changes at 1_007_000.
    clock.set(1_007_000);
    let changed = put(&sqlite, r#"{"name":"j","schedule":{"every":"3s"},"executor":{"handler":{"name":"noop"}}}"#, 1_007_000).await;
    assert_eq!(changed.schedule_changed_at, Some(1_007_000));
    assert_eq!(changed.previous_schedule.and_then(|s| s.every).as_deref(), Some("2s"));
    clock.set(1_008_500);
    let (rt, _lost, _shut) = runtime(sqlite.clone(), term(&sqlite).await, clock.clone());
    let second = tokio::spawn(rt.run());
    advance(&clock, 8, 500).await;
    let got = instants(&sqlite, "j").await;
    assert_eq!(got, vec![1_002_000, 1_004_000, 1_006_000, 1_008_000, 1_011_000], "old schedule up to the change, new one after");
    second.abort();
}

/// Opens a worker session for a `noop`-handler worker.
async fn open_session(
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

async fn job_with(store: &Arc<dyn Store>, json: &str) {
    let spec = parse_job_json(json.as_bytes()).unwrap().compile().unwrap().spec;
    store.put_job(&spec, Precondition::DoesNotExist, 1_000_000).await.unwrap();
}

/// A worker that keeps listing an attempt and never reports does not hold
/// its run `running` forever: past the job's timeout and the grace, the
/// leader ends the attempt `timed_out` and tells the worker to stop it.
#[tokio::test]
async fn an_attempt_that_overruns_its_timeout_is_ended_by_the_leader() {
    let (_d, store) = store().await;
    let clock = ManualClock::new(1_000_000);
    job_with(&store, r#"{"name":"slow","timeout":"2s","executor":{"handler":{"name":"noop"}}}"#).await;
    let fence = term(&store).await;
    let (rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    let (mut out, session) = open_session(&commands, "w1").await;
    let (reply, ids) = oneshot::channel();
    commands
        .send(LeaderCommand::Trigger { namespace: "default".into(), name: "slow".into(), request: TriggerRequest::runs(1), reply })
        .await
        .unwrap();
    let run = ids.await.unwrap().unwrap().ids.remove(0);
    let never = |_: &server_message::Msg| false;
    next_msg(&mut out, "the assignment", never, |m| matches!(m, server_message::Msg::Assign(_)).then_some(())).await;
    let send = |msg| {
        let (commands, session) = (commands.clone(), session.clone());
        async move { commands.send(LeaderCommand::FromWorker { session, msg }).await.unwrap() }
    };
    send(worker_message::Msg::Started(v1::Started { run_id: run.clone(), attempt: 1, started_at_ms: 1_000_000 })).await;
    let grace = gnomon_server::leader::OVERRUN_GRACE_MS + LeaderConfig::default().lease_ttl_ms;
    // Heartbeats that list the attempt keep the session alive, past the
    // timeout, up to just before the grace ends: nothing happens.
    let mut seq = 0;
    while clock_now(&clock) < 1_000_000 + 2_000 + grace - 2_000 {
        clock.advance(1_000);
        seq += 1;
        send(heartbeat(seq, &[(&run, 1)])).await;
        next_msg(
            &mut out,
            "a heartbeat ack",
            |m| matches!(m, server_message::Msg::Abort(_)),
            |m| match m {
                server_message::Msg::Ack(a) if a.heartbeat_seq == Some(seq) => Some(()),
                _ => None,
            },
        )
        .await;
    }
    assert_eq!(store.get_run(&run).await.unwrap().unwrap().run.state, RunState::Running);
    // Past it: ended timed out, and the worker is told to stop.
    for _ in 0..4 {
        clock.advance(1_000);
        seq += 1;
        send(heartbeat(seq, &[(&run, 1)])).await;
    }
    let reason = next_msg(&mut out, "the abort", never, |m| match m {
        server_message::Msg::Abort(a) if a.run_id == run => Some(a.reason.clone()),
        _ => None,
    })
    .await;
    assert!(reason.contains("overran"), "{reason}");
    let detail = store.get_run(&run).await.unwrap().unwrap();
    assert_eq!(detail.run.state, RunState::Failed, "{detail:?}");
    assert_eq!(detail.attempts[0].state, AttemptState::TimedOut, "{detail:?}");
    assert!(detail.attempts[0].output.contains("ended by the leader"), "{detail:?}");
    task.abort();
}

/// Only the worker holding an attempt may start or end it.
#[tokio::test]
async fn another_worker_cannot_start_or_end_an_attempt() {
    let (_d, store) = store().await;
    let clock = ManualClock::new(1_000_000);
    job_with(&store, r#"{"name":"one","executor":{"handler":{"name":"noop"}}}"#).await;
    let fence = term(&store).await;
    let (rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    let (mut out1, s1) = open_session(&commands, "w1").await;
    let (reply, ids) = oneshot::channel();
    commands
        .send(LeaderCommand::Trigger { namespace: "default".into(), name: "one".into(), request: TriggerRequest::runs(1), reply })
        .await
        .unwrap();
    let run = ids.await.unwrap().unwrap().ids.remove(0);
    next_msg(&mut out1, "the assignment", |_| false, |m| matches!(m, server_message::Msg::Assign(_)).then_some(())).await;
    let (mut out2, s2) = open_session(&commands, "w2").await;
    let from = |session: String, msg| {
        let commands = commands.clone();
        async move { commands.send(LeaderCommand::FromWorker { session, msg }).await.unwrap() }
    };
    from(s2.clone(), worker_message::Msg::Started(v1::Started { run_id: run.clone(), attempt: 1, started_at_ms: 1_000_000 })).await;
    from(
        s2.clone(),
        worker_message::Msg::Report(v1::Report {
            run_id: run.clone(),
            attempt: 1,
            outcome: v1::Outcome::Succeeded as i32,
            started_at_ms: 1_000_000,
            ended_at_ms: 1_000_000,
            ..Default::default()
        }),
    )
    .await;
    clock.advance(100);
    let rejected = next_msg(
        &mut out2,
        "the report's answer",
        |_| false,
        |m| match m {
            server_message::Msg::Ack(a) if a.report.is_some() => Some(a.rejected_reason.clone()),
            _ => None,
        },
    )
    .await;
    assert!(!rejected.is_empty(), "the intruder's report is rejected");
    // A heartbeat round trip: the events above have been through a turn.
    clock.advance(100);
    from(s1.clone(), heartbeat(1, &[(&run, 1)])).await;
    next_msg(&mut out1, "an ack", |_| false, |m| matches!(m, server_message::Msg::Ack(a) if a.heartbeat_seq == Some(1)).then_some(()))
        .await;
    let detail = store.get_run(&run).await.unwrap().unwrap();
    assert_eq!(detail.run.state, RunState::Assigned, "{detail:?}");
    assert_eq!(detail.attempts[0].started_at, None, "{detail:?}");
    // The holder's own start counts.
    from(s1, worker_message::Msg::Started(v1::Started { run_id: run.clone(), attempt: 1, started_at_ms: 1_000_050 })).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.get_run(&run).await.unwrap().unwrap().run.state != RunState::Running {
        assert!(Instant::now() < deadline, "the holder's start is recorded");
        clock.advance(10);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
}

/// A run whose first attempt is handed out more than `late_after` past its
/// time raises `late` (written with the assignment); one on time does not.
#[tokio::test]
async fn a_run_assigned_past_late_after_raises_a_late_notification() {
    let (_d, store) = store().await;
    let clock = ManualClock::new(1_000_000);
    let notify = r#""notify":[{"on":["late","failed"],"late_after":"5s","webhook":{"url":"http://127.0.0.1:9/hook"}}]"#;
    job_with(&store, &format!(r#"{{"name":"late","executor":{{"handler":{{"name":"noop"}}}},{notify}}}"#)).await;
    let fence = term(&store).await;
    let (rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    let trigger = |commands: mpsc::Sender<LeaderCommand>| async move {
        let (reply, ids) = oneshot::channel();
        commands
            .send(LeaderCommand::Trigger { namespace: "default".into(), name: "late".into(), request: TriggerRequest::runs(1), reply })
            .await
            .unwrap();
        ids.await.unwrap().unwrap().ids.remove(0)
    };
    // No worker yet: the run waits, 10 s.
    let waited = trigger(commands.clone()).await;
    clock.advance(10_000);
    let (mut out, session) = open_session(&commands, "w1").await;
    let assigned =
        |run: String| move |m: &server_message::Msg| matches!(m, server_message::Msg::Assign(a) if a.run_id == run).then_some(());
    next_msg(&mut out, "the late run's assignment", |_| false, assigned(waited.clone())).await;
    let notes = store.run_notifications(&waited).await.unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!((notes[0].outcome.as_str(), notes[0].id.clone()), ("late", format!("{waited}/late/0")));
    assert_eq!(notes[0].created_at, 1_010_000, "raised when it was handed out");
    // Its slot freed, a run triggered now is handed out on time: no notice.
    commands
        .send(LeaderCommand::FromWorker {
            session: session.clone(),
            msg: worker_message::Msg::Report(v1::Report {
                run_id: waited.clone(),
                attempt: 1,
                outcome: v1::Outcome::Succeeded as i32,
                started_at_ms: 1_010_000,
                ended_at_ms: 1_010_001,
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let prompt = trigger(commands.clone()).await;
    next_msg(&mut out, "the prompt run's assignment", |_| false, assigned(prompt.clone())).await;
    assert!(store.run_notifications(&prompt).await.unwrap().is_empty(), "on time: no notice");
    task.abort();
}

/// A webhook's run records its call's payload and the params the payload
/// set, and its worker is assigned both; a repeat of its key with another
/// payload is refused and creates nothing; a job that takes no webhook
/// calls gets no webhook run.
#[tokio::test]
async fn a_webhook_run_carries_its_payload_to_its_worker() {
    use gnomon_server::leader::{Origin, TriggerError};
    let (_d, store) = store().await;
    let clock = ManualClock::new(1_000_000);
    job_with(
        &store,
        r#"{"name":"hooked","executor":{"handler":{"name":"noop"}},"params":{"branch":{"default":"main"}},
            "triggers":{"webhook":{"secret_env":"GNOMON_HOOK_SECRET_T","params":{"branch":"/ref"}}}}"#,
    )
    .await;
    job_with(&store, r#"{"name":"plain","executor":{"handler":{"name":"noop"}}}"#).await;
    let fence = term(&store).await;
    let (rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    let (mut out, _session) = open_session(&commands, "w1").await;
    let payload = r#"{"ref":"release-7","n":1}"#;
    let call = |name: &str, payload: &str| {
        let params = [("branch".to_string(), serde_json::json!("release-7"))].into_iter().collect();
        let request =
            TriggerRequest { count: 1, key: Some("delivery-1".into()), params, payload: Some(payload.into()), origin: Origin::Webhook };
        let (commands, name) = (commands.clone(), name.to_string());
        async move {
            let (reply, answer) = oneshot::channel();
            commands.send(LeaderCommand::Trigger { namespace: "default".into(), name, request, reply }).await.unwrap();
            answer.await.unwrap()
        }
    };
    let first = call("hooked", payload).await.unwrap();
    assert!(!first.existed);
    let id = first.ids[0].clone();
    let assign = next_msg(
        &mut out,
        "the assignment",
        |_| false,
        |m| match m {
            server_message::Msg::Assign(a) => Some(a.clone()),
            _ => None,
        },
    )
    .await;
    assert_eq!((assign.run_id.as_str(), assign.payload.as_str()), (id.as_str(), payload));
    assert_eq!(assign.params_json, r#"{"branch":"release-7"}"#);
    let run = store.get_run(&id).await.unwrap().unwrap().run;
    assert_eq!(run.payload.as_deref(), Some(payload));
    assert_eq!(run.reason.as_deref(), Some("webhook"));
    // The same key and payload: the same run; another payload: refused.
    let again = call("hooked", payload).await.unwrap();
    assert!(again.existed && again.ids == vec![id.clone()], "{again:?}");
    let other = call("hooked", r#"{"ref":"release-7","n":2}"#).await.unwrap_err();
    assert!(matches!(other, TriggerError::KeyReused { .. }), "{other:?}");
    assert!(matches!(call("plain", payload).await.unwrap_err(), TriggerError::NoWebhook));
    let all = store.list_runs(&Default::default(), 100, None).await.unwrap();
    assert_eq!(all.runs.len(), 1, "nothing else was created: {:?}", all.runs);
    task.abort();
}
