//! The tests of the run book and its invariants.

use crate::fair::NsTally;
use crate::runbook::OpenRun;
use crate::runbook::RunBook;
use crate::runbook::RunId;
use crate::timeline::JobKey;
use crate::HashMap;
use crate::HashSet;
use gnomon_core::Millis;
use gnomon_core::RunState;
use gnomon_records::Transition;
use std::sync::Arc;

fn key(uid: &str) -> Arc<JobKey> {
    Arc::new(JobKey { uid: uid.into(), name: uid.into(), namespace: "default".into() })
}

pub(crate) fn open(job: &str, state: RunState, attempt: u32) -> OpenRun {
    OpenRun {
        key: key(job),
        scheduled_at: 0,
        state,
        attempt,
        ready_since: 0,
        assigned_at: 0,
        began_at: 0,
        params: None,
        payload: None,
        after: None,
    }
}

fn to(id: &str, from: RunState, to: RunState, attempt: u32, at: Millis, next: Option<Millis>) -> Transition {
    Transition {
        run_id: id.into(),
        from,
        from_attempt: attempt,
        to,
        to_attempt: attempt,
        reason: None,
        next_attempt_at: next,
        attempt: None,
        at,
        notify: Vec::new(),
    }
}

/// Every index names open runs only; a run is held once at most.
fn check(b: &RunBook) {
    for (job, ids) in &b.by_job {
        for id in ids {
            assert_eq!(b.runs.get(id).map(|r| r.key.uid.as_str()), Some(job.as_str()), "{id} is indexed under its job");
        }
    }
    for id in b.holders.keys().chain(b.orphans.keys()) {
        assert!(b.runs.contains_key(id), "{id} is held or orphaned but not open");
    }
    let mut held: HashMap<String, HashSet<RunId>> = HashMap::default();
    for (id, w) in &b.holders {
        held.entry(w.clone()).or_default().insert(id.clone());
    }
    assert_eq!(held, b.held, "the holdings by worker are the inverse of the holders");
    for (c, ids) in &b.waiters {
        for id in ids {
            assert_eq!(b.runs.get(id).map(|r| r.state), Some(RunState::Waiting), "{id} waits on {c} but is not waiting");
        }
    }
    for c in b.ended.keys() {
        assert!(b.waiters.contains_key(c), "{c}'s end is kept though no run waits on it");
    }
    let mut tally = NsTally::default();
    for r in b.runs.values() {
        tally.add(&r.key.namespace, r.state);
    }
    let (want, have): (Vec<_>, Vec<_>) = (tally.iter().collect(), b.tally.iter().collect());
    assert_eq!(have, want, "the namespace counts are the open runs' states");
}

fn waiting(job: &str, at: Millis, edges: &[&str]) -> OpenRun {
    use gnomon_core::deps::{On, RunAfter, StoredEdge};
    let edges: Vec<StoredEdge> = edges.iter().map(|u| StoredEdge { job: u.to_string(), uid: u.to_string(), on: On::Succeeded }).collect();
    let first = edges[0].uid.clone();
    let after = RunAfter { of: gnomon_records::run_id(&first, at), of_uid: first, edges };
    OpenRun { scheduled_at: at, after: Some(Arc::new(after)), ..open(job, RunState::Waiting, 0) }
}

