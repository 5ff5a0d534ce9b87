//! The tests of the job timeline and its invariants.

use crate::timeline::JobTimeline;
use crate::HashMap;
use gnomon_core::Millis;
use gnomon_records::JobRecord;

use gnomon_core::spec::parse_job_json;

fn record(uid: &str, every: &str, version: u64, paused: bool) -> JobRecord {
    record_of(uid, &format!(r#"{{"every":"{every}"}}"#), version, paused)
}

fn record_of(uid: &str, schedule: &str, version: u64, paused: bool) -> JobRecord {
    let json = format!(r#"{{"name":"{uid}","schedule":{schedule},"executor":{{"handler":{{"name":"noop"}}}}}}"#);
    let spec = parse_job_json(json.as_bytes()).unwrap().compile().unwrap().spec;
    JobRecord {
        uid: uid.into(),
        namespace: "default".into(),
        name: uid.into(),
        spec,
        version,
        paused,
        created_at: 0,
        updated_at: 0,
        last_scheduled_at: None,
        paused_at: None,
        resumed_at: None,
        schedule_changed_at: None,
        previous_schedule: None,
        change_seq: version,
    }
}

/// A scheduled job with a next instant has a timer entry at its
/// generation.
fn check(t: &JobTimeline) {
    for (uid, j) in &t.jobs {
        if j.record.paused && j.carry.is_none() {
            continue;
        }
        let armed = t.timer.iter().any(|(_, u, g)| u == uid && *g == j.generation);
        assert!(armed || j.schedule.next_after(j.base()).is_none(), "{uid} has no timer entry at generation {}", j.generation);
    }
}

#[test]
fn a_job_comes_due_on_its_schedule_and_its_fires_move_it_on() {
    let mut t = JobTimeline::default();
    t.upsert(record("a", "1s", 1, false), 0, &HashMap::default());
    check(&t);
    assert_eq!(t.next_due(|_| false), Some(1_000));
    assert!(t.take_due(999, 10, |_| false).is_empty());
    assert_eq!(t.take_due(1_500, 10, |_| false), ["a"]);
    t.fired("a", Some(1_000), false, false, 1_500);
    check(&t);
    assert_eq!(t.get("a").and_then(|j| j.record.last_scheduled_at), Some(1_000));
    assert_eq!(t.next_due(|_| false), Some(2_000));
    t.fired("a", Some(500), false, false, 1_600);
    assert_eq!(t.get("a").and_then(|j| j.record.last_scheduled_at), Some(1_000), "the last fire never goes back");
}

#[test]
fn a_new_version_outdates_the_timer_entries_of_the_old_one() {
    let mut t = JobTimeline::default();
    t.upsert(record("a", "1s", 1, false), 0, &HashMap::default());
    t.upsert(record("a", "10s", 2, false), 0, &HashMap::default());
    check(&t);
    // The change carries what the old schedule had due up to it (due at
    // once); the old version's timer entry is stale and skipped.
    assert_eq!(t.take_due(5_000, 10, |_| false), ["a"], "due once, not once per entry");
    t.fired("a", None, false, true, 5_000);
    assert!(t.get("a").is_some_and(|j| j.carry.is_none()));
    check(&t);
    assert_eq!(t.take_due(5_000, 10, |_| false), ["a"], "the new version is planned at once");
    t.fired("a", None, false, false, 5_000);
    assert!(t.take_due(9_999, 10, |_| false).is_empty());
    assert_eq!(t.take_due(10_000, 10, |_| false), ["a"]);
    t.upsert(record("a", "10s", 3, true), 10_000, &HashMap::default());
    check(&t);
    assert_eq!(t.take_due(10_000, 10, |_| false), ["a"], "what was due before the pause is fired first");
    t.fired("a", None, false, true, 10_000);
    assert!(t.take_due(60_000, 10, |_| false).is_empty(), "then a paused job does not come due");
    t.remove("a");
    assert!(t.get("a").is_none() && t.take_due(120_000, 10, |_| false).is_empty());
}

#[test]
fn a_rebuild_keeps_what_the_dropped_timeline_learned() {
    let mut t = JobTimeline::default();
    t.upsert(record("a", "1s", 1, false), 0, &HashMap::default());
    t.record_duration("a", 40.0);
    t.manual_taken("a", 7_000);
    let earlier = t.take_for_rebuild();
    assert!(t.get("a").is_none(), "the entries are taken out");
    let mut rebuilt = JobTimeline::default();
    rebuilt.set_earlier(earlier);
    assert!(rebuilt.has_earlier());
    rebuilt.upsert_record(record("a", "1s", 1, false), 100);
    let j = rebuilt.get("a").expect("job");
    assert_eq!((j.recent_ms, j.manual_next), (Some(40.0), 7_000));
    // A rebuild that fails part way keeps what it loaded over the rest.
    let carried = rebuilt.take_for_rebuild();
    assert_eq!(carried.get("a").map(|e| e.record.version), Some(1));
    rebuilt.loaded();
    assert!(!rebuilt.has_earlier());
    let mut kept = carried;
    let entry = kept.remove("a").expect("entry");
    let mut again = JobTimeline::default();
    again.reseat(entry, Some(3_000), 3_500);
    check(&again);
    assert_eq!(again.get("a").and_then(|j| j.record.last_scheduled_at), Some(3_000));
    assert_eq!(again.next_due(|_| false), Some(4_000));
}

#[test]
fn a_jittered_instant_comes_due_at_its_fire_time_and_none_is_passed_over() {
    let mut t = JobTimeline::default();
    t.upsert(record_of("a", r#"{"every":"10s","jitter":"9s"}"#, 1, false), 0, &HashMap::default());
    let schedule = t.get("a").expect("job").schedule.clone();
    let fire = |at: Millis| schedule.fire_at(at);
    assert!((10_000..19_000).contains(&fire(10_000)));
    assert_eq!(t.next_due(|_| false), Some(fire(10_000)));
    assert!(t.take_due(fire(10_000) - 1, 10, |_| false).is_empty());
    assert_eq!(t.take_due(fire(10_000), 10, |_| false), ["a"]);
    // Fired at its fire time: the next instant's fire comes next,
    // even when `now` has passed that instant itself.
    assert!(fire(20_000) > 20_000, "this job's second instant is delayed");
    t.fired("a", Some(10_000), false, false, 20_000);
    check(&t);
    assert_eq!(t.next_due(|_| false), Some(fire(20_000)));
}

#[test]
fn bounds_leave_the_instants_outside_them_out() {
    let mut t = JobTimeline::default();
    let schedule = r#"{"every":"1s","start_at":"1970-01-01T00:00:05Z","end_at":"1970-01-01T00:00:07Z"}"#;
    t.upsert(record_of("a", schedule, 1, false), 0, &HashMap::default());
    assert_eq!(t.next_due(|_| false), Some(5_000), "nothing before start_at");
    assert_eq!(t.take_due(5_000, 10, |_| false), ["a"]);
    t.fired("a", Some(7_000), false, false, 7_000);
    check(&t);
    assert_eq!(t.next_due(|_| false), None, "nothing after end_at");
}
