//! Pipelines on the embedded Raft store, through a killed leader: a
//! downstream run released once however the kill falls between its
//! upstream's outcome and its release; an idempotency key repeated to the
//! two other members while the leader dies names one run; a backfill
//! carries on through the kill and leaves exactly one record per instant.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

mod common;
use common::*;

#[path = "raft/cluster.rs"]
mod cluster;
use cluster::{http, Cluster};

fn post(c: &Cluster, at: usize, path: &str, body: &Value) -> (u16, Value) {
    http(&c.addr(at), "POST", path, Some(body.to_string().as_bytes())).unwrap_or((0, Value::Null))
}

/// The runs of `job` by instant, read on member `at` (empty while it
/// cannot answer).
fn runs_of(c: &Cluster, at: usize, job: &str) -> BTreeMap<i64, Value> {
    let Ok((200, v)) = http(&c.addr(at), "GET", &format!("/v1/runs?job={job}&limit=1000"), None) else { return BTreeMap::new() };
    v["runs"].as_array().cloned().unwrap_or_default().into_iter().map(|r| (instant(&r), r)).collect()
}

fn instant(r: &Value) -> i64 {
    let t = r["scheduled_at"].as_str().unwrap();
    chrono::DateTime::parse_from_rfc3339(t).unwrap().timestamp_millis()
}

fn ended(state: &Value) -> bool {
    ["succeeded", "failed", "timed_out", "cancelled", "skipped"].contains(&state.as_str().unwrap_or(""))
}

fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Kills the leader and waits for another member to lead; returns the
/// killed member's index and the new leader's.
fn kill_leader(c: &mut Cluster) -> (usize, usize) {
    let old = c.leader().expect("a leader");
    let mut p = c.procs[old].take().unwrap();
    p.signal(SIGKILL);
    p.wait_exit(Duration::from_secs(10)).expect("the killed member exits");
    let mut new = None;
    wait_until("another member to lead", Duration::from_secs(60), || {
        new = c.leader().filter(|n| *n != old);
        new.is_some()
    });
    (old, new.unwrap())
}

