//! Backfills through the API and the CLI of real `gnomon dev` processes
//! (embedded SQLite) on loopback: bad requests change nothing, every past
//! instant of the range gets exactly one record (an instant that has one
//! keeps it), a repeat creates nothing twice, a cancel stops it, downstream
//! jobs run for backfilled instants, and a leader killed in the middle
//! leaves the next one to finish where the last write left it.

use std::collections::BTreeMap;
use std::process::Command;
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

/// Every run of `job`, by scheduled time (ms).
fn runs_of(addr: &str, job: &str) -> BTreeMap<i64, Value> {
    let (code, body) = http(addr, "GET", &format!("/v1/runs?job={job}&limit=1000"), None).unwrap();
    assert_eq!(code, 200, "{body}");
    body["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["manual"].as_bool().unwrap())
        .map(|r| (chrono::DateTime::parse_from_rfc3339(r["scheduled_at"].as_str().unwrap()).unwrap().timestamp_millis(), r.clone()))
        .collect()
}

fn backfill(addr: &str, id: &str) -> Value {
    let (code, body) = http(addr, "GET", &format!("/v1/backfills/{id}"), None).unwrap();
    assert_eq!(code, 200, "{body}");
    body
}

fn wait_ended(addr: &str, id: &str) -> Value {
    let mut b = Value::Null;
    wait_until("the backfill to end", Duration::from_secs(120), || {
        b = backfill(addr, id);
        b["state"] != "running"
    });
    b
}

/// A job every 10 s created now, and the start of the minute it was created in, 2 minutes back.
fn every_ten(addr: &str, name: &str) -> i64 {
    let spec = json!({"name": name, "schedule": {"every": "10s"}, "params": {"day": {"default": "today"}},
                      "executor": {"handler": {"name": "noop"}}});
    let (code, body) = post(addr, "/v1/jobs", &spec);
    assert_eq!(code, 201, "{body}");
    (now_ms() / 10_000 - 12) * 10_000
}

#[test]
fn bad_backfills_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    let start = every_ten(&addr, "tick");
    let manual = json!({"name": "by-hand", "executor": {"handler": {"name": "noop"}}});
    assert_eq!(post(&addr, "/v1/jobs", &manual).0, 201);
    let (from, to) = (iso(start), iso(start + 50_000));
    let cases = [
        ("tick", json!({"from": to, "to": from}), 400, "invalid_range"),
        // An end still to come is cut to now: a range wholly ahead is empty.
        ("tick", json!({"from": iso(now_ms() + 60_000), "to": iso(now_ms() + 120_000)}), 409, "no_instants"),
        ("tick", json!({"from": "yesterday", "to": to}), 400, "invalid_time"),
        ("tick", json!({"from": from, "to": to, "rate": 0}), 400, "invalid_rate"),
        ("tick", json!({"from": from, "to": to, "rate": 5000}), 400, "invalid_rate"),
        ("tick", json!({"from": from, "to": to, "params": {"nope": 1}}), 409, "unknown_param"),
        ("tick", json!({"from": from, "to": to, "bogus": 1}), 400, "invalid_body"),
        ("tick", json!({"from": iso(start - 20 * 86_400_000), "to": to}), 409, "too_many_instants"),
        ("tick", json!({"from": iso(start + 1), "to": iso(start + 2)}), 409, "no_instants"),
        ("by-hand", json!({"from": from, "to": to}), 409, "no_schedule"),
        ("missing", json!({"from": from, "to": to}), 404, "not_found"),
    ];
    for (job, body, status, code) in cases {
        let (got, answer) = post(&addr, &format!("/v1/jobs/{job}/backfill"), &body);
        assert_eq!((got, answer["error"]["code"].as_str()), (status, Some(code)), "{job} {body}: {answer}");
    }
    let (_, list) = http(&addr, "GET", "/v1/backfills", None).unwrap();
    assert_eq!(list["backfills"], json!([]), "a refused backfill records nothing");
    assert_eq!(runs_of(&addr, "tick").keys().filter(|t| **t < start + 60_000).count(), 0, "and creates no run");
    assert_eq!(http(&addr, "GET", "/v1/backfills/nope", None).unwrap().0, 404);
    assert_eq!(http(&addr, "POST", "/v1/backfills/nope/cancel", None).unwrap().0, 404);
}

