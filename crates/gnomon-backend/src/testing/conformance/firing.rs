//! Fire uniqueness, fencing, CAS transitions and a turn's one write.

use std::sync::Arc;

use gnomon_core::{AttemptState, RunState};

use super::fixtures::*;
use crate::*;

pub(super) async fn fire_uniqueness_under_concurrency(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let scope = unique("scope");
    let fence = lead(a.as_ref(), &scope).await;
    let job = a.put_job(&job_spec(&unique("race")), Precondition::DoesNotExist, 1).await.expect("create");
    // Several "servers" race to fire the same 40 times, many rounds.
    let mut tasks = Vec::new();
    for i in 0..6 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let fence = fence.clone();
        let job = job.clone();
        tasks.push(tokio::spawn(async move {
            let mut created = 0usize;
            for round in 0..10i64 {
                let runs: Vec<NewRun> = (0..4).map(|k| new_run(&job, 1000 * (round * 4 + k + 1))).collect();
                let outcomes = store.fire(&fence, &runs, &[]).await.expect("fire");
                created += outcomes.iter().filter(|o| **o == FireOutcome::Created).count();
            }
            created
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    assert_eq!(total, 40, "exactly one creation per (job, scheduled_at)");
    let page = a.list_runs(&RunFilter { job: Some(job.name.clone()), ..Default::default() }, 1000, None).await.expect("list");
    assert_eq!(page.runs.len(), 40);
    let mut times: Vec<i64> = page.runs.iter().map(|r| r.scheduled_at).collect();
    times.dedup();
    assert_eq!(times.len(), 40);
    assert!(page.runs.iter().all(|r| r.id == run_id(&job.uid, r.scheduled_at)), "run ids derive from (job, scheduled_at)");
}

/// Two handles (two "servers") fire the same `(job, scheduled_at)` at the
/// same moment, over and over: exactly one creation every time.
pub(super) async fn two_servers_race_fire_in_a_tight_loop(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let scope = unique("scope");
    let fence = lead(a.as_ref(), &scope).await;
    let job = a.put_job(&job_spec(&unique("tight")), Precondition::DoesNotExist, 1).await.expect("create");
    for i in 0..100i64 {
        let run = [new_run(&job, 10_000 + i)];
        let advance = [JobAdvance { job_uid: job.uid.clone(), last_scheduled_at: 10_000 + i }];
        let (x, y) = tokio::join!(a.fire(&fence, &run, &advance), b.fire(&fence, &run, &advance));
        let created = [x.expect("fire a"), y.expect("fire b")].iter().filter(|o| o[0] == FireOutcome::Created).count();
        assert_eq!(created, 1, "round {i}: exactly one of two racing fires creates the run");
    }
    let j = a.get_job("default", &job.name).await.expect("get").expect("exists");
    assert_eq!(j.last_scheduled_at, Some(10_099));
}

pub(super) async fn fire_advances_last_scheduled_at(s: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let job = s.put_job(&job_spec(&unique("adv")), Precondition::DoesNotExist, 1).await.expect("create");
    assert_eq!(job.last_scheduled_at, None);
    let mut skipped = new_run(&job, 2000);
    skipped.state = RunState::Skipped;
    skipped.reason = Some("misfire".into());
    s.fire(&fence, &[new_run(&job, 1000), skipped], &[JobAdvance { job_uid: job.uid.clone(), last_scheduled_at: 2000 }])
        .await
        .expect("fire");
    let j = s.get_job("default", &job.name).await.expect("get").expect("exists");
    assert_eq!(j.last_scheduled_at, Some(2000));
    s.fire(&fence, &[], &[JobAdvance { job_uid: job.uid.clone(), last_scheduled_at: 1500 }]).await.expect("fire");
    let j = s.get_job("default", &job.name).await.expect("get").expect("exists");
    assert_eq!(j.last_scheduled_at, Some(2000), "last_scheduled_at never moves backwards");
    let skipped = s.get_run(&run_id(&job.uid, 2000)).await.expect("get").expect("exists");
    assert_eq!(skipped.run.state, RunState::Skipped);
    assert_eq!(skipped.run.reason.as_deref(), Some("misfire"));
}

/// A manual run and a scheduled one at the same instant are two runs (ids
/// A run's params and payload are stored with it and read back as
/// written, by id, in lists and among the open runs a new leader loads,
/// and a later change of the run keeps them.
pub(super) async fn a_runs_params_and_payload_are_kept_with_it(s: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let job = s.put_job(&job_spec(&unique("params")), Precondition::DoesNotExist, 1).await.expect("create");
    let values = r#"{"date":"2026-12-01","opts":{"dry":true},"region":"eu \u00e9"}"#;
    // A payload as large as a webhook may send, not JSON, with lines and
    // characters past ASCII.
    let mut payload = String::from("line 1\nzweite Zeile: \u{e4}\u{f6}\u{fc} \u{1f600}\n");
    while payload.len() < 64 * 1024 - 8 {
        payload.push_str("0123456789abcdef");
    }
    let with = NewRun { params: Some(values.into()), payload: Some(payload.clone()), ..new_run(&job, 5000) };
    let without = new_run(&job, 6000);
    s.fire(&fence, &[with.clone(), without.clone()], &[]).await.expect("fire");
    let got = s_run(s, &with.id()).await;
    assert_eq!(got.params.as_deref(), Some(values));
    assert!(got.payload.as_deref() == Some(payload.as_str()), "the payload reads back as written");
    let other = s_run(s, &without.id()).await;
    assert_eq!((other.params, other.payload), (None, None));
    let open = s.open_runs().await.expect("open runs");
    let loaded = open.iter().find(|r| r.id == with.id()).expect("open");
    assert_eq!(loaded.params.as_deref(), Some(values));
    assert!(loaded.payload.as_deref() == Some(payload.as_str()));
    let filter = RunFilter { job: Some(job.name.clone()), ..Default::default() };
    let page = s.list_runs(&filter, 10, None).await.expect("list");
    assert_eq!(page.runs.iter().filter(|r| r.params.as_deref() == Some(values)).count(), 1);
    // A change of the run rewrites its record on some stores: the payload
    // stays.
    s.request_cancel(&with.id(), 7000).await.expect("cancel request");
    let got = s_run(s, &with.id()).await;
    assert!(got.payload.as_deref() == Some(payload.as_str()), "a changed run keeps its payload");
}

/// A dependency run is created `waiting` with its upstream record, once
/// per (job, instant) however many fires make it, is loaded among the open
/// runs, is released by a CAS from `waiting`, and a cancel request cancels
/// it at once (it has no attempt).
pub(super) async fn a_dependency_run_waits_and_is_created_once(s: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let up = s.put_job(&job_spec(&unique("up")), Precondition::DoesNotExist, 1).await.expect("create");
    let down = s.put_job(&job_spec(&unique("down")), Precondition::DoesNotExist, 1).await.expect("create");
    let record = std::sync::Arc::new(gnomon_core::deps::RunAfter {
        of: run_id(&up.uid, 5000),
        of_uid: up.uid.clone(),
        edges: vec![gnomon_core::deps::StoredEdge { job: up.name.clone(), uid: up.uid.clone(), on: gnomon_core::deps::On::Succeeded }],
    });
    let waiting = |t: i64| NewRun { state: RunState::Waiting, upstream: Some(record.clone()), ..new_run(&down, t) };
    assert_eq!(waiting(5000).id(), dep_run_id(&down.uid, 5000));
    assert_ne!(waiting(5000).id(), run_id(&down.uid, 5000), "apart from the job's scheduled run of the instant");
    let got = s.fire(&fence, &[new_run(&up, 5000), waiting(5000), new_run(&down, 5000)], &[]).await.expect("fire");
    assert_eq!(got, [FireOutcome::Created; 3]);
    // A second upstream of the same instant (a fan-in) makes it again.
    assert_eq!(s.fire(&fence, &[waiting(5000)], &[]).await.expect("fire"), [FireOutcome::Existed]);
    let id = dep_run_id(&down.uid, 5000);
    let run = s_run(s, &id).await;
    assert_eq!((run.state, run.upstream.as_ref()), (RunState::Waiting, Some(&record)));
    assert!(s.open_runs().await.expect("open").iter().any(|r| r.id == id && r.state == RunState::Waiting));
    let release = tr(&id, RunState::Waiting, 0, RunState::Pending, 0, None);
    assert_eq!(s.transition(&fence, std::slice::from_ref(&release)).await.expect("release"), [true]);
    assert_eq!(s.transition(&fence, &[release]).await.expect("again"), [false], "released once");
    assert_eq!(s_run(s, &id).await.upstream.as_ref(), Some(&record), "a changed run keeps its record");
    s.fire(&fence, &[waiting(6000)], &[]).await.expect("fire");
    let other = dep_run_id(&down.uid, 6000);
    assert_eq!(s.request_cancel(&other, 7000).await.expect("cancel"), CancelOutcome::Cancelled);
    assert_eq!(s_run(s, &other).await.state, RunState::Cancelled);
}

/// A turn as large as a leader writes, of runs as large as they get
/// (64 KiB of params and 64 KiB of payload each, then 64 KiB of output per
/// attempt), is written whole: a store whose requests have a bounded size
/// (an etcd txn, a SQL statement, a Raft entry) splits them by bytes as
/// well as by count.
pub async fn a_turn_of_the_largest_runs_is_written(s: &dyn Store, count: i64) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let job = s.put_job(&job_spec(&unique("large")), Precondition::DoesNotExist, 1).await.expect("create");
    let big = |c: char| std::iter::repeat_n(c, 64 * 1024 - 16).collect::<String>();
    let params = format!(r#"{{"blob":"{}"}}"#, big('p'));
    let runs: Vec<NewRun> =
        (0..count).map(|i| NewRun { params: Some(params.clone()), payload: Some(big('x')), ..new_run(&job, 100_000 + i) }).collect();
    let outcomes = s.fire(&fence, &runs, &[]).await.expect("a fire of runs of 128 KiB each");
    assert!(outcomes.iter().all(|o| *o == FireOutcome::Created), "{outcomes:?}");
    let mut turn = Vec::new();
    for run in &runs {
        let assign = AttemptChange::Assign { attempt: 1, worker: "w".into(), token: fence.token };
        turn.push(tr(&run.id(), RunState::Pending, 0, RunState::Assigned, 1, Some(assign)));
        let end =
            AttemptChange::End { attempt: 1, state: AttemptState::Succeeded, exit_code: Some(0), output: big('o'), started_at: Some(5) };
        turn.push(tr(&run.id(), RunState::Assigned, 1, RunState::Succeeded, 1, Some(end)));
    }
    let applied = s.transition(&fence, &turn).await.expect("a turn of transitions with 64 KiB outputs");
    assert!(applied.iter().all(|a| *a), "every transition applied");
    for run in [&runs[0], &runs[runs.len() - 1]] {
        let detail = s.get_run(&run.id()).await.expect("get").expect("run");
        assert_eq!(detail.run.state, RunState::Succeeded);
        assert_eq!(detail.attempts[0].output.len(), 64 * 1024 - 16);
        assert_eq!(detail.run.payload.as_deref().map(str::len), Some(64 * 1024 - 16));
    }
}

/// A manual run with an idempotency key is one run per (job, key): a
/// second fire of it, later and at another instant, finds it; another key
/// or another job's same key is another run.
pub(super) async fn a_keyed_manual_run_is_created_once(s: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let job = s.put_job(&job_spec(&unique("keyed")), Precondition::DoesNotExist, 1).await.expect("create");
    let other = s.put_job(&job_spec(&unique("keyed")), Precondition::DoesNotExist, 1).await.expect("create");
    let keyed = |job: &JobRecord, t: i64, key: &str| NewRun { manual: true, key: Some(key.into()), ..new_run(job, t) };
    let first = keyed(&job, 8000, "order-42");
    assert_eq!(first.id(), crate::keyed_run_id(&job.uid, "order-42"));
    assert_eq!(s.fire(&fence, std::slice::from_ref(&first), &[]).await.expect("fire"), vec![FireOutcome::Created]);
    let repeat = keyed(&job, 9000, "order-42");
    assert_eq!(repeat.id(), first.id(), "the key, not the instant, names the run");
    let others = [repeat, keyed(&job, 9000, "order-43"), keyed(&other, 9000, "order-42")];
    let outcomes = s.fire(&fence, &others, &[]).await.expect("fire again");
    assert_eq!(outcomes, vec![FireOutcome::Existed, FireOutcome::Created, FireOutcome::Created]);
    let run = s.get_run(&first.id()).await.expect("get").expect("keyed run");
    assert!(run.run.manual);
    assert_eq!(run.run.scheduled_at, 8000, "the repeat changed nothing");
}
/// apart), each still unique.
pub(super) async fn manual_and_scheduled_runs_share_an_instant(s: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let job = s.put_job(&job_spec(&unique("both")), Precondition::DoesNotExist, 1).await.expect("create");
    let mut manual = new_run(&job, 7000);
    manual.manual = true;
    let scheduled = new_run(&job, 7000);
    assert_ne!(manual.id(), scheduled.id());
    let first = s.fire(&fence, &[manual.clone()], &[]).await.expect("fire manual");
    let second = s.fire(&fence, &[scheduled.clone(), manual.clone()], &[]).await.expect("fire scheduled");
    assert_eq!((first, second), (vec![FireOutcome::Created], vec![FireOutcome::Created, FireOutcome::Existed]));
    let again = s.fire(&fence, std::slice::from_ref(&scheduled), &[]).await.expect("fire again");
    assert_eq!(again, vec![FireOutcome::Existed]);
    let m = s.get_run(&manual.id()).await.expect("get").expect("manual run");
    let r = s.get_run(&scheduled.id()).await.expect("get").expect("scheduled run");
    assert!(m.run.manual && !r.run.manual);
    assert_eq!((m.run.scheduled_at, r.run.scheduled_at), (7000, 7000));
}

pub(super) async fn stale_token_writes_are_rejected(a: &dyn Store, b: &dyn Store) {
    let scope = unique("scope");
    let old = lead(a, &scope).await;
    let job = a.put_job(&job_spec(&unique("fence")), Precondition::DoesNotExist, 1).await.expect("create");
    a.fire(&old, &[new_run(&job, 1000)], &[]).await.expect("fire under the current token");
    let rid = run_id(&job.uid, 1000);
    // A newer leader takes over through another handle.
    let new = lead(b, &scope).await;
    assert!(new.token > old.token, "tokens strictly increase across terms");
    // Interleave stale and current writes: every stale one is rejected and
    // counted in gnomon_fencing_rejections_total.
    let rejections_before = crate::fencing_rejections();
    for i in 0..5i64 {
        match a.fire(&old, &[new_run(&job, 5000 + i)], &[JobAdvance { job_uid: job.uid.clone(), last_scheduled_at: 5000 + i }]).await {
            Err(StoreError::Fenced { token, current, .. }) => assert_eq!((token, current), (old.token, new.token)),
            other => panic!("a stale fire must be fenced, got {other:?}"),
        }
        b.fire(&new, &[new_run(&job, 9000 + i)], &[]).await.expect("the current leader writes");
    }
    let assign = tr(
        &rid,
        RunState::Pending,
        0,
        RunState::Assigned,
        1,
        Some(AttemptChange::Assign { attempt: 1, worker: "w".into(), token: old.token }),
    );
    assert!(matches!(a.transition(&old, std::slice::from_ref(&assign)).await, Err(StoreError::Fenced { .. })));
    assert!(crate::fencing_rejections() >= rejections_before + 6, "every stale write is counted as a fencing rejection");
    assert!(s_run(a, &rid).await.state == RunState::Pending, "a fenced write changes nothing");
    assert!(a.get_run(&run_id(&job.uid, 5000)).await.expect("get").is_none());
    let j = a.get_job("default", &job.name).await.expect("get").expect("exists");
    assert_eq!(j.last_scheduled_at, None, "a fenced advance changes nothing");
    // The old term cannot come back.
    match a.fence(&old, &LeaderInfo::default(), 2).await {
        Err(StoreError::StaleToken { .. }) => {}
        other => panic!("re-fencing with an old token must fail, got {other:?}"),
    }
    assert!(
        matches!(a.fence(&new, &LeaderInfo::default(), 2).await, Err(StoreError::StaleToken { .. })),
        "fence requires a strictly higher token"
    );
    let record = a.leadership(&scope).await.expect("leadership").expect("exists");
    assert_eq!(record.token, new.token);
    // The epoch counter always outruns the fenced token.
    assert!(a.next_epoch(&scope).await.expect("epoch") > new.token);
    assert!(b.transition(&new, std::slice::from_ref(&assign)).await.expect("current leader transitions")[0]);
}

pub(super) async fn s_run(s: &dyn Store, id: &str) -> RunRecord {
    s.get_run(id).await.expect("get_run").expect("run exists").run
}

pub(super) async fn cas_transitions_and_terminal_finality(s: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let job = s.put_job(&job_spec(&unique("cas")), Precondition::DoesNotExist, 1).await.expect("create");
    s.fire(&fence, &[new_run(&job, 1000)], &[]).await.expect("fire");
    let rid = run_id(&job.uid, 1000);
    let assign1 = tr(
        &rid,
        RunState::Pending,
        0,
        RunState::Assigned,
        1,
        Some(AttemptChange::Assign { attempt: 1, worker: "w1".into(), token: fence.token }),
    );
    assert_eq!(s.transition(&fence, std::slice::from_ref(&assign1)).await.expect("assign"), vec![true]);
    assert_eq!(
        s.transition(&fence, std::slice::from_ref(&assign1)).await.expect("assign again"),
        vec![false],
        "a CAS from a state the run left fails"
    );
    // Recovery reads the worker of every live attempt.
    let live = s.live_attempts().await.expect("live attempts");
    let expected = LiveAttempt { run_id: rid.clone(), attempt: 1, worker: "w1".into(), assigned_at: 5, started_at: None };
    assert!(live.contains(&expected), "{live:?}");
    let wrong_attempt = tr(&rid, RunState::Assigned, 7, RunState::Running, 7, Some(AttemptChange::Start { attempt: 7 }));
    assert_eq!(s.transition(&fence, &[wrong_attempt]).await.expect("t"), vec![false], "a wrong attempt fails");
    // …with when it was assigned and when its worker started it, so a new
    // leader measures its timeout from its start, never from its own term.
    let start = Transition { at: 77, ..tr(&rid, RunState::Assigned, 1, RunState::Running, 1, Some(AttemptChange::Start { attempt: 1 })) };
    assert_eq!(s.transition(&fence, &[start]).await.expect("start"), vec![true]);
    let live = s.live_attempts().await.expect("live attempts");
    assert!(live.contains(&LiveAttempt { started_at: Some(77), ..expected }), "{live:?}");
    let batch = [
        tr(
            &rid,
            RunState::Running,
            1,
            RunState::Retrying,
            1,
            Some(AttemptChange::End { attempt: 1, state: AttemptState::Lost, exit_code: None, output: String::new(), started_at: None }),
        ),
        tr(&rid, RunState::Retrying, 1, RunState::Pending, 1, None),
        tr(
            &rid,
            RunState::Pending,
            1,
            RunState::Assigned,
            2,
            Some(AttemptChange::Assign { attempt: 2, worker: "w2".into(), token: fence.token }),
        ),
        tr(
            &rid,
            RunState::Assigned,
            2,
            RunState::Succeeded,
            2,
            Some(AttemptChange::End {
                attempt: 2,
                state: AttemptState::Succeeded,
                exit_code: Some(0),
                output: "hi\n".into(),
                started_at: None,
            }),
        ),
        // A late report for the superseded attempt 1 must not apply.
        tr(
            &rid,
            RunState::Running,
            1,
            RunState::Succeeded,
            1,
            Some(AttemptChange::End {
                attempt: 1,
                state: AttemptState::Succeeded,
                exit_code: Some(0),
                output: "late".into(),
                started_at: None,
            }),
        ),
    ];
    assert_eq!(s.transition(&fence, &batch).await.expect("batch"), vec![true, true, true, true, false]);
    let detail = s.get_run(&rid).await.expect("get").expect("exists");
    assert_eq!((detail.run.state, detail.run.attempt), (RunState::Succeeded, 2));
    let states: Vec<(u32, AttemptState, &str)> = detail.attempts.iter().map(|a| (a.attempt, a.state, a.worker.as_str())).collect();
    assert_eq!(states, vec![(1, AttemptState::Lost, "w1"), (2, AttemptState::Succeeded, "w2")]);
    assert_eq!(detail.attempts[1].output, "hi\n");
    assert_eq!(detail.attempts[1].exit_code, Some(0));
    assert!(!s.live_attempts().await.expect("live attempts").iter().any(|a| a.run_id == rid), "a finished run has no live attempt");
    // Terminal states are final: the lifecycle has no edge out of them.
    for to in gnomon_core::run::ALL_RUN_STATES {
        let t = tr(&rid, RunState::Succeeded, 2, to, 3, None);
        assert!(matches!(s.transition(&fence, &[t]).await, Err(StoreError::InvalidTransition { .. })), "succeeded -> {to} must be refused");
    }
    assert_eq!(s_run(s, &rid).await.state, RunState::Succeeded);
}

/// A leader turn's write: new runs fired and, in the same call, a run just
/// fired assigned and an older one finished. Fenced as a whole.
pub(super) async fn a_turn_is_one_write(a: &dyn Store, b: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(a, &scope).await;
    let job = a.put_job(&job_spec(&unique("turn")), Precondition::DoesNotExist, 1).await.expect("create");
    a.fire(&fence, &[new_run(&job, 1000)], &[]).await.expect("fire");
    let old = run_id(&job.uid, 1000);
    let assign_old = tr(
        &old,
        RunState::Pending,
        0,
        RunState::Assigned,
        1,
        Some(AttemptChange::Assign { attempt: 1, worker: "w".into(), token: fence.token }),
    );
    assert_eq!(a.transition(&fence, &[assign_old]).await.expect("assign"), vec![true]);
    let fresh = run_id(&job.uid, 2000);
    let batch = [
        tr(
            &old,
            RunState::Assigned,
            1,
            RunState::Succeeded,
            1,
            Some(AttemptChange::End {
                attempt: 1,
                state: AttemptState::Succeeded,
                exit_code: Some(0),
                output: "ok".into(),
                started_at: Some(4),
            }),
        ),
        tr(
            &fresh,
            RunState::Pending,
            0,
            RunState::Assigned,
            1,
            Some(AttemptChange::Assign { attempt: 1, worker: "w".into(), token: fence.token }),
        ),
    ];
    let advance = [JobAdvance { job_uid: job.uid.clone(), last_scheduled_at: 2000 }];
    // Fire 1000 again (it exists) and 2000 (new).
    let wrote = a.write_turn(&fence, &turn(&[new_run(&job, 1000), new_run(&job, 2000)], &advance, &batch)).await.expect("turn write");
    assert_eq!(wrote.fired, vec![FireOutcome::Existed, FireOutcome::Created]);
    assert_eq!(wrote.applied.expect("transitions"), vec![true, true]);
    let ended = a.get_run(&old).await.expect("get").expect("exists");
    assert_eq!(ended.run.state, RunState::Succeeded);
    // Ended without a recorded start: the end brings the worker's start time.
    assert_eq!((ended.attempts[0].started_at, ended.attempts[0].ended_at), (Some(4), Some(5)));
    let detail = a.get_run(&fresh).await.expect("get").expect("the fired run exists");
    assert_eq!((detail.run.state, detail.run.attempt, detail.attempts.len()), (RunState::Assigned, 1, 1));
    assert_eq!(a.get_job("default", &job.name).await.expect("get").expect("exists").last_scheduled_at, Some(2000));
    // A newer term fences the whole write out: nothing of it lands.
    let _new = lead(b, &scope).await;
    let stale = [tr(&fresh, RunState::Assigned, 1, RunState::Running, 1, Some(AttemptChange::Start { attempt: 1 }))];
    let r = a.write_turn(&fence, &turn(&[new_run(&job, 3000)], &[], &stale)).await;
    assert!(matches!(r, Err(StoreError::Fenced { .. })), "a stale turn write is fenced, got {r:?}");
    assert!(a.get_run(&run_id(&job.uid, 3000)).await.expect("get").is_none());
    assert_eq!(s_run(a, &fresh).await.state, RunState::Assigned);
}

/// A burst's turn write (more runs than any one statement takes): runs that
/// exist already among new ones, one twice in the batch, and an assignment
/// of every third run, new or existing, in the same write.
pub(super) async fn a_large_turn_write_mixes_new_existing_and_folded_runs(s: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(s, &scope).await;
    let job = s.put_job(&job_spec(&unique("burst")), Precondition::DoesNotExist, 1).await.expect("create");
    // Every tenth instant exists (pending) before the burst.
    let existing: Vec<NewRun> = (0..300).filter(|i| i % 10 == 0).map(|i| new_run(&job, 10_000 + i)).collect();
    s.fire(&fence, &existing, &[]).await.expect("fire the existing ones");
    let mut runs: Vec<NewRun> = (0..300).map(|i| new_run(&job, 10_000 + i)).collect();
    runs.push(new_run(&job, 10_001)); // twice in one batch
    let assign = |i: i64| {
        tr(
            &run_id(&job.uid, 10_000 + i),
            RunState::Pending,
            0,
            RunState::Assigned,
            1,
            Some(AttemptChange::Assign { attempt: 1, worker: "w".into(), token: fence.token }),
        )
    };
    let batch: Vec<Transition> = (0..300).filter(|i| i % 3 == 0).map(assign).collect();
    let wrote = s.write_turn(&fence, &turn(&runs, &[], &batch)).await.expect("turn write");
    let expected: Vec<FireOutcome> =
        (0..300).map(|i| if i % 10 == 0 { FireOutcome::Existed } else { FireOutcome::Created }).chain([FireOutcome::Created]).collect();
    assert_eq!(wrote.fired, expected, "existing runs are reported existed, the rest created (a repeat as its first)");
    assert!(wrote.applied.expect("transitions").iter().all(|a| *a), "every pending run, new or existing, is assigned");
    for i in 0..300 {
        let detail = s.get_run(&run_id(&job.uid, 10_000 + i)).await.expect("get").expect("every run exists once");
        let (state, attempts) = if i % 3 == 0 { (RunState::Assigned, 1) } else { (RunState::Pending, 0) };
        assert_eq!((detail.run.state, detail.attempts.len()), (state, attempts), "run {i}");
    }
    let page = s.list_runs(&RunFilter { job: Some(job.name.clone()), ..Default::default() }, 1000, None).await.expect("list");
    assert_eq!(page.runs.len(), 300, "no run written twice");
}
