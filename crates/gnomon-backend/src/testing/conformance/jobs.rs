//! Job writes, preconditions, the change feed and the reads a rebuilding
//! leader makes.

use super::fixtures::*;
use crate::*;

pub(super) async fn jobs_and_preconditions(s: &dyn Store) {
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

pub(super) async fn job_change_feed(a: &dyn Store, b: &dyn Store) {
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

/// What a rebuilding leader reads: every job's head at a feed position
/// (nothing at or below it appears later), and whole jobs by uid.
pub(super) async fn job_heads_and_reads_by_uid(a: &dyn Store, b: &dyn Store) {
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

/// A resume settles a job's timeline up to it when nothing was due
/// between its last fire and its pause (the pause's times never fire), and
/// leaves it to the leader when something was.
pub(super) async fn a_resume_settles_the_timeline_when_nothing_is_left_to_fire(s: &dyn Store) {
    // Every second, created at 1: nothing due by 500, two times by 2500.
    let quiet = s.put_job(&job_spec(&unique("quiet")), Precondition::DoesNotExist, 1).await.expect("create");
    s.set_job_paused(&quiet.namespace, &quiet.name, true, 500).await.expect("pause");
    let resumed = s.set_job_paused(&quiet.namespace, &quiet.name, false, 5000).await.expect("resume");
    assert_eq!((resumed.resumed_at, resumed.last_scheduled_at), (Some(5000), Some(4999)), "settled up to the resume");
    // Resuming a job that runs changes nothing.
    let again = s.set_job_paused(&quiet.namespace, &quiet.name, false, 6000).await.expect("resume again");
    assert_eq!((again.resumed_at, again.last_scheduled_at), (Some(5000), Some(4999)));
    let due = s.put_job(&job_spec(&unique("due")), Precondition::DoesNotExist, 1).await.expect("create");
    s.set_job_paused(&due.namespace, &due.name, true, 2500).await.expect("pause");
    let resumed = s.set_job_paused(&due.namespace, &due.name, false, 5000).await.expect("resume");
    assert_eq!((resumed.resumed_at, resumed.last_scheduled_at), (Some(5000), None), "the times before the pause still fire");
}