#[test]
fn a_backfill_gives_each_past_instant_one_record_and_a_repeat_creates_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    let start = every_ten(&addr, "tick");
    let after = json!({"name": "after-tick", "after": [{"job": "tick"}], "executor": {"handler": {"name": "noop"}}});
    assert_eq!(post(&addr, "/v1/jobs", &after).0, 201);
    // The first half, then the whole range: the overlap is kept.
    let body = json!({"from": iso(start), "to": iso(start + 40_000), "params": {"day": "2026-11-30"}, "rate": 50});
    let (code, first) = post(&addr, "/v1/jobs/tick/backfill", &body);
    assert_eq!(code, 201, "{first}");
    assert_eq!((first["total"].as_u64(), first["state"].as_str()), (Some(5), Some("running")), "{first}");
    let first = wait_ended(&addr, first["id"].as_str().unwrap());
    assert_eq!((first["state"].as_str(), first["created"].as_u64(), first["kept"].as_u64()), (Some("done"), Some(5), Some(0)), "{first}");
    let to = now_ms() - 1;
    let out = Command::new(BIN)
        .args([
            "--server",
            &format!("http://{addr}"),
            "job",
            "backfill",
            "tick",
            "--from",
            &iso(start),
            "--to",
            &iso(to),
            "--rate",
            "100",
            "--wait",
            "-o",
            "json",
        ])
        .env_remove("GNOMON_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("100%"), "the progress: {}", String::from_utf8_lossy(&out.stderr));
    let second: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(second["state"], "done", "{second}");
    assert!(second["kept"].as_u64().unwrap() >= 5, "the first backfill's instants (and the schedule's own) are kept: {second}");
    assert_eq!(second["created"].as_u64().unwrap() + second["kept"].as_u64().unwrap(), second["total"].as_u64().unwrap());
    // Exactly one record per instant of the range, the backfilled ones
    // with the params asked for.
    let runs = runs_of(&addr, "tick");
    let mut t = start;
    while t <= to {
        let r = runs.get(&t).unwrap_or_else(|| panic!("no record for instant {t}"));
        if t <= start + 40_000 {
            assert_eq!(r["params"]["day"], "2026-11-30", "{r}");
            assert_eq!(r["reason"], format!("backfill {}", first["id"].as_str().unwrap()));
        }
        t += 10_000;
    }
    // Downstream jobs run for backfilled instants as they would have.
    wait_until("the downstream runs of the backfilled instants", Duration::from_secs(60), || {
        let downs = runs_of(&addr, "after-tick");
        (0..5).all(|i| downs.get(&(start + i * 10_000)).is_some_and(|d| d["state"] == "succeeded"))
    });
    let (_, list) = http(&addr, "GET", "/v1/backfills?job=tick", None).unwrap();
    assert_eq!(list["backfills"].as_array().unwrap().len(), 2, "{list}");
    let (code, ended) = http(&addr, "POST", &format!("/v1/backfills/{}/cancel", first["id"].as_str().unwrap()), None).unwrap();
    assert_eq!((code, ended["error"]["code"].as_str()), (409, Some("backfill_ended")), "{ended}");
}

#[test]
fn a_backfill_is_cancelled_and_survives_a_killed_leader() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dev, addr) = leading_dev(dir.path());
    let spec = json!({"name": "slowfill", "schedule": {"every": "1s"}, "executor": {"handler": {"name": "noop"}}});
    assert_eq!(post(&addr, "/v1/jobs", &spec).0, 201);
    let to = now_ms() / 1000 * 1000 - 5_000;
    let from = to - 59_000;
    let (code, b) = post(&addr, "/v1/jobs/slowfill/backfill", &json!({"from": iso(from), "to": iso(to), "rate": 4}));
    assert_eq!((code, b["total"].as_u64()), (201, Some(60)), "{b}");
    let id = b["id"].as_str().unwrap().to_string();
    wait_until("the backfill to make progress", Duration::from_secs(60), || backfill(&addr, &id)["created"].as_u64().unwrap_or(0) >= 8);
    dev.signal(SIGKILL);
    dev.wait_exit(Duration::from_secs(10)).expect("the killed server exits");
    let (_dev, addr) = leading_dev(dir.path());
    let done = wait_ended(&addr, &id);
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["created"].as_u64().unwrap() + done["kept"].as_u64().unwrap(), 60, "{done}");
    let runs = runs_of(&addr, "slowfill");
    for i in 0..60 {
        assert!(runs.contains_key(&(from + i * 1000)), "instant {i} of the range has a record");
    }
    // Cancelled: it stops, and what it created stays.
    let (code, c) = post(&addr, "/v1/jobs/slowfill/backfill", &json!({"from": iso(from - 600_000), "to": iso(from - 1000), "rate": 1}));
    assert_eq!(code, 201, "{c}");
    let cid = c["id"].as_str().unwrap().to_string();
    let (code, cancelled) = http(&addr, "POST", &format!("/v1/backfills/{cid}/cancel"), None).unwrap();
    assert_eq!((code, cancelled["state"].as_str()), (200, Some("cancelled")), "{cancelled}");
    std::thread::sleep(Duration::from_secs(3));
    let after = backfill(&addr, &cid);
    assert_eq!(after["state"], "cancelled");
    let made = runs_of(&addr, "slowfill").keys().filter(|t| **t < from).count() as u64;
    assert!(made <= after["created"].as_u64().unwrap() + 1, "no run after the cancel: {made} runs, {after}");
}
