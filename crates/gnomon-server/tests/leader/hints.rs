//! What a failed attempt asks of its retry (an SDK handler's
//! `NonRetryable`, `RetryAfter`), and the output a worker streams while
//! its attempt runs.

use std::sync::Arc;

use gnomon_backend::Store;
use gnomon_core::{AttemptState, ManualClock, RunState};
use gnomon_proto::v1::{self, server_message, worker_message};
use gnomon_server::leader::{LeaderCommand, TriggerRequest};
use tokio::sync::{mpsc, oneshot};

use crate::harness::*;

type Out = mpsc::UnboundedReceiver<Result<v1::ServerMessage, tonic::Status>>;

/// Triggers the job and takes the assignment of its run's `attempt`.
async fn trigger(commands: &mpsc::Sender<LeaderCommand>, out: &mut Out, job: &str) -> String {
    let (reply, ids) = oneshot::channel();
    commands
        .send(LeaderCommand::Trigger { namespace: "default".into(), name: job.into(), request: TriggerRequest::runs(1), reply })
        .await
        .unwrap();
    let run = ids.await.unwrap().unwrap().ids.remove(0);
    assigned(out, &run, 1).await;
    run
}

async fn assigned(out: &mut Out, run: &str, attempt: u32) {
    next_msg(
        out,
        "the assignment",
        |_| false,
        |m| matches!(m, server_message::Msg::Assign(a) if a.run_id == run && a.attempt == attempt).then_some(()),
    )
    .await;
}

fn failed(run: &str, attempt: u32, at: i64, no_retry: bool, retry_after_ms: u64) -> worker_message::Msg {
    worker_message::Msg::Report(v1::Report {
        run_id: run.into(),
        attempt,
        outcome: v1::Outcome::Failed as i32,
        output: "boom".into(),
        started_at_ms: at,
        ended_at_ms: at,
        no_retry,
        retry_after_ms,
        ..Default::default()
    })
}

async fn acked(out: &mut Out, run: &str) {
    next_msg(
        out,
        "the report's ack",
        |_| false,
        |m| matches!(m, server_message::Msg::Ack(a) if a.report.as_ref().is_some_and(|r| r.run_id == run)).then_some(()),
    )
    .await;
}

