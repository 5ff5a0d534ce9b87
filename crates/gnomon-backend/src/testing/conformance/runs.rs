//! Run pages, cancel requests, the committed leader time and retention.

use gnomon_core::{AttemptState, RunState};

use super::firing::s_run;
use super::fixtures::*;
use crate::*;

pub(super) async fn pagination_is_stable_under_inserts(s: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let job = s.put_job(&job_spec(&unique("page")), Precondition::DoesNotExist, 1).await.expect("create");
    let runs: Vec<NewRun> = (1..=25).map(|i| new_run(&job, i * 1000)).collect();
    s.fire(&fence, &runs, &[]).await.expect("fire");
    let filter = RunFilter { job: Some(job.name.clone()), ..Default::default() };
    let first = s.list_runs(&filter, 10, None).await.expect("page 1");
    assert_eq!(first.runs.len(), 10);
    assert_eq!(first.runs[0].scheduled_at, 25_000, "newest first");
    // Newer runs arrive between pages.
    let more: Vec<NewRun> = (26..=30).map(|i| new_run(&job, i * 1000)).collect();
    s.fire(&fence, &more, &[]).await.expect("fire more");
    let mut seen: Vec<i64> = first.runs.iter().map(|r| r.scheduled_at).collect();
    let mut cursor = first.next_cursor;
    while let Some(c) = cursor {
        let page = s.list_runs(&filter, 10, Some(c)).await.expect("page");
        seen.extend(page.runs.iter().map(|r| r.scheduled_at));
        cursor = page.next_cursor;
    }
    let expected: Vec<i64> = (1..=25).rev().map(|i| i * 1000).collect();
    assert_eq!(seen, expected, "no run twice, none skipped, order kept");
    let by_state = s
        .list_runs(&RunFilter { state: Some(RunState::Pending), job: Some(job.name.clone()), ..Default::default() }, 1000, None)
        .await
        .expect("by state");
    assert_eq!(by_state.runs.len(), 30);
    assert_eq!(by_state.next_cursor, None);
}

pub(super) async fn cancel_requests(s: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let job = s.put_job(&job_spec(&unique("cancel")), Precondition::DoesNotExist, 1).await.expect("create");
    s.fire(&fence, &[new_run(&job, 1000), new_run(&job, 2000)], &[]).await.expect("fire");
    let pending = run_id(&job.uid, 1000);
    let live = run_id(&job.uid, 2000);
    assert_eq!(s.request_cancel(&pending, 3).await.expect("cancel pending"), CancelOutcome::Cancelled);
    assert_eq!(s_run(s, &pending).await.state, RunState::Cancelled);
    assert!(matches!(s.request_cancel(&pending, 3).await, Err(StoreError::Terminal(_))));
    let assign = tr(
        &live,
        RunState::Pending,
        0,
        RunState::Assigned,
        1,
        Some(AttemptChange::Assign { attempt: 1, worker: "w".into(), token: fence.token }),
    );
    assert!(s.transition(&fence, &[assign]).await.expect("assign")[0]);
    assert_eq!(s.request_cancel(&live, 4).await.expect("cancel live"), CancelOutcome::Requested);
    assert!(s.cancel_requests().await.expect("requests").iter().any(|r| r.id == live));
    let end = tr(
        &live,
        RunState::Assigned,
        1,
        RunState::Cancelled,
        1,
        Some(AttemptChange::End { attempt: 1, state: AttemptState::Cancelled, exit_code: None, output: String::new(), started_at: None }),
    );
    assert!(s.transition(&fence, &[end]).await.expect("end")[0]);
    assert!(!s.cancel_requests().await.expect("requests").iter().any(|r| r.id == live), "a finished run is no longer a cancel request");
    assert!(matches!(s.request_cancel("no-such-run", 5).await, Err(StoreError::NotFound(_))));
}

/// The committed leader time: fenced, never lowered, kept by a new term's
/// `fence`, and seen by every handle.
pub(super) async fn leader_time_only_moves_forward(a: &dyn Store, b: &dyn Store) {
    let scope = unique("clock");
    let old = lead(a, &scope).await;
    assert_eq!(a.leadership(&scope).await.expect("read").expect("record").leader_time, 0, "no leader time yet");
    assert_eq!(a.advance_leader_time(&old, 5_000).await.expect("advance"), 5_000);
    assert_eq!(a.advance_leader_time(&old, 4_000).await.expect("lower"), 5_000, "a lower time leaves it as it is");
    assert_eq!(b.leadership(&scope).await.expect("read").expect("record").leader_time, 5_000, "every handle sees it");
    let new = lead(b, &scope).await;
    assert_eq!(b.leadership(&scope).await.expect("read").expect("record").leader_time, 5_000, "a new term keeps it");
    assert!(
        matches!(a.advance_leader_time(&old, 9_000).await, Err(StoreError::Fenced { .. })),
        "a deposed leader may not move the leader time"
    );
    assert!(matches!(a.advance_leader_time(&old, 1_000).await, Err(StoreError::Fenced { .. })), "nor read it back as if it led");
    assert_eq!(b.advance_leader_time(&new, 6_000).await.expect("advance"), 6_000);
    assert_eq!(a.leadership(&scope).await.expect("read").expect("record").leader_time, 6_000);
    // A server clock, where the store has one, is a real clock (the test
    // servers run on this machine).
    if let Some(t) = a.server_clock().await.expect("the server's clock") {
        let here = gnomon_core::Clock::now_millis(&gnomon_core::SystemClock);
        assert!((t - here).abs() < 5_000, "the server's clock {t} is close to this machine's {here}");
    }
}

