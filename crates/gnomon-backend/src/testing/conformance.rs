//! Conformance suites shared by every backend, in the manner of openraft's
//! `Suite::test_all(builder)`. A backend's tests call [`store_suite`] with a
//! builder that opens a *new handle to the same database* each time (so
//! concurrent handles behave like separate servers), and [`elector_suite`]
//! with an elector over a store.
//!
//! The suites panic with a description on the first violation.

use std::future::Future;
use std::sync::Arc;

use gnomon_core::spec::{parse_job_json, JobSpec};
use gnomon_core::{AttemptState, RunState};

use crate::*;

pub(super) fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// A valid job spec (`every: 1s`, `shell: true`) named `name`.
pub fn job_spec(name: &str) -> JobSpec {
    parse_job_json(format!(r#"{{"name":"{name}","schedule":{{"every":"1s"}},"executor":{{"shell":{{"command":"true"}}}}}}"#).as_bytes())
        .and_then(|s| s.compile())
        .map(|c| c.spec)
        .expect("suite job spec is valid")
}

pub(super) fn new_run(job: &JobRecord, t: i64) -> NewRun {
    NewRun {
        job_uid: job.uid.clone(),
        namespace: job.namespace.clone(),
        job: job.name.clone(),
        scheduled_at: t,
        fired_at: t + 1,
        state: RunState::Pending,
        reason: None,
        manual: false,
    }
}

pub(super) fn tr(run: &str, from: RunState, fa: u32, to: RunState, ta: u32, attempt: Option<AttemptChange>) -> Transition {
    Transition {
        run_id: run.into(),
        from,
        from_attempt: fa,
        to,
        to_attempt: ta,
        reason: None,
        next_attempt_at: None,
        attempt,
        at: 5,
        notify: Vec::new(),
    }
}

/// Takes a fresh term on `scope` and returns its fence.
pub(super) async fn lead(store: &dyn Store, scope: &str) -> Fence {
    let token = store.next_epoch(scope).await.expect("next_epoch");
    let fence = Fence { scope: scope.into(), token };
    store
        .fence(&fence, &LeaderInfo { holder: "suite".into(), address: "127.0.0.1:0".into(), backend: "test".into() }, 1)
        .await
        .expect("fence");
    fence
}

/// Runs every store test. `open` must return a new handle to one shared database.
pub async fn store_suite<F, Fut>(open: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    let a = open().await;
    let b = open().await;
    jobs_and_preconditions(a.as_ref()).await;
    job_change_feed(a.as_ref(), b.as_ref()).await;
    fire_uniqueness_under_concurrency(a.clone(), b.clone()).await;
    two_servers_race_fire_in_a_tight_loop(a.clone(), b.clone()).await;
    fire_advances_last_scheduled_at(a.as_ref()).await;
    job_heads_and_reads_by_uid(a.as_ref(), b.as_ref()).await;
    manual_and_scheduled_runs_share_an_instant(a.as_ref()).await;
    stale_token_writes_are_rejected(a.as_ref(), b.as_ref()).await;
    cas_transitions_and_terminal_finality(a.as_ref()).await;
    fire_and_transition_in_one_write(a.as_ref(), b.as_ref()).await;
    a_large_turn_write_mixes_new_existing_and_folded_runs(a.as_ref()).await;
    pagination_is_stable_under_inserts(a.as_ref()).await;
    cancel_requests(a.as_ref()).await;
    leader_time_only_moves_forward(a.as_ref(), b.as_ref()).await;
    super::notifications::notifications_ride_with_their_transition(a.as_ref(), b.as_ref()).await;
    retention_deletes_only_old_terminal_runs(a.as_ref()).await;
}

async fn jobs_and_preconditions(s: &dyn Store) {
    let name = unique("crud");
    let spec = job_spec(&name);
    let j1 = s.put_job(&spec, Precondition::DoesNotExist, 10).await.expect("create");
    assert_eq!((j1.version, j1.paused, j1.namespace.as_str()), (1, false, "default"));
    assert!(matches!(s.put_job(&spec, Precondition::DoesNotExist, 11).await, Err(StoreError::AlreadyExists(_))));
    let j2 = s.put_job(&spec, Precondition::MatchesVersion(1), 12).await.expect("update at version 1");
    assert_eq!(j2.version, 2);
    assert_eq!(j2.uid, j1.uid, "an update keeps the job's identity");
    match s.put_job(&spec, Precondition::MatchesVersion(1), 13).await {
        Err(StoreError::VersionConflict { expected: 1, actual: 2, .. }) => {}
        other => panic!("stale version must conflict, got {other:?}"),
    }
    assert!(matches!(s.put_job(&job_spec(&unique("nope")), Precondition::MatchesVersion(1), 13).await, Err(StoreError::NotFound(_))));
    let paused = s.set_job_paused("default", &name, true, 14).await.expect("pause");
    assert!(paused.paused && paused.version == 3);
    assert_eq!((paused.paused_at, paused.resumed_at), (Some(14), None), "the pause is timed");
    let again = s.set_job_paused("default", &name, true, 15).await.expect("pause again");
    assert_eq!(again.paused_at, Some(14), "pausing a paused job does not move its pause time");
    let resumed = s.set_job_paused("default", &name, false, 16).await.expect("resume");
    assert_eq!((resumed.paused, resumed.paused_at, resumed.resumed_at), (false, Some(14), Some(16)));
    let edited = s.put_job(&spec, Precondition::None, 17).await.expect("edit");
    assert_eq!((edited.paused_at, edited.resumed_at), (Some(14), Some(16)), "an edit keeps them");
    let paused = s.set_job_paused("default", &name, true, 18).await.expect("pause");
    assert_eq!(paused.version, 7);
    assert!(matches!(s.delete_job("default", &name, Precondition::MatchesVersion(1)).await, Err(StoreError::VersionConflict { .. })));
    s.delete_job("default", &name, Precondition::None).await.expect("delete");
    assert!(s.get_job("default", &name).await.expect("get").is_none());
    assert!(matches!(s.delete_job("default", &name, Precondition::None).await, Err(StoreError::NotFound(_))));
    let mut other = spec.clone();
    other.schedule.every = Some("7s".into());
    let created = s.put_job(&other, Precondition::DoesNotExist, 20).await.expect("create");
    assert_eq!((created.schedule_changed_at, created.previous_schedule.clone()), (None, None));
    let changed = s.put_job(&spec, Precondition::None, 21).await.expect("change the schedule");
    assert_eq!(changed.schedule_changed_at, Some(21), "a schedule change is timed");
    assert_eq!(changed.previous_schedule.as_ref().and_then(|p| p.every.as_deref()), Some("7s"), "and keeps the old schedule");
    let mut retried = spec.clone();
    retried.description = Some("same schedule".into());
    let kept = s.put_job(&retried, Precondition::None, 22).await.expect("edit, same schedule");
    assert_eq!((kept.schedule_changed_at, kept.previous_schedule), (Some(21), changed.previous_schedule), "an edit keeps them");
    s.delete_job("default", &name, Precondition::None).await.expect("delete");
    let again = s.put_job(&spec, Precondition::DoesNotExist, 15).await.expect("recreate");
    assert_ne!(again.uid, j1.uid, "a recreated job is a new identity");
    assert_eq!(again.version, 1);
}

async fn job_change_feed(a: &dyn Store, b: &dyn Store) {
    let start = a.job_changes(0).await.expect("changes").seq;
    let name = unique("feed");
    let created = b.put_job(&job_spec(&name), Precondition::DoesNotExist, 1).await.expect("create via b");
    let changes = a.job_changes(start).await.expect("changes");
    assert!(changes.upserted.iter().any(|j| j.uid == created.uid), "a job written through another handle shows in the feed");
    assert!(changes.seq > start);
    b.delete_job("default", &name, Precondition::None).await.expect("delete");
    let after = a.job_changes(changes.seq).await.expect("changes");
    assert_eq!(after.deleted, vec![created.uid.clone()]);
    assert!(after.upserted.iter().all(|j| j.uid != created.uid));
    let idle = a.job_changes(after.seq).await.expect("changes");
    assert!(idle.upserted.is_empty() && idle.deleted.is_empty() && idle.seq == after.seq);
}

async fn fire_uniqueness_under_concurrency(a: Arc<dyn Store>, b: Arc<dyn Store>) {
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
async fn two_servers_race_fire_in_a_tight_loop(a: Arc<dyn Store>, b: Arc<dyn Store>) {
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

async fn fire_advances_last_scheduled_at(s: &dyn Store) {
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

/// What a rebuilding leader reads: every job's head at a feed position
/// (nothing at or below it appears later), and whole jobs by uid.
async fn job_heads_and_reads_by_uid(a: &dyn Store, b: &dyn Store) {
    let scope = unique("scope");
    let fence = lead(a, &scope).await;
    let one = a.put_job(&job_spec(&unique("head")), Precondition::DoesNotExist, 1).await.expect("create");
    let two = b.put_job(&job_spec(&unique("head")), Precondition::DoesNotExist, 1).await.expect("create");
    let two = b.put_job(&two.spec, Precondition::MatchesVersion(1), 2).await.expect("edit");
    a.fire(&fence, &[new_run(&one, 5000)], &[JobAdvance { job_uid: one.uid.clone(), last_scheduled_at: 5000 }]).await.expect("fire");
    let heads = a.job_heads().await.expect("heads");
    let head = |uid: &str| heads.heads.iter().find(|h| h.uid == uid).cloned();
    assert_eq!(head(&one.uid), Some(JobHead { uid: one.uid.clone(), version: 1, last_scheduled_at: Some(5000) }));
    assert_eq!(head(&two.uid), Some(JobHead { uid: two.uid.clone(), version: 2, last_scheduled_at: None }));
    assert!(
        a.job_changes(heads.seq).await.expect("changes").upserted.iter().all(|j| j.uid != one.uid && j.uid != two.uid),
        "the heads' feed position covers the writes they show"
    );
    b.set_job_paused("default", &two.name, true, 3).await.expect("pause");
    let after = a.job_changes(heads.seq).await.expect("changes");
    assert!(after.upserted.iter().any(|j| j.uid == two.uid && j.version == 3), "a later write follows the heads' position");
    let mut got = a.jobs_by_uid(&[two.uid.clone(), "no-such-uid".into(), one.uid.clone()]).await.expect("by uid");
    got.sort_by_key(|j| j.version);
    assert_eq!(got.iter().map(|j| (j.uid.as_str(), j.version)).collect::<Vec<_>>(), vec![(one.uid.as_str(), 1), (two.uid.as_str(), 3)]);
    assert_eq!(got[0].spec, one.spec);
    assert_eq!(got[0].last_scheduled_at, Some(5000));
    assert!(a.jobs_by_uid(&[]).await.expect("by uid").is_empty());
}

/// A manual run and a scheduled one at the same instant are two runs (ids
/// apart), each still unique.
async fn manual_and_scheduled_runs_share_an_instant(s: &dyn Store) {
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

async fn stale_token_writes_are_rejected(a: &dyn Store, b: &dyn Store) {
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

async fn s_run(s: &dyn Store, id: &str) -> RunRecord {
    s.get_run(id).await.expect("get_run").expect("run exists").run
}

async fn cas_transitions_and_terminal_finality(s: &dyn Store) {
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
    assert!(live.contains(&LiveAttempt { run_id: rid.clone(), attempt: 1, worker: "w1".into() }), "{live:?}");
    let wrong_attempt = tr(&rid, RunState::Assigned, 7, RunState::Running, 7, Some(AttemptChange::Start { attempt: 7 }));
    assert_eq!(s.transition(&fence, &[wrong_attempt]).await.expect("t"), vec![false], "a wrong attempt fails");
    let batch = [
        tr(&rid, RunState::Assigned, 1, RunState::Running, 1, Some(AttemptChange::Start { attempt: 1 })),
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
    assert_eq!(s.transition(&fence, &batch).await.expect("batch"), vec![true, true, true, true, true, false]);
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
async fn fire_and_transition_in_one_write(a: &dyn Store, b: &dyn Store) {
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
    let wrote = a.fire_and_transition(&fence, &[new_run(&job, 1000), new_run(&job, 2000)], &advance, &batch).await.expect("turn write");
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
    let r = a.fire_and_transition(&fence, &[new_run(&job, 3000)], &[], &stale).await;
    assert!(matches!(r, Err(StoreError::Fenced { .. })), "a stale turn write is fenced, got {r:?}");
    assert!(a.get_run(&run_id(&job.uid, 3000)).await.expect("get").is_none());
    assert_eq!(s_run(a, &fresh).await.state, RunState::Assigned);
}

/// A burst's turn write (more runs than any one statement takes): runs that
/// exist already among new ones, one twice in the batch, and an assignment
/// of every third run, new or existing, in the same write.
async fn a_large_turn_write_mixes_new_existing_and_folded_runs(s: &dyn Store) {
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
    let wrote = s.fire_and_transition(&fence, &runs, &[], &batch).await.expect("turn write");
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

async fn pagination_is_stable_under_inserts(s: &dyn Store) {
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

async fn cancel_requests(s: &dyn Store) {
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
async fn leader_time_only_moves_forward(a: &dyn Store, b: &dyn Store) {
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
async fn retention_deletes_only_old_terminal_runs(s: &dyn Store) {
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
    assert!(s.prune(&fence, 3, 0, 10_000).await.expect("prune") >= 7);
    assert_eq!(mine().await, vec![9000, 8000, 7000], "the newest three runs are kept");
    assert!(s.get_run(&runs[0].id()).await.expect("get").is_none(), "a pruned run is gone");
    // By age: everything terminal fired before the kept terminal run's
    // fire time (1_007_001) and a millisecond.
    s.prune(&fence, 1000, 1_007_002, 10_000).await.expect("prune by age");
    assert_eq!(mine().await, vec![9000, 8000], "only the open runs are left");
    // Even with nothing to keep, open runs stay.
    s.prune(&fence, 0, i64::MAX, 10_000).await.expect("prune all");
    assert_eq!(mine().await, vec![9000, 8000], "open runs are never pruned");
    // The size is reported, and the SQL stores' is that of their database.
    assert!(s.size_bytes().await.unwrap_or(0) > 0, "{} reports its size", s.backend());
    // A stale term may not prune.
    let newer = Fence { scope: fence.scope.clone(), token: fence.token + 1 };
    s.fence(&newer, &LeaderInfo::default(), 2).await.expect("newer term");
    assert!(matches!(s.prune(&fence, 0, i64::MAX, 10).await, Err(StoreError::Fenced { .. })), "a stale term's prune is fenced");
}

/// Runs every elector test against `elector`, which must be backed by `store`.
pub async fn elector_suite(store: Arc<dyn Store>, elector: Arc<dyn Elector>) {
    let scope = unique("scope");
    let me = LeaderInfo { holder: "node-a".into(), address: "127.0.0.1:7400".into(), backend: String::new() };
    let first = elector.campaign(&scope, &me).await.expect("campaign");
    assert!(!*first.lost.borrow(), "a fresh term is not lost");
    let record = store.leadership(&scope).await.expect("leadership").expect("fenced on win");
    assert_eq!(record.token, first.token, "the elector fences the store before returning");
    assert_eq!(record.holder, "node-a");
    let mut lost = first.lost.clone();
    elector.resign(&first).await.expect("resign");
    tokio::time::timeout(std::time::Duration::from_secs(5), lost.wait_for(|l| *l))
        .await
        .expect("loss is signalled promptly")
        .expect("watch");
    let second = elector.campaign(&scope, &me).await.expect("campaign again");
    assert!(second.token > first.token, "tokens strictly increase across terms");
    let fence = Fence { scope: scope.clone(), token: first.token };
    assert!(matches!(store.fire(&fence, &[], &[]).await, Err(StoreError::Fenced { .. })), "the old term's writes are fenced");
    store.fire(&Fence { scope: scope.clone(), token: second.token }, &[], &[]).await.expect("the new term writes");
    elector.resign(&second).await.expect("resign");
}

/// A backend's hooks for [`contested_elector_suite`].
#[async_trait::async_trait]
pub trait ElectorFixture: Send + Sync {
    /// The store every candidate fences.
    fn store(&self) -> Arc<dyn Store>;
    /// A new candidate with connections of its own, as another server would have.
    async fn candidate(&self) -> Arc<dyn Elector>;
    /// Takes leadership of `scope` away from its holder from outside (kills
    /// its lock connection, revokes its lease), as a crash or partition would.
    async fn sever(&self, scope: &str);
    /// The longest a holder may take to notice a sever (generous: shared machines).
    fn loss_bound(&self) -> std::time::Duration;
}

async fn within<T>(what: &str, bound: std::time::Duration, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(bound, f).await.unwrap_or_else(|_| panic!("{what} did not happen within {bound:?}"))
}

/// The elector tests that need competing candidates: one leader at a time;
/// resign hands over promptly; tokens strictly grow across terms and
/// candidates; a severed leader is told it lost, and its writes are fenced
/// once the next leader starts.
pub async fn contested_elector_suite(fx: &dyn ElectorFixture) {
    use std::time::Duration;
    let store = fx.store();
    let scope = unique("contest");
    let info = |n: &str| LeaderInfo { holder: n.into(), address: format!("{n}.invalid:7400"), backend: String::new() };
    let (a, b, c) = (fx.candidate().await, fx.candidate().await, fx.candidate().await);
    // The single-candidate properties hold for this backend too.
    elector_suite(store.clone(), a.clone()).await;

    let first = within("the first campaign", Duration::from_secs(20), a.campaign(&scope, &info("a"))).await.expect("a campaigns");
    let (b2, c2, scope2) = (b.clone(), c.clone(), scope.clone());
    let mut b_task = tokio::spawn(async move { b2.campaign(&scope2, &info("b")).await });
    let scope3 = scope.clone();
    let mut c_task = tokio::spawn(async move { c2.campaign(&scope3, &info("c")).await });
    // While `a` leads, neither contender wins (3 s of the lock being held).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!b_task.is_finished() && !c_task.is_finished(), "a second candidate won while the first still leads");
    assert!(!*first.lost.borrow(), "the leader lost its term while nobody touched it");

    // Resign hands over promptly to exactly one contender.
    let mut first_lost = first.lost.clone();
    let t0 = std::time::Instant::now();
    a.resign(&first).await.expect("resign");
    within("loss after resign", Duration::from_secs(2), first_lost.wait_for(|l| *l)).await.expect("watch");
    let (second, waiting, loser) = tokio::select! {
        r = &mut b_task => (r.expect("join").expect("b campaigns"), c_task, c.clone()),
        r = &mut c_task => (r.expect("join").expect("c campaigns"), b_task, b.clone()),
        _ = tokio::time::sleep(Duration::from_secs(10)) => panic!("nobody took over within 10 s of a resign"),
    };
    let handover = t0.elapsed();
    assert!(handover < Duration::from_secs(10), "handover took {handover:?}");
    assert!(second.token > first.token, "the next term's token {} is not above {}", second.token, first.token);
    let mut waiting = waiting;
    tokio::time::sleep(Duration::from_secs(2)).await;
    if waiting.is_finished() {
        match (&mut waiting).await.expect("join") {
            Ok(l) => panic!("two candidates lead at once after a handover: tokens {} and {}", second.token, l.token),
            Err(e) => panic!("a waiting candidate's campaign failed after a handover: {e}"),
        }
    }
    let winner = if Arc::ptr_eq(&loser, &b) { c.clone() } else { b.clone() };

    // A severed leader learns it lost; the next one is fenced in above it.
    let mut second_lost = second.lost.clone();
    fx.sever(&scope).await;
    within("loss after a sever", fx.loss_bound(), second_lost.wait_for(|l| *l)).await.expect("watch");
    let third = within("takeover after a sever", fx.loss_bound() + Duration::from_secs(10), &mut waiting)
        .await
        .expect("join")
        .expect("the waiting candidate campaigns");
    assert!(third.token > second.token, "token after a sever: {} is not above {}", third.token, second.token);
    let stale = Fence { scope: scope.clone(), token: second.token };
    assert!(matches!(store.fire(&stale, &[], &[]).await, Err(StoreError::Fenced { .. })), "the severed leader's writes are fenced");
    store.fire(&Fence { scope: scope.clone(), token: third.token }, &[], &[]).await.expect("the new leader writes");
    let _ = winner.resign(&second).await;
    loser.resign(&third).await.expect("resign");
    assert_eq!(store.leadership(&scope).await.expect("leadership").map(|r| r.token), Some(third.token));
}