#[test]
fn a_waiting_run_is_decided_again_when_an_upstream_ends_and_leaves_the_index_when_it_stops_waiting() {
    use gnomon_core::deps::UpstreamRun;
    let mut b = RunBook::default();
    let up_a = gnomon_records::run_id("a", 100);
    let up_b = gnomon_records::dep_run_id("b", 100);
    b.track(Arc::from(up_a.as_str()), open("a", RunState::Running, 1));
    b.track(Arc::from("w"), waiting("d", 100, &["a", "b"]));
    check(&b);
    assert_eq!(b.take_undecided(usize::MAX), [Arc::from("w")], "a new waiting run is decided once");
    assert!(b.take_undecided(usize::MAX).is_empty());
    assert_eq!(b.job_counts("d"), (0, 0, 0), "a waiting run counts for no overlap");
    assert_eq!(b.known_upstream(&up_a), Some(UpstreamRun::Open));
    assert_eq!(b.known_upstream(&up_b), None, "not known here: the store is asked");
    b.mirror(&to(&up_a, RunState::Running, RunState::Succeeded, 1, 5, None));
    check(&b);
    assert_eq!(b.known_upstream(&up_a), Some(UpstreamRun::Ended(RunState::Succeeded)));
    assert_eq!(b.take_undecided(usize::MAX), [Arc::from("w")]);
    // A skip record of the other upstream, created ended.
    b.upstream_ended(&up_b, Some(RunState::Skipped));
    assert_eq!(b.take_undecided(usize::MAX), [Arc::from("w")]);
    // Released: it leaves the index, and the ends kept for it go.
    b.mirror(&to("w", RunState::Waiting, RunState::Pending, 0, 6, None));
    check(&b);
    assert!(b.waiters.is_empty() && b.ended.is_empty());
    assert_eq!(b.pop_ready(|_| false).as_deref(), Some("w"), "released to the ready queue");
    assert_eq!(b.job_counts("d"), (1, 1, 0));
    // A job change decides every waiting run again.
    b.track(Arc::from("w2"), waiting("d", 200, &["a"]));
    b.take_undecided(usize::MAX);
    b.reconsider_all_waiting();
    assert_eq!(b.take_undecided(usize::MAX), [Arc::from("w2")]);
    b.untrack("w2");
    check(&b);
    assert!(b.waiters.is_empty());
}

#[test]
fn a_run_leaves_every_index_with_its_end() {
    let mut b = RunBook::default();
    b.track(Arc::from("r1"), open("j", RunState::Assigned, 1));
    b.track(Arc::from("r2"), open("j", RunState::Pending, 0));
    b.queue(Arc::from("r2"));
    assert_eq!(b.hold(Arc::from("r1"), "w1"), None);
    check(&b);
    assert_eq!(b.job_counts("j"), (2, 1, 1));
    assert_eq!(b.mirror(&to("r1", RunState::Assigned, RunState::Succeeded, 1, 5, None)).as_deref(), Some("w1"), "its slot frees");
    check(&b);
    assert_eq!(b.job_counts("j"), (1, 1, 0));
    assert_eq!(b.untrack("r2"), None);
    assert!(b.by_job.is_empty());
    assert_eq!(b.pop_ready(|_| false).as_deref(), Some("r2"), "the queue may name a run that left; readers skip it");
}

#[test]
fn retries_come_due_in_time_order_and_only_while_retrying() {
    let mut b = RunBook::default();
    for (id, at) in [("a", 300), ("b", 100), ("c", 200)] {
        b.track(Arc::from(id), open("j", RunState::Assigned, 1));
        b.hold(Arc::from(id), "w1");
        assert_eq!(b.mirror(&to(id, RunState::Assigned, RunState::Retrying, 1, 0, Some(at))).as_deref(), Some("w1"));
    }
    check(&b);
    assert_eq!(b.next_retry_at(), Some(100));
    b.mirror(&to("c", RunState::Retrying, RunState::Cancelled, 1, 150, None));
    let due: Vec<String> = b.take_due_retries(250).iter().map(|id| id.to_string()).collect();
    assert_eq!(due, ["b"], "c was cancelled meanwhile; a is not due");
    assert_eq!(b.next_retry_at(), Some(300));
}

#[test]
fn an_orphan_is_reclaimed_by_holding_it_or_ends_at_its_deadline() {
    let mut b = RunBook::default();
    b.track(Arc::from("r1"), open("j", RunState::Running, 1));
    b.track(Arc::from("r2"), open("j", RunState::Running, 1));
    b.orphan(Arc::from("r1"), 1_000, Some("w1".into()));
    b.orphan(Arc::from("r2"), 1_000, Some("w2".into()));
    b.track(Arc::from("r3"), open("j", RunState::Running, 1));
    b.orphan(Arc::from("r3"), 1_000, None);
    assert!(b.may_report("r1", "w1") && !b.may_report("r1", "w9"), "an orphan's report is its worker's");
    assert!(b.may_report("r3", "anyone"), "an orphan of no known worker takes anyone's");
    b.set_orphan_deadlines("w2", 5_000);
    assert_eq!(b.hold(Arc::from("r1"), "w1"), None);
    assert!(!b.is_orphan("r1"));
    assert!(b.may_report("r1", "w1") && !b.may_report("r1", "w9"));
    let none = |_: &str, _: Option<&str>| false;
    let overdue = b.take_overdue_orphans(2_000, |id, w| id == "r3" && w.is_none());
    assert!(overdue.is_empty(), "r2's deadline moved; r3's report is in: {overdue:?}");
    assert_eq!(b.take_overdue_orphans(2_000, none).len(), 1, "r3 once its report is not");
    let overdue = b.take_overdue_orphans(6_000, none);
    assert_eq!(overdue.len(), 1);
    assert_eq!(&*overdue[0].0, "r2");
    check(&b);
    assert_eq!(b.hold(Arc::from("r1"), "w3").as_deref(), Some("w1"), "a new holder displaces the old");
}