/// Retention: terminal runs beyond the newest N of a job, or fired before a
/// time, are deleted with their attempts; open runs never are; a stale
/// term may not prune. Runs at the end of the suite: prune is store-wide.
pub(super) async fn retention_deletes_only_old_terminal_runs(s: &dyn Store) {
    let name = unique("kept");
    let job = s.put_job(&job_spec(&name), Precondition::DoesNotExist, 1).await.expect("put");
    let fence = lead(s, &unique("retention")).await;
    // 10 runs: 8 terminal (skipped), the newest 2 pending.
    let runs: Vec<NewRun> = (0..10)
        .map(|i| NewRun { state: if i < 8 { RunState::Skipped } else { RunState::Pending }, ..new_run(&job, 1_000_000 + 1000 * i) })
        .collect();
    s.fire(&fence, &runs, &[]).await.expect("fire");
    let mine = || async {
        let page = s.list_runs(&RunFilter { job: Some(name.clone()), ..Default::default() }, 100, None).await.expect("list");
        page.runs.iter().map(|r| r.scheduled_at - 1_000_000).collect::<Vec<i64>>()
    };
    // Keep the newest 3 per job: 7 terminal runs go, the open ones stay.
    assert!(s.prune(&fence, 3, 0, i64::MAX, 10_000).await.expect("prune") >= 7);
    assert_eq!(mine().await, vec![9000, 8000, 7000], "the newest three runs are kept");
    assert!(s.get_run(&runs[0].id()).await.expect("get").is_none(), "a pruned run is gone");
    // By age: everything terminal fired before the kept terminal run's
    // fire time (1_007_001) and a millisecond.
    s.prune(&fence, 1000, 1_007_002, i64::MAX, 10_000).await.expect("prune by age");
    assert_eq!(mine().await, vec![9000, 8000], "only the open runs are left");
    // A keyed run (a key's or a webhook call's record) fired at or after
    // the hold is kept, by count and by age; before it, it goes.
    let keyed = NewRun { state: RunState::Skipped, manual: true, key: Some(unique("hold")), ..new_run(&job, 1_020_000) };
    assert!(crate::is_keyed_run_id(&keyed.id()), "{}", keyed.id());
    s.fire(&fence, std::slice::from_ref(&keyed), &[]).await.expect("fire keyed");
    let fired = s.get_run(&keyed.id()).await.expect("get").expect("the keyed run").run.fired_at;
    s.prune(&fence, 0, i64::MAX, fired, 10_000).await.expect("prune held");
    assert!(s.get_run(&keyed.id()).await.expect("get").is_some(), "a keyed run within the hold is kept");
    // Even with nothing to keep, open runs stay.
    s.prune(&fence, 0, i64::MAX, i64::MAX, 10_000).await.expect("prune all");
    assert!(s.get_run(&keyed.id()).await.expect("get").is_none(), "past the hold it goes");
    assert_eq!(mine().await, vec![9000, 8000], "open runs are never pruned");
    // The size is reported, and the SQL stores' is that of their database.
    assert!(s.size_bytes().await.unwrap_or(0) > 0, "{} reports its size", s.backend());
    // A stale term may not prune.
    let newer = Fence { scope: fence.scope.clone(), token: fence.token + 1 };
    s.fence(&newer, &LeaderInfo::default(), 2).await.expect("newer term");
    assert!(matches!(s.prune(&fence, 0, i64::MAX, i64::MAX, 10).await, Err(StoreError::Fenced { .. })), "a stale term's prune is fenced");
}

/// The keyed runs that ended and were fired since a cut, newest first: an
/// open keyed run, a run without a key, and a keyed run fired before the
/// cut are not among them, and each carries its params' and payload's bytes.
pub(super) async fn kept_keyed_runs_are_the_ended_keyed_runs_since_the_cut(s: &dyn Store) {
    let mut spec = job_spec(&unique("kept"));
    spec.namespace = Some(unique("keptns"));
    let job = s.put_job(&spec, Precondition::DoesNotExist, 1).await.expect("put");
    let fence = lead(s, &unique("kept-keyed")).await;
    // Later than any other run the suite fires, so the walk reaches these.
    let f: i64 = 5_000_000_000_000;
    let keyed =
        |t: i64, key: &str, state: RunState| NewRun { state, manual: true, key: Some(key.to_string()), fired_at: t, ..new_run(&job, t) };
    let runs = [
        keyed(f, "ended", RunState::Skipped),
        keyed(f + 1, "open", RunState::Pending),
        NewRun { state: RunState::Skipped, fired_at: f + 2, ..new_run(&job, f + 2) },
        NewRun { params: Some(r#"{"a":1}"#.into()), payload: Some("xyz".into()), ..keyed(f + 3, "later", RunState::Skipped) },
    ];
    s.fire(&fence, &runs, &[]).await.expect("fire");
    let ns = &job.namespace;
    let mine = |since: i64| async move {
        let mut kept: Vec<(i64, u64)> = s
            .kept_keyed_runs(since)
            .await
            .expect("kept keyed runs")
            .into_iter()
            .filter(|k| &k.namespace == ns)
            .map(|k| (k.fired_at, k.bytes))
            .collect();
        kept.sort();
        kept
    };
    assert_eq!(mine(f).await, vec![(f, 0), (f + 3, 10)], "{}: the ended keyed runs, with their bytes", s.backend());
    assert_eq!(mine(f + 1).await, vec![(f + 3, 10)], "{}: none fired before the cut", s.backend());
    assert_eq!(mine(f + 4).await, vec![], "{}", s.backend());
}
