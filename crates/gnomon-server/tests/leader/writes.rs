//! Store faults, triggers and job edits: no due fire, retry or trigger is lost.

use std::time::{Duration, Instant};

use gnomon_core::AttemptState;
use gnomon_core::ManualClock;
use gnomon_core::RunState;
use gnomon_proto::v1::server_message;
use gnomon_server::leader::{LeaderCommand, TriggerRequest};
use tokio::sync::oneshot;

use super::harness::*;

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

/// A store that answers a turn's write for fewer rows than it was given
/// has answered something else: the leader treats the outcome as unknown,
/// as after an error (before, the outcomes it lacked were skipped without
/// a word, and their runs' cached state stayed behind the store's). The
/// caller hears an error, the state is rebuilt, and the run that landed
/// still runs.
#[tokio::test]
async fn a_turn_write_answered_short_is_an_unknown_outcome() {
    let (_d, sqlite) = store().await;
    let clock = ManualClock::new(1_000_000);
    put(&sqlite, r#"{"name":"once","executor":{"handler":{"name":"noop"}}}"#, 1_000_000).await;
    let fence = term(&sqlite).await;
    let store = faulty(&sqlite, &clock);
    let (rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    let (mut out, _session) = open_session(&commands, "w1").await;

    // The trigger's turn writes one run and no transition: its answer
    // lacks the run's outcome.
    store.answer_next_turns_short(1);
    let (reply, ids) = oneshot::channel();
    commands
        .send(LeaderCommand::Trigger { namespace: "default".into(), name: "once".into(), request: TriggerRequest::runs(1), reply })
        .await
        .unwrap();
    let answer = ids.await.unwrap();
    assert!(answer.is_err(), "an answer short of the rows written is no answer: {answer:?}");
    assert!(store.injected() >= 1, "the answer was cut");
    let runs = sqlite.list_runs(&Default::default(), 10, None).await.unwrap().runs;
    assert_eq!(runs.len(), 1, "the write did land");
    let assigned = next_msg(
        &mut out,
        "the assignment of the run that landed, after the rebuild",
        |_| false,
        |m| match m {
            server_message::Msg::Assign(a) => Some(a.run_id.clone()),
            _ => None,
        },
    )
    .await;
    assert_eq!(assigned, runs[0].id);
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

/// A `replace` fire whose write landed unseen (the leader was told it
/// failed) still cancels the run it replaced: the rebuild finds the
/// replacing run by its reason. Before, the cancel was planned only from
/// the answer to the write, and the older run stayed pending beside it
/// until the next fire.
#[tokio::test]
async fn a_replace_fire_that_landed_unseen_still_cancels_the_older_run() {
    let (_d, sqlite) = store().await;
    let clock = ManualClock::new(1_000_000);
    let job =
        put(&sqlite, r#"{"name":"r","schedule":{"every":"1s"},"overlap":"replace","executor":{"handler":{"name":"noop"}}}"#, 1_000_000)
            .await;
    let fence = term(&sqlite).await;
    let store = faulty(&sqlite, &clock);
    let (rt, _commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    // No worker: the first fire stays pending.
    clock.set(1_001_100);
    let older = gnomon_backend::run_id(&job.uid, 1_001_000);
    let deadline = Instant::now() + Duration::from_secs(20);
    while sqlite.get_run(&older).await.unwrap().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(sqlite.get_run(&older).await.unwrap().map(|d| d.run.state), Some(RunState::Pending));
    // The next fire replaces it; its write lands, and the leader is told
    // it failed. The clock then stays short of the fire after.
    store.fail_next_writes_after_commit(1);
    clock.set(1_002_100);
    let newer = gnomon_backend::run_id(&job.uid, 1_002_000);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut state = None;
    while state != Some(RunState::Cancelled) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        state = sqlite.get_run(&older).await.unwrap().map(|d| d.run.state);
    }
    assert!(store.injected() >= 1, "the fire's write was reported failed");
    assert_eq!(state, Some(RunState::Cancelled), "the replaced run is cancelled");
    assert_eq!(sqlite.get_run(&newer).await.unwrap().map(|d| d.run.state), Some(RunState::Pending));
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
