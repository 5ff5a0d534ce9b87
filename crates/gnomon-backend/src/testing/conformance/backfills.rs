//! The backfill role: records created once, progress a fenced CAS from the
//! cursor it continues, cancellation final.

use gnomon_core::RunState;

use super::fixtures::*;
use crate::*;

fn new_backfill(job: &JobRecord, id: &str) -> NewBackfill {
    NewBackfill {
        id: id.into(),
        namespace: job.namespace.clone(),
        job: job.name.clone(),
        job_uid: job.uid.clone(),
        from: 10_000,
        to: 20_000,
        params: Some(r#"{"day":"mon"}"#.into()),
        rate: 5,
        total: 11,
    }
}

pub(super) async fn backfills_advance_by_fenced_cas_and_stop_when_cancelled(s: &dyn Store, other: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let job = s.put_job(&job_spec(&unique("bf")), Precondition::DoesNotExist, 1).await.expect("create");
    let id = unique("bf");
    let made = s.create_backfill(&new_backfill(&job, &id), 500).await.expect("create backfill");
    assert_eq!((made.state, made.cursor, made.created, made.kept), (BackfillState::Running, 9_999, 0, 0));
    let again = s.create_backfill(&new_backfill(&job, &id), 501).await;
    assert!(matches!(again, Err(StoreError::AlreadyExists(_))), "an id is taken once: {again:?}");
    assert_eq!(other.get_backfill(&id).await.expect("get"), Some(made.clone()), "read back as written, from another client");
    assert!(s.list_backfills(Some(&job.namespace)).await.expect("list").iter().any(|b| b.id == id));
    assert!(s.list_backfills(Some("no-such-namespace")).await.expect("list").is_empty());
    assert!(s.running_backfills().await.expect("running").iter().any(|b| b.id == id));

    let step = |from_cursor, cursor, created, done: Option<&str>| BackfillProgress {
        id: id.clone(),
        from_cursor,
        cursor,
        created,
        kept: 1,
        done: done.map(str::to_string),
        at: 600,
    };
    assert!(s.advance_backfill(&fence, &step(9_999, 14_000, 4, None)).await.expect("advance"));
    assert!(!s.advance_backfill(&fence, &step(9_999, 15_000, 5, None)).await.expect("stale"), "a report from an old cursor is refused");
    let got = s.get_backfill(&id).await.expect("get").expect("exists");
    assert_eq!((got.cursor, got.created, got.kept, got.updated_at), (14_000, 4, 1, 600));
    // A deposed leader's report is fenced out.
    let newer = lead(s, &scope).await;
    assert!(matches!(s.advance_backfill(&fence, &step(14_000, 16_000, 6, None)).await, Err(StoreError::Fenced { .. })));
    assert!(s.advance_backfill(&newer, &step(14_000, 16_000, 6, None)).await.expect("advance"));
    // Cancelled: final, and no report revives it.
    let cancelled = other.cancel_backfill(&id, 700).await.expect("cancel");
    assert_eq!(cancelled.state, BackfillState::Cancelled);
    assert!(matches!(s.cancel_backfill(&id, 701).await, Err(StoreError::Terminal(_))));
    assert!(!s.advance_backfill(&newer, &step(16_000, 20_000, 7, Some("done"))).await.expect("after cancel"));
    assert_eq!(s.get_backfill(&id).await.expect("get").expect("exists").state, BackfillState::Cancelled);
    assert!(!s.running_backfills().await.expect("running").iter().any(|b| b.id == id));
    assert!(matches!(s.cancel_backfill("no-such-backfill", 1).await, Err(StoreError::NotFound(_))));
    // One that finishes is done.
    let id2 = unique("bf");
    s.create_backfill(&new_backfill(&job, &id2), 800).await.expect("create");
    let done = BackfillProgress {
        id: id2.clone(),
        from_cursor: 9_999,
        cursor: 20_000,
        created: 11,
        kept: 0,
        done: Some("every instant".into()),
        at: 900,
    };
    assert!(s.advance_backfill(&newer, &done).await.expect("finish"));
    let got = s.get_backfill(&id2).await.expect("get").expect("exists");
    assert_eq!((got.state, got.reason.as_deref()), (BackfillState::Done, Some("every instant")));
    let _ = RunState::Pending;
}

/// A turn's write carries backfill work with its runs: one backfill's
/// progress, another started, and the runs of its chunk. A deposed
/// leader's turn writes none of it.
pub(super) async fn a_turn_carries_backfill_progress_and_new_backfills(s: &dyn Store, other: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let job = s.put_job(&job_spec(&unique("bft")), Precondition::DoesNotExist, 1).await.expect("create");
    let (running, started) = (unique("bf"), unique("bf"));
    s.create_backfill(&new_backfill(&job, &running), 500).await.expect("create backfill");
    let progress =
        |from_cursor, cursor| BackfillProgress { id: running.clone(), from_cursor, cursor, created: 2, kept: 0, done: None, at: 600 };
    let batch = TurnBatch {
        runs: vec![new_run(&job, 10_000), new_run(&job, 11_000)],
        backfills: vec![progress(9_999, 11_000), progress(9_999, 12_000)],
        // The first progress counts the two runs (created: they are new).
        backfill_runs: vec![0..2, 2..2],
        new_backfills: vec![new_backfill(&job, &started), new_backfill(&job, &running)],
        at: 650,
        ..TurnBatch::default()
    };
    let wrote = s.write_turn(&fence, &batch).await.expect("turn write");
    assert_eq!(wrote.fired, vec![FireOutcome::Created, FireOutcome::Created]);
    assert_eq!(wrote.advanced, vec![true, false], "the second progress starts from a cursor that moved");
    assert_eq!(wrote.created, vec![true, false], "a taken id is not created again");
    let got = other.get_backfill(&running).await.expect("get").expect("exists");
    assert_eq!((got.cursor, got.created, got.kept), (11_000, 4, 0), "2 counted before, and the 2 runs the turn created");
    let made = other.get_backfill(&started).await.expect("get").expect("created in the turn");
    assert_eq!((made.state, made.created_at), (BackfillState::Running, 650));
    // A newer term fences out the whole turn: no run, no cursor, no backfill.
    let _newer = lead(other, &scope).await;
    let late = unique("bf");
    let stale = TurnBatch {
        runs: vec![new_run(&job, 12_000)],
        backfills: vec![progress(11_000, 13_000)],
        new_backfills: vec![new_backfill(&job, &late)],
        at: 700,
        ..TurnBatch::default()
    };
    assert!(matches!(s.write_turn(&fence, &stale).await, Err(StoreError::Fenced { .. })));
    assert!(other.get_run(&run_id(&job.uid, 12_000)).await.expect("get").is_none());
    assert_eq!(other.get_backfill(&running).await.expect("get").expect("exists").cursor, 11_000);
    assert!(other.get_backfill(&late).await.expect("get").is_none());
}