#[test]
fn a_returning_worker_gets_a_lease_for_the_reports_of_its_unlisted_orphans() {
    let mut b = RunBook::default();
    for id in ["r1", "r2", "r3"] {
        b.track(Arc::from(id), open("j", RunState::Running, 1));
    }
    b.orphan(Arc::from("r1"), 1_000, Some("w1".into()));
    b.orphan(Arc::from("r2"), 1_000, Some("w1".into()));
    b.orphan(Arc::from("r3"), 1_000, Some("w2".into()));
    // w1 comes back at 900 listing r2 (it will reclaim it), not r1.
    b.await_reports_of("w1", |id| id == "r2", 900 + 5_000);
    let none = |_: &str, _: Option<&str>| false;
    let mut overdue: Vec<String> = b.take_overdue_orphans(2_000, none).into_iter().map(|(id, _)| id.to_string()).collect();
    overdue.sort();
    assert_eq!(overdue, ["r2", "r3"], "r1 waits for its report; a listed one and another worker's keep their deadline");
    assert!(b.take_overdue_orphans(5_900, none).is_empty());
    assert_eq!(b.take_overdue_orphans(5_901, none).len(), 1, "r1 once that lease has passed too");
    // A later deadline is never shortened.
    b.orphan(Arc::from("r3"), 9_000, Some("w2".into()));
    b.await_reports_of("w2", |_| false, 7_000);
    assert!(b.take_overdue_orphans(8_000, none).is_empty());
    check(&b);
}

#[test]
fn cancels_are_remembered_per_attempt_until_it_ends() {
    let mut b = RunBook::default();
    b.note_cancel("r1", 1);
    assert!(b.cancel_sent("r1", 1) && !b.cancel_sent("r1", 2));
    b.forget_cancels("r1");
    assert!(!b.cancel_sent("r1", 1));
}

#[test]
fn a_keyed_run_that_ends_is_kept_with_its_bytes_until_its_hold_ends() {
    let mut b = RunBook::default();
    let keyed = |at: Millis| OpenRun {
        scheduled_at: at,
        params: Some(Arc::from("{\"a\":1}")),
        payload: Some(Arc::from("xyz")),
        ..open("j", RunState::Pending, 0)
    };
    b.track(Arc::from("j-kone"), keyed(1_000));
    b.track(Arc::from("j-ktwo"), keyed(2_000));
    b.track(Arc::from("j-100"), open("j", RunState::Pending, 0));
    assert_eq!((b.ns_counts("default").open(), b.ns_counts("default").bytes), (3, 20));
    // Reloaded while open: dropped and tracked again, never kept.
    b.untrack("j-ktwo");
    b.track(Arc::from("j-ktwo"), keyed(2_000));
    assert_eq!(b.ns_counts("default").kept, 0);
    // Ended: the keyed run is kept with its bytes; the other is gone.
    b.mirror(&to("j-kone", RunState::Pending, RunState::Cancelled, 0, 5_000, None));
    b.mirror(&to("j-100", RunState::Pending, RunState::Cancelled, 0, 5_000, None));
    let c = b.ns_counts("default");
    assert_eq!((c.open(), c.kept, c.counted(), c.bytes), (1, 1, 2, 20));
    b.ended("j-ktwo");
    assert!(!b.release_kept(1_000 + gnomon_records::KEYED_RUN_HOLD_MS - 1), "held until its instant plus the hold");
    assert!(b.release_kept(1_000 + gnomon_records::KEYED_RUN_HOLD_MS));
    assert_eq!((b.ns_counts("default").kept, b.ns_counts("default").bytes), (1, 10));
    b.release_kept(Millis::MAX);
    assert_eq!(b.ns_tally().count(), 0, "nothing is left counted");
    check(&b);
}
