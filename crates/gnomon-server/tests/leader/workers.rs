//! Worker sessions: held and unheld attempts, overruns, who may report,
//! late notifications and payloads.

use std::time::{Duration, Instant};

use gnomon_backend::Precondition;
use gnomon_core::spec::parse_job_json;
use gnomon_core::AttemptState;
use gnomon_core::ManualClock;
use gnomon_core::RunState;
use gnomon_proto::v1::{self, server_message, worker_message};
use gnomon_server::leader::{LeaderCommand, LeaderConfig, TriggerRequest};
use tokio::sync::{mpsc, oneshot};

use super::harness::*;

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
            "triggers":{"webhook":{"secret":"t","params":{"branch":"/ref"}}}}"#,
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
        let request = TriggerRequest {
            count: 1,
            key: Some("delivery-1".into()),
            params,
            payload: Some(payload.into()),
            origin: Origin::Webhook,
            ..Default::default()
        };
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

/// A namespace whose ready runs find no worker (here: a handler none
/// offers) cannot spend a dispatch pass's whole scan: another namespace's
/// run still gets the free slot, even though that namespace holds more
/// attempts (and so comes second in the fair order).
#[tokio::test]
async fn a_namespace_of_runs_no_worker_takes_does_not_starve_another() {
    let (_d, store) = store().await;
    let clock = ManualClock::new(1_000_000);
    job_with(&store, r#"{"name":"stuck","namespace":"a","executor":{"handler":{"name":"absent"}}}"#).await;
    job_with(&store, r#"{"name":"ok","namespace":"b","executor":{"handler":{"name":"noop"}}}"#).await;
    let fence = term(&store).await;
    let (rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    let trigger = |ns: &str, name: &str, count: u32| {
        let (commands, ns, name) = (commands.clone(), ns.to_string(), name.to_string());
        async move {
            let (reply, answer) = oneshot::channel();
            let request = TriggerRequest::runs(count);
            commands.send(LeaderCommand::Trigger { namespace: ns, name, request, reply }).await.unwrap();
            answer.await.unwrap().unwrap()
        }
    };
    let assigned = |m: &server_message::Msg| match m {
        server_message::Msg::Assign(a) => Some(a.run_id.clone()),
        _ => None,
    };
    // More runs nobody takes than one pass scans; b's first run takes
    // w1's slot, so b holds an attempt and a none.
    let (mut w1, _s1) = open_session(&commands, "w1").await;
    trigger("a", "stuck", 10_000).await;
    let first = trigger("b", "ok", 1).await.ids[0].clone();
    assert_eq!(next_msg(&mut w1, "b's first run on w1", |_| false, assigned).await, first);
    // A free slot opens: b's second run gets it.
    let (mut w2, _s2) = open_session(&commands, "w2").await;
    let second = trigger("b", "ok", 1).await.ids[0].clone();
    assert_eq!(next_msg(&mut w2, "b's second run on w2", |_| false, assigned).await, second);
    task.abort();
}

/// A worker whose attempt ended while it was away (a new term began
/// meanwhile) comes back just before the orphan's deadline, without the
/// attempt in its Hello, and sends the spooled report after the deadline
/// has passed: the report still completes the run. Before, the new term
/// judged the orphan at its old deadline, ended it `lost` in the turn
/// between the Welcome and the report, and the run ran again (a
/// simulation seed found it).
#[tokio::test]
async fn a_spooled_report_that_follows_a_late_hello_is_taken() {
    let (_d, store) = store().await;
    let clock = ManualClock::new(1_000_000);
    put(&store, r#"{"name":"once","retry":{"max_attempts":2},"executor":{"handler":{"name":"noop"}}}"#, 1_000_000).await;
    // The first term assigns the run to w1.
    let fence = term(&store).await;
    let (rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let first = tokio::spawn(rt.run());
    let (mut out, _session) = open_session(&commands, "w1").await;
    let (reply, ids) = oneshot::channel();
    commands
        .send(LeaderCommand::Trigger { namespace: "default".into(), name: "once".into(), request: TriggerRequest::runs(1), reply })
        .await
        .unwrap();
    let run = ids.await.unwrap().unwrap().ids.remove(0);
    let attempt = next_msg(
        &mut out,
        "the assignment",
        |_| false,
        |m| match m {
            server_message::Msg::Assign(a) if a.run_id == run => Some(a.attempt),
            _ => None,
        },
    )
    .await;
    assert_eq!(attempt, 1);
    first.abort();
    let _ = first.await;

    // A new term: the attempt is an orphan of w1's, until a lease and the
    // reconnect slack after the term began (10 s + 2 s by default).
    let fence = term(&store).await;
    let (rt, commands, _lost, _shut) = runtime_with_commands(store.clone(), fence, clock.clone());
    let second = tokio::spawn(rt.run());
    tokio::time::sleep(Duration::from_millis(300)).await;
    clock.advance(11_900);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // w1 comes back 100 ms before that deadline; the attempt has ended on
    // it, so its Hello does not list it.
    let (mut out, session) = open_session(&commands, "w1").await;
    // The deadline passes before the report is read.
    clock.advance(300);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = clock_now(&clock);
    let report = v1::Report {
        run_id: run.clone(),
        attempt: 1,
        outcome: v1::Outcome::Succeeded as i32,
        started_at_ms: 1_000_000,
        ended_at_ms: now - 1_000,
        ..Default::default()
    };
    commands.send(LeaderCommand::FromWorker { session, msg: worker_message::Msg::Report(report) }).await.unwrap();
    let ack = next_msg(
        &mut out,
        "the report's ack",
        |_| false,
        |m| match m {
            server_message::Msg::Ack(a) if a.report.as_ref().is_some_and(|r| r.run_id == run) => Some(a.clone()),
            _ => None,
        },
    )
    .await;
    let detail = store.get_run(&run).await.unwrap().unwrap();
    assert_eq!(detail.run.state, RunState::Succeeded, "the report completed the run: {ack:?} {detail:?}");
    assert_eq!(detail.attempts.iter().map(|a| a.state).collect::<Vec<_>>(), [AttemptState::Succeeded], "no second attempt");
    second.abort();
}
