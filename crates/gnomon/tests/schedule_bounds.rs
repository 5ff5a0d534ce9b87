//! Schedule bounds and jitter through the API of a real `gnomon dev`
//! process (embedded SQLite) on loopback: bad bounds and jitters are
//! refused with their field and change nothing; a bounded, jittered job
//! has exactly one run per instant within its bounds, none outside them,
//! each fired no earlier than the fire time the preview and the job's
//! status state for it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

mod common;
use common::*;

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    http(addr, "POST", path, Some(body.to_string().as_bytes())).unwrap()
}

fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn ms(text: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(text.as_str().unwrap()).unwrap().timestamp_millis()
}

#[test]
fn bad_bounds_and_jitters_are_refused_with_their_field() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    let job = |schedule: Value| json!({"name": "q", "schedule": schedule, "executor": {"handler": {"name": "noop"}}});
    let cases = [
        (json!({"every": "1m", "start_at": "next monday"}), "invalid_schedule", "schedule.start_at"),
        (
            json!({"every": "1m", "start_at": "2027-02-01T00:00:00Z", "end_at": "2027-01-01T00:00:00Z"}),
            "invalid_schedule",
            "schedule.end_at",
        ),
        (json!({"at": "2027-02-01T00:00:00Z", "start_at": "2027-01-01T00:00:00Z"}), "invalid_schedule", "schedule.start_at"),
        (json!({"end_at": "2027-01-01T00:00:00Z"}), "invalid_schedule", "schedule.end_at"),
        (json!({"jitter": "5s"}), "invalid_schedule", "schedule.jitter"),
        (json!({"every": "1m", "jitter": "2h"}), "invalid_duration", "schedule.jitter"),
        (json!({"every": "1m", "jitter": "0s"}), "invalid_duration", "schedule.jitter"),
    ];
    for (schedule, code, field) in cases {
        let (status, body) = post(&addr, "/v1/jobs", &job(schedule.clone()));
        assert_eq!(status, 400, "{schedule}: {body}");
        assert_eq!(body["error"]["code"].as_str(), Some(code), "{schedule}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().starts_with(&format!("{field}: ")), "{schedule}: {body}");
        let (status, body) = post(&addr, "/v1/schedules/preview", &json!({"schedule": schedule}));
        assert_eq!(status, 400, "the preview refuses it too: {body}");
    }
    let (status, body) = post(
        &addr,
        "/v1/jobs",
        &json!({"name": "q", "schedule": {"every": "1m", "jitter": "10m"}, "catchup_window": "5m",
        "executor": {"handler": {"name": "noop"}}}),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("schedule.jitter: "), "{body}");
    let (_, list) = http(&addr, "GET", "/v1/jobs", None).unwrap();
    assert_eq!(list["jobs"].as_array().map(Vec::len), Some(0), "nothing was written: {list}");
}

#[test]
fn a_bounded_jittered_job_fires_each_instant_within_its_bounds_once_and_not_before_its_fire_time() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    // Instants every second from 4 s to 11 s from now, each delayed by up
    // to 700 ms.
    let start = (now_ms() / 1000 + 4) * 1000;
    let end = start + 7_000;
    let schedule = json!({"every": "1s", "start_at": iso(start), "end_at": iso(end), "jitter": "700ms"});
    let (status, job) =
        post(&addr, "/v1/jobs", &json!({"name": "spread", "schedule": schedule, "executor": {"handler": {"name": "noop"}}}));
    assert_eq!(status, 201, "{job}");
    assert_eq!(job["schedule"]["start_at"], json!(iso(start)));
    assert_eq!(job["schedule"]["jitter"], json!("700ms"));

    // The preview of the job's schedule lists the instants within the
    // bounds and each one's fire time.
    let (status, preview) =
        post(&addr, "/v1/schedules/preview", &json!({"schedule": schedule, "job": "spread", "count": 20, "after": iso(start - 5_000)}));
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["start_at"], json!(iso(start)));
    assert_eq!(preview["end_at"], json!(iso(end)));
    let fires: BTreeMap<i64, i64> = preview["fires"].as_array().unwrap().iter().map(|f| (ms(&f["at"]), ms(&f["fire_at"]))).collect();
    let instants: Vec<i64> = (0..=7).map(|k| start + k * 1000).collect();
    assert_eq!(fires.keys().copied().collect::<Vec<_>>(), instants, "only the instants within the bounds");
    assert!(fires.iter().all(|(at, fire)| (*at..=at + 700).contains(fire)), "{fires:?}");
    assert!(fires.values().collect::<std::collections::BTreeSet<_>>().len() > 1, "the delays differ: {fires:?}");
    let (_, got) = http(&addr, "GET", "/v1/jobs/spread", None).unwrap();
    assert_eq!(ms(&got["status"]["next_fire_at"]), fires[&start], "the status names the first fire time: {got}");
    // Without the job, a preview has no fire times (the delay is the job's).
    let (_, anonymous) = post(&addr, "/v1/schedules/preview", &json!({"schedule": schedule, "after": iso(start - 5_000)}));
    assert!(anonymous["fires"][0].get("fire_at").is_none(), "{anonymous}");

    let mut runs: Vec<Value> = Vec::new();
    wait_until("the bounded job's runs", Duration::from_secs(60), || {
        let (_, page) = http(&addr, "GET", "/v1/runs?job=spread&limit=100", None).unwrap();
        runs = page["runs"].as_array().cloned().unwrap_or_default();
        runs.len() >= instants.len() && now_ms() > end + 3_000
    });
    let mut by_instant: BTreeMap<i64, Vec<&Value>> = BTreeMap::new();
    for r in &runs {
        by_instant.entry(ms(&r["scheduled_at"])).or_default().push(r);
    }
    assert_eq!(by_instant.keys().copied().collect::<Vec<_>>(), instants, "one record per instant within the bounds, none outside");
    for (at, records) in &by_instant {
        assert_eq!(records.len(), 1, "instant {at}: {records:?}");
        let fired = ms(&records[0]["fired_at"]);
        assert!(fired >= fires[at], "instant {at} fired at {fired}, before its fire time {}", fires[at]);
    }
    let (_, got) = http(&addr, "GET", "/v1/jobs/spread", None).unwrap();
    assert!(got["status"]["next_fire_at"].is_null(), "past its end the job fires no more: {got}");
}