#[tokio::test]
async fn no_retry_fails_the_run_and_retry_after_sets_the_next_attempt() {
    let (_d, store) = store().await;
    let clock = ManualClock::new(1_000_000);
    job_with(
        &store,
        r#"{"name":"flaky","retry":{"max_attempts":5,"backoff":{"initial":"1s","max":"1s"}},"executor":{"handler":{"name":"noop"}}}"#,
    )
    .await;
    let fence = term(&store).await;
    let (rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    let (mut out, session) = open_session(&commands, "w1").await;
    let send = |msg| {
        let (commands, session) = (commands.clone(), session.clone());
        async move { commands.send(LeaderCommand::FromWorker { session, msg }).await.unwrap() }
    };

    // NonRetryable: failed at once, 4 attempts left unused.
    let run = trigger(&commands, &mut out, "flaky").await;
    send(failed(&run, 1, 1_000_000, true, 0)).await;
    acked(&mut out, &run).await;
    let d = store.get_run(&run).await.unwrap().unwrap();
    assert_eq!((d.run.state, d.run.attempt), (RunState::Failed, 1), "{d:?}");
    assert!(d.run.reason.as_deref().unwrap_or_default().contains("asked not to be retried"), "{d:?}");

    // RetryAfter 90 s: retried at the end plus 90 s, not the 1 s backoff.
    let run = trigger(&commands, &mut out, "flaky").await;
    let end = clock_now(&clock);
    send(failed(&run, 1, end, false, 90_000)).await;
    acked(&mut out, &run).await;
    let d = store.get_run(&run).await.unwrap().unwrap();
    assert_eq!(d.run.state, RunState::Retrying, "{d:?}");
    assert_eq!(d.run.next_attempt_at, Some(end + 90_000), "{d:?}");
    // A day at most.
    clock.advance(90_000);
    send(heartbeat(1, &[])).await;
    assigned(&mut out, &run, 2).await;
    send(failed(&run, 2, clock_now(&clock), false, u64::MAX)).await;
    acked(&mut out, &run).await;
    let d = store.get_run(&run).await.unwrap().unwrap();
    assert_eq!(d.run.next_attempt_at, Some(clock_now(&clock) + 24 * 3600 * 1000), "{d:?}");

    // The hints count only on a failure: a lost attempt with no_retry is
    // still retried.
    let run2 = {
        let (reply, ids) = oneshot::channel();
        commands
            .send(LeaderCommand::Trigger { namespace: "default".into(), name: "flaky".into(), request: TriggerRequest::runs(1), reply })
            .await
            .unwrap();
        ids.await.unwrap().unwrap().ids.remove(0)
    };
    let (mut out2, s2) = open_session(&commands, "w2").await;
    assigned(&mut out2, &run2, 1).await;
    let mut lost = failed(&run2, 1, clock_now(&clock), true, 0);
    if let worker_message::Msg::Report(r) = &mut lost {
        r.outcome = v1::Outcome::Lost as i32;
    }
    commands.send(LeaderCommand::FromWorker { session: s2, msg: lost }).await.unwrap();
    acked(&mut out2, &run2).await;
    let d = store.get_run(&run2).await.unwrap().unwrap();
    assert_eq!(d.run.state, RunState::Retrying, "{d:?}");
    assert_eq!(d.attempts[0].state, AttemptState::Lost);
    task.abort();
}

/// Output pieces from the attempt's holder are kept for readers, in
/// order, once each; pieces from another worker, or of an attempt that
/// is not current, are not; once the attempt ends its log takes nothing
/// more, is read to its end for a while, then forgotten.
#[tokio::test]
async fn live_output_is_taken_only_from_the_holder_and_ends_with_the_attempt() {
    let (_d, store) = store().await;
    let clock = ManualClock::new(1_000_000);
    job_with(&store, r#"{"name":"talk","executor":{"handler":{"name":"noop"}}}"#).await;
    let fence = term(&store).await;
    let live = gnomon_server::live::LiveOutputs::default();
    let (rt, commands, _lost, _shut) = runtime_with_commands_live(store.clone(), fence, clock.clone(), live.clone());
    let task = tokio::spawn(rt.run());
    let (mut out, s1) = open_session(&commands, "w1").await;
    let (_out2, s2) = open_session(&commands, "w2").await;
    let run = trigger(&commands, &mut out, "talk").await;
    let piece = |offset: u64, data: &str, attempt: u32| {
        worker_message::Msg::Output(v1::Output { run_id: run.clone(), attempt, token: 0, offset, data: data.as_bytes().to_vec() })
    };
    let from = |session: &String, msg| {
        let (commands, session) = (commands.clone(), session.clone());
        async move { commands.send(LeaderCommand::FromWorker { session, msg }).await.unwrap() }
    };
    from(&s1, piece(0, "one\n", 1)).await;
    from(&s2, piece(4, "intruder\n", 1)).await;
    from(&s1, piece(4, "two\n", 2)).await;
    from(&s1, piece(0, "one\n", 1)).await;
    from(&s1, piece(4, "two\n", 1)).await;
    // A heartbeat round trip: the messages above were handled in order.
    from(&s1, heartbeat(1, &[(&run, 1)])).await;
    next_msg(&mut out, "an ack", |_| false, |m| matches!(m, server_message::Msg::Ack(a) if a.heartbeat_seq == Some(1)).then_some(())).await;
    assert_eq!(live.read(&run, 1, 0).map(|r| r.text), Some("one\ntwo\n".to_string()));
    from(&s1, failed(&run, 1, clock_now(&clock), true, 0)).await;
    acked(&mut out, &run).await;
    assert!(!live.is_live(&run, 1), "ended with the attempt");
    assert_eq!(live.read(&run, 1, 4).map(|r| r.text), Some("two\n".to_string()), "still read to its end a while");
    from(&s1, piece(8, "after the end\n", 1)).await;
    from(&s1, heartbeat(2, &[])).await;
    next_msg(&mut out, "an ack", |_| false, |m| matches!(m, server_message::Msg::Ack(a) if a.heartbeat_seq == Some(2)).then_some(())).await;
    assert_eq!(live.read(&run, 1, 0).map(|r| r.text), Some("one\ntwo\n".to_string()), "nothing taken after the end");
    clock.advance(gnomon_server::live::LIVE_KEEP_ENDED_MS + 5_000);
    from(&s1, heartbeat(3, &[])).await;
    next_msg(&mut out, "an ack", |_| false, |m| matches!(m, server_message::Msg::Ack(a) if a.heartbeat_seq == Some(3)).then_some(())).await;
    live.end("sweep", clock_now(&clock));
    assert!(live.read(&run, 1, 0).is_none(), "forgotten after its keep");
    let _: Arc<dyn Store> = store;
    task.abort();
}