#[test]
fn pipelines_keep_their_guarantees_through_a_killed_raft_leader() {
    let mut c = Cluster::launch((0..3).map(|_| free_port()).collect(), None);
    let l = c.leader().unwrap();
    let up = json!({"name": "up", "executor": {"shell": {"command": "sh", "args": ["-c", "sleep 0.$((RANDOM % 5))"]}},
                    "retry": {"max_attempts": 3, "backoff": {"initial": "100ms"}}});
    let down = json!({"name": "down", "after": [{"job": "up"}], "executor": {"handler": {"name": "noop"}},
                      "retry": {"max_attempts": 3, "backoff": {"initial": "100ms"}}});
    let fill = json!({"name": "fill", "schedule": {"every": "1s"}, "executor": {"handler": {"name": "noop"}}});
    for spec in [&up, &down, &fill] {
        let (code, body) = post(&c, l, "/v1/jobs", spec);
        assert_eq!(code, 201, "{body}");
    }
    // A backfill of 40 past seconds at 4 a second, running through the kill.
    let to = now_ms() / 1000 * 1000 - 5_000;
    let from = to - 39_000;
    let (code, b) = post(&c, l, "/v1/jobs/fill/backfill", &json!({"from": iso(from), "to": iso(to), "rate": 4}));
    assert_eq!((code, b["total"].as_u64()), (201, Some(40)), "{b}");
    let backfill = b["id"].as_str().unwrap().to_string();
    // Upstream runs whose outcomes land around the kill.
    let (code, t) = post(&c, l, "/v1/jobs/up/trigger?count=30", &json!({}));
    assert_eq!(code, 201, "{t}");
    wait_until("some upstream runs to end", Duration::from_secs(60), || {
        runs_of(&c, l, "up").values().filter(|r| r["state"] == "succeeded").count() >= 4
    });
    // A key answered through a follower before the kill.
    let followers: Vec<usize> = (0..3).filter(|&i| i != l).collect();
    let keyed = |c: &Cluster, at: usize, key: &str| {
        let res = http_with(Some(cluster::TOKEN), &c.addr(at), "POST", "/v1/jobs/up/trigger", &[("Idempotency-Key", key)], None);
        let (code, body) = res.unwrap_or((0, Value::Null));
        (code, body["id"].as_str().map(str::to_string))
    };
    let (code, before) = keyed(&c, followers[0], "before-the-kill");
    assert_eq!(code, 201);
    let (old, _new) = kill_leader(&mut c);
    let live: Vec<usize> = (0..3).filter(|&i| i != old).collect();
    // The key, repeated to both live members during and after the
    // failover: the same run, created by no second answer.
    let mut during: Vec<(u16, Option<String>)> = Vec::new();
    for &i in &live {
        let mut answer = (0, None);
        wait_until("the key to be answered", Duration::from_secs(60), || {
            answer = keyed(&c, i, "before-the-kill");
            answer.0 != 0 && answer.0 != 503
        });
        assert_eq!(answer, (200, before.clone()), "member {i}: the key's run from the old term");
        during.push(keyed(&c, i, "during-the-failover"));
    }
    assert!(during.iter().all(|(code, _)| matches!(code, 200 | 201)), "{during:?}");
    assert_eq!(during.iter().filter(|(code, _)| *code == 201).count(), 1, "one answer created it: {during:?}");
    assert_eq!(during[0].1, during[1].1, "both members name one run: {during:?}");

    // Everything settles: every upstream run has one downstream run at its
    // instant, released after it ended (or skipped if it failed).
    let at = live[0];
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let ups = runs_of(&c, at, "up");
        let downs = runs_of(&c, at, "down");
        let settled = !ups.is_empty()
            && ups.values().all(|r| ended(&r["state"]))
            && downs.len() == ups.len()
            && downs.values().all(|r| ended(&r["state"]));
        if settled {
            break;
        }
        if std::time::Instant::now() > deadline {
            dump_logs(c.dir.path());
            panic!("still open after 180 s: {} up, {} down", ups.len(), downs.len());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let ups = runs_of(&c, at, "up");
    let downs = runs_of(&c, at, "down");
    assert_eq!(ups.len(), 32, "30 runs and two keys");
    for (t, u) in &ups {
        let d = &downs[t];
        let expect = if u["state"] == "succeeded" { "succeeded" } else { "skipped" };
        assert_eq!(d["state"], expect, "{t}: up {u} → down {d}");
        if expect == "succeeded" {
            let get = |id: &Value| http(&c.addr(at), "GET", &format!("/v1/runs/{}", id.as_str().unwrap()), None).unwrap().1;
            let (u, d) = (get(&u["id"]), get(&d["id"]));
            let up_end = u["attempts"].as_array().unwrap().last().unwrap()["ended_at"].as_str().unwrap().to_string();
            let firsts: Vec<&Value> = d["attempts"].as_array().unwrap().iter().filter(|a| a["attempt"] == 1).collect();
            assert_eq!(firsts.len(), 1, "released once: {d}");
            assert!(up_end.as_str() <= firsts[0]["assigned_at"].as_str().unwrap(), "{t}: down before up ended");
        }
    }

    // The backfill ended with one record per instant of its range.
    let mut done = Value::Null;
    wait_until("the backfill to end", Duration::from_secs(120), || {
        done = http(&c.addr(at), "GET", &format!("/v1/backfills/{backfill}"), None).map(|r| r.1).unwrap_or(Value::Null);
        done["state"] == "done"
    });
    assert_eq!(done["created"].as_u64().unwrap() + done["kept"].as_u64().unwrap(), 40, "{done}");
    let fills = runs_of(&c, at, "fill");
    for i in 0..40 {
        assert!(fills.contains_key(&(from + i * 1000)), "instant {i} of the range has a record");
    }
    let Ok((200, v)) = http(&c.addr(at), "GET", "/v1/runs?job=fill&limit=1000", None) else { panic!("runs of fill") };
    let all: Vec<i64> = v["runs"].as_array().unwrap().iter().map(instant).collect();
    let unique: std::collections::BTreeSet<&i64> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "no instant of fill has two records");
}
