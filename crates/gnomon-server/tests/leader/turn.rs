//! One turn, one write: a turn that fires, releases a waiting run, releases
//! a retry, takes a backfill chunk, creates a triggered run and dispatches
//! makes one fenced store write on SQLite.

use std::time::Duration;

use gnomon_backend::{AttemptChange, BackfillState, NewBackfill, NewRun, RunFilter, Transition};
use gnomon_core::{AttemptState, ManualClock, RunState};
use gnomon_server::leader::{LeaderCommand, Step, TriggerRequest};
use tokio::sync::oneshot;

use super::harness::*;

fn manual_run(uid: &str, job: &str, at: i64) -> NewRun {
    NewRun {
        job_uid: uid.into(),
        namespace: "default".into(),
        job: job.into(),
        scheduled_at: at,
        fired_at: at,
        state: RunState::Pending,
        reason: None,
        manual: true,
        key: None,
        params: None,
        payload: None,
        upstream: None,
    }
}

fn step_of(id: &str, from: (RunState, u32), to: (RunState, u32), attempt: AttemptChange, next: Option<i64>) -> Transition {
    Transition {
        run_id: id.into(),
        from: from.0,
        from_attempt: from.1,
        to: to.0,
        to_attempt: to.1,
        reason: None,
        next_attempt_at: next,
        attempt: Some(attempt),
        at: 999_500,
        notify: Vec::new(),
    }
}

async fn state_of(store: &std::sync::Arc<dyn gnomon_backend::Store>, id: &str) -> RunState {
    store.get_run(id).await.unwrap().expect("the run exists").run.state
}

#[tokio::test]
async fn a_turn_that_fires_releases_retries_backfills_triggers_and_dispatches_is_one_write() {
    let (_d, sqlite) = store().await;
    let clock = ManualClock::new(1_000_000);
    let noop = r#""executor":{"handler":{"name":"noop"}}"#;
    // Fires at 1_001_000.
    put(&sqlite, &format!(r#"{{"name":"tick","schedule":{{"every":"1s"}},{noop}}}"#), 1_000_000).await;
    let flaky = put(
        &sqlite,
        &format!(r#"{{"name":"flaky","retry":{{"max_attempts":3,"backoff":{{"initial":"1s","max":"1s","jitter":0}}}},{noop}}}"#),
        1_000_000,
    )
    .await;
    put(&sqlite, &format!(r#"{{"name":"up",{noop}}}"#), 1_000_000).await;
    put(&sqlite, &format!(r#"{{"name":"down","after":[{{"job":"up"}}],{noop}}}"#), 1_000_000).await;
    // Every minute, created at 990_000: a backfill of instants before that.
    let past = put(&sqlite, &format!(r#"{{"name":"past","schedule":{{"every":"1m"}},{noop}}}"#), 990_000).await;
    put(&sqlite, &format!(r#"{{"name":"once",{noop}}}"#), 1_000_000).await;
    let fence = term(&sqlite).await;

    // A first term makes `up`'s run and `down`'s waiting run.
    let (mut first, commands, _lost, _shut) = runtime_with_commands(sqlite.clone(), fence.clone(), clock.clone());
    let (reply, made) = oneshot::channel();
    commands
        .send(LeaderCommand::Trigger { namespace: "default".into(), name: "up".into(), request: TriggerRequest::runs(1), reply })
        .await
        .unwrap();
    for _ in 0..3 {
        assert_eq!(first.step().await, Step::Done);
    }
    let up_run = made.await.unwrap().expect("triggered").ids.remove(0);
    drop(first);
    let down_runs = sqlite.list_runs(&RunFilter { job: Some("down".into()), ..Default::default() }, 10, None).await.unwrap().runs;
    assert_eq!((down_runs.len(), down_runs[0].state), (1, RunState::Waiting));
    let down_run = down_runs[0].id.clone();
    // `up` succeeds; `flaky`'s first attempt was lost, its retry due now.
    let assign = |worker: &str| AttemptChange::Assign { attempt: 1, worker: worker.into(), token: fence.token };
    let end = |state| AttemptChange::End { attempt: 1, state, exit_code: None, output: String::new(), started_at: None };
    let retry = manual_run(&flaky.uid, "flaky", 999_000);
    let retry_id = retry.id();
    sqlite.fire(&fence, &[retry], &[]).await.unwrap();
    let applied = sqlite
        .transition(
            &fence,
            &[
                step_of(&up_run, (RunState::Pending, 0), (RunState::Assigned, 1), assign("gone"), None),
                step_of(&up_run, (RunState::Assigned, 1), (RunState::Succeeded, 1), end(AttemptState::Succeeded), None),
                step_of(&retry_id, (RunState::Pending, 0), (RunState::Assigned, 1), assign("gone"), None),
                step_of(&retry_id, (RunState::Assigned, 1), (RunState::Retrying, 1), end(AttemptState::Lost), Some(1_000_500)),
            ],
        )
        .await
        .unwrap();
    assert_eq!(applied, vec![true; 4]);
    let backfill = NewBackfill {
        id: "bf-1".into(),
        namespace: "default".into(),
        job: "past".into(),
        job_uid: past.uid.clone(),
        from: 60_000,
        to: 600_000,
        params: None,
        rate: 100,
        total: 10,
    };
    sqlite.create_backfill(&backfill, 1_000_000).await.unwrap();

    // A new term at 1_001_000: everything above is due in its first turn.
    clock.set(1_001_000);
    let store = faulty(&sqlite, &clock);
    let (mut rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    // A worker says Hello, and a trigger waits, before the turn.
    let session = tokio::spawn({
        let commands = commands.clone();
        async move { open_session(&commands, "w1").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (reply, triggered) = oneshot::channel();
    commands
        .send(LeaderCommand::Trigger { namespace: "default".into(), name: "once".into(), request: TriggerRequest::runs(1), reply })
        .await
        .unwrap();
    let before = store.writes();
    assert_eq!(rt.step().await, Step::Done);
    assert_eq!(store.writes() - before, 1, "the turn made one store write");

    // And that write did all of it.
    let (_out, _session_id) = session.await.unwrap();
    let once = triggered.await.unwrap().expect("the trigger's run").ids.remove(0);
    assert!(matches!(state_of(&sqlite, &once).await, RunState::Pending | RunState::Assigned));
    assert_eq!(instants(&sqlite, "tick").await, vec![1_001_000], "tick fired");
    assert!(matches!(state_of(&sqlite, &down_run).await, RunState::Pending | RunState::Assigned), "down released");
    assert!(matches!(state_of(&sqlite, &retry_id).await, RunState::Pending | RunState::Assigned), "the retry released");
    let bf = sqlite.get_backfill("bf-1").await.unwrap().unwrap();
    assert_eq!((bf.state, bf.created), (BackfillState::Done, 10), "the backfill's chunk and its progress");
    assert_eq!(instants(&sqlite, "past").await.len(), 10);
    let all = sqlite.list_runs(&RunFilter::default(), 100, None).await.unwrap().runs;
    assert_eq!(all.iter().filter(|r| r.state == RunState::Assigned).count(), 1, "the worker's one slot was filled");

    // Turns with nothing to do (the slot is full, nothing is due) write
    // nothing.
    let before = store.writes();
    assert_eq!(rt.step().await, Step::Done);
    assert_eq!(rt.step().await, Step::Done);
    assert_eq!(store.writes() - before, 0);
}
