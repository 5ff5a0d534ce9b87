//! The store suite's notification outbox test: notifications ride with
//! the transition that raises them, a delivery is a fenced compare on its
//! attempts, and pruning a run deletes them.

use gnomon_core::RunState;

use super::fixtures::{job_spec, lead, new_run, tr, turn, unique};
use crate::*;

fn note(run: &str, outcome: &str, at: i64) -> NewNotification {
    NewNotification {
        id: format!("{run}/{outcome}/0"),
        run_id: run.into(),
        namespace: "default".into(),
        job: "j".into(),
        outcome: outcome.into(),
        target: r#"{"on":["failed"],"slack":{"url":"http://127.0.0.1:9/"}}"#.into(),
        created_at: at,
    }
}

pub(super) async fn notifications_ride_with_their_transition(a: &dyn Store, b: &dyn Store) {
    let fence = lead(a, &unique("notify")).await;
    let job = a.put_job(&job_spec(&unique("notify")), Precondition::DoesNotExist, 1).await.expect("create");
    let (r0, r1, r2) = (run_id(&job.uid, 1000), run_id(&job.uid, 2000), run_id(&job.uid, 3000));
    a.fire(&fence, &[new_run(&job, 1000), new_run(&job, 2000)], &[]).await.expect("fire");
    // One that applies (its notification, named twice, is written once),
    // one that does not (its notification is not written).
    let mut ok = tr(&r0, RunState::Pending, 0, RunState::Cancelled, 0, None);
    ok.notify = vec![note(&r0, "failed", 50), note(&r0, "failed", 50)];
    let mut not = tr(&r1, RunState::Running, 1, RunState::Failed, 1, None);
    not.notify = vec![note(&r1, "failed", 50)];
    assert_eq!(a.transition(&fence, &[ok, not]).await.expect("transition"), vec![true, false]);
    let got = b.run_notifications(&r0).await.expect("read");
    assert_eq!(got.len(), 1, "written once: {got:?}");
    let n = &got[0];
    assert_eq!((n.state, n.attempts, n.next_at, n.outcome.as_str()), (NotificationState::Pending, 0, 50, "failed"));
    assert_eq!(n, &Notification::new(&note(&r0, "failed", 50)));
    assert!(b.run_notifications(&r1).await.expect("read").is_empty(), "a transition that did not apply wrote none");
    // A transition folded into its run's insert carries its notification too.
    let mut folded = tr(&r2, RunState::Pending, 0, RunState::Skipped, 0, None);
    folded.notify = vec![note(&r2, "late", 60)];
    a.write_turn(&fence, &turn(&[new_run(&job, 3000)], &[], &[folded])).await.expect("turn");
    assert_eq!(b.run_notifications(&r2).await.expect("read").len(), 1, "the folded transition's notification");
    // Due: pending ones whose time has come, oldest first.
    let mine = |v: Vec<Notification>| v.into_iter().filter(|n| n.run_id == r0 || n.run_id == r2).map(|n| n.id).collect::<Vec<_>>();
    assert!(mine(b.due_notifications(49, 1000).await.expect("due")).is_empty());
    assert_eq!(mine(b.due_notifications(60, 1000).await.expect("due")), vec![format!("{r0}/failed/0"), format!("{r2}/late/0")]);
    // A delivery is a compare on the attempts read.
    let id = format!("{r0}/failed/0");
    let retry = Delivery {
        id: id.clone(),
        attempts_before: 0,
        state: NotificationState::Pending,
        attempts: 1,
        next_at: 5_000,
        error: Some("503".into()),
        at: 70,
    };
    assert!(a.settle_notification(&fence, &retry).await.expect("settle"));
    assert!(!a.settle_notification(&fence, &retry).await.expect("settle twice"), "the same delivery applies once");
    assert_eq!(mine(b.due_notifications(4_999, 1000).await.expect("due")), vec![format!("{r2}/late/0")], "not due before its retry");
    let sent =
        Delivery { attempts_before: 1, state: NotificationState::Sent, attempts: 2, next_at: 5_000, error: None, at: 5_001, ..retry };
    assert!(a.settle_notification(&fence, &sent).await.expect("sent"));
    let n = &b.run_notifications(&r0).await.expect("read")[0];
    assert_eq!((n.state, n.attempts, n.last_error.as_deref(), n.updated_at), (NotificationState::Sent, 2, None, 5_001));
    assert!(!mine(b.due_notifications(i64::MAX, 1000).await.expect("due")).contains(&id), "a sent one is not due");
    // A stale term may not record a delivery.
    let newer = Fence { scope: fence.scope.clone(), token: fence.token + 1 };
    a.fence(&newer, &LeaderInfo::default(), 2).await.expect("newer term");
    let late = Delivery {
        id: format!("{r2}/late/0"),
        attempts_before: 0,
        state: NotificationState::Sent,
        attempts: 1,
        next_at: 0,
        error: None,
        at: 80,
    };
    assert!(matches!(a.settle_notification(&fence, &late).await, Err(StoreError::Fenced { .. })), "a stale term is fenced");
    // Pruning a run deletes its notifications.
    a.prune(&newer, 0, i64::MAX, i64::MAX, 100_000).await.expect("prune");
    assert!(b.get_run(&r0).await.expect("get").is_none());
    assert!(b.run_notifications(&r0).await.expect("read").is_empty() && b.run_notifications(&r2).await.expect("read").is_empty());
    assert!(!mine(b.due_notifications(i64::MAX, 1000).await.expect("due")).contains(&format!("{r2}/late/0")));
}
