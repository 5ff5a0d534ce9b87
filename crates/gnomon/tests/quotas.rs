//! Quotas per namespace, against a real server: every way to ask for runs
//! (a trigger, a webhook call, a backfill) is refused whole over a quota,
//! with 429, `Retry-After` and a coded body, and writes nothing; usage is
//! visible in the API and the metrics; and one namespace's flood neither
//! defers another's fires nor takes its worker slots.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const SECRET: &str = "quota-hook-secret";

/// A `gnomon dev` with `args` and `env`, once it leads.
fn dev(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (Proc, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut all: Vec<String> =
        vec!["dev".into(), "--listen".into(), addr.clone(), "--data-dir".into(), dir.join("data").display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let p = Proc::spawn_env(dir, "dev", &all, &env);
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == json!(true)).unwrap_or(false)
    });
    (p, addr)
}

fn post(addr: &str, path: &str, body: Value) -> (u16, Value) {
    http(addr, "POST", path, Some(body.to_string().as_bytes())).unwrap()
}

/// Everything the store holds of namespace `ns` that a request can add:
/// its runs (but those a running backfill keeps making) and its backfills.
fn held(addr: &str, ns: &str) -> (Vec<String>, Vec<String>) {
    let (_, runs) = http(addr, "GET", &format!("/v1/runs?namespace={ns}&limit=1000"), None).unwrap();
    let (_, backfills) = http(addr, "GET", &format!("/v1/backfills?namespace={ns}"), None).unwrap();
    let ids = |v: &Value, key: &str| -> Vec<String> {
        let list = v[key].as_array().unwrap().iter();
        let mut ids: Vec<String> = list
            .filter(|r| !r["reason"].as_str().is_some_and(|why| why.starts_with("backfill ")))
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    (ids(&runs, "runs"), ids(&backfills, "backfills"))
}

/// Sends `method path` with `headers` and `body`, and checks it is refused
/// by quota `quota` of namespace `small`, with `Retry-After`, and that the
/// namespace holds what it held before.
fn refused_by(addr: &str, quota: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
    let before = held(addr, "small");
    let (status, head, answer) = http_head(None, addr, "POST", path, headers, Some(body)).unwrap();
    let what = format!("POST {path}: {status} {answer}");
    assert_eq!(status, 429, "{what}");
    assert_eq!(answer["error"]["code"], "quota_exceeded", "{what}");
    assert_eq!(answer["error"]["quota"]["quota"], quota, "{what}");
    assert_eq!(answer["error"]["quota"]["namespace"], "small", "{what}");
    let retry_after = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after:").map(|v| v.trim().to_string()));
    assert!(retry_after.is_some_and(|s| s.parse::<u64>().is_ok_and(|n| n > 0)), "Retry-After in seconds: {head}");
    assert_eq!(held(addr, "small"), before, "a refused request wrote: {what}");
}

#[test]
fn every_quota_refuses_with_429_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let hook = [("GNOMON_HOOK_SECRET_small__HOOK", SECRET)];
    // Runs no worker takes stay open, so the counts only move by the calls
    // made here.
    let absent = json!({"handler": {"name": "no-worker-has-this"}});
    let job = |addr: &str, name: &str, extra: Value| {
        let mut spec = json!({"name": name, "namespace": "small", "executor": absent});
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        post(addr, "/v1/jobs", spec)
    };
    // First under the default quotas: `fan` gets three jobs after it.
    {
        let (mut server, addr) = dev(dir.path(), &[], &hook);
        for (name, extra) in [
            ("manual", json!({"triggers": {"webhook": {"secret": "hook"}}})),
            ("fan", json!({})),
            ("d1", json!({"after": [{"job": "fan"}]})),
            ("d2", json!({"after": [{"job": "d1"}]})),
            ("d3", json!({"after": [{"job": "fan"}]})),
            ("hourly", json!({"schedule": {"every": "1h"}})),
        ] {
            let (s, v) = job(&addr, name, extra);
            assert_eq!(s, 201, "{name}: {v}");
        }
        server.signal(SIGTERM);
        server.wait_exit(Duration::from_secs(30));
    }
    // Then with small quotas for namespace small.
    let quotas = "small:open_runs=50,small:request_bytes=4KiB,small:downstream_runs=2,small:backfills=1";
    let (_server, addr) = dev(dir.path(), &["--quota", quotas], &hook);

    // downstream_runs at a job write: a fourth job after fan is refused
    // (d1 and d2 are after it already, at two depths), and not written.
    let before = http(&addr, "GET", "/v1/jobs?namespace=small", None).unwrap().1;
    let (s, v) = job(&addr, "d4", json!({"after": [{"job": "d2"}]}));
    assert_eq!((s, v["error"]["quota"]["quota"].as_str()), (429, Some("downstream_runs")), "{v}");
    assert_eq!(http(&addr, "GET", "/v1/jobs?namespace=small", None).unwrap().1, before, "a refused job write wrote");
    // downstream_runs at a trigger: each run of `fan` would make 3
    // downstream runs (its jobs were written under a larger quota).
    refused_by(&addr, "downstream_runs", "/v1/jobs/fan/trigger?namespace=small", &[], b"{}");
    // open_runs: 51 runs into an empty namespace of 50.
    refused_by(&addr, "open_runs", "/v1/jobs/manual/trigger?namespace=small&count=51", &[], b"{}");
    let (s, v) = post(&addr, "/v1/jobs/manual/trigger?namespace=small&count=40", json!({}));
    assert_eq!(s, 201, "up to the quota fits: {v}");
    let (_, usage) = http(&addr, "GET", "/v1/namespaces/small", None).unwrap();
    assert_eq!((usage["open_runs"].as_u64(), usage["runs"]["pending"].as_u64()), (Some(40), Some(40)), "{usage}");
    assert_eq!(usage["quota"]["open_runs"], 50, "{usage}");

    // backfills: one past the open runs left is refused by them; one of 8
    // instants fits (40 + 8 ≤ 50), and a second is one backfill too many.
    let at = |h: i64| (chrono::Utc::now() - chrono::Duration::hours(h)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let range = |from: i64, to: i64| json!({"from": at(from), "to": at(to), "rate": 1}).to_string().into_bytes();
    refused_by(&addr, "open_runs", "/v1/jobs/hourly/backfill?namespace=small", &[], &range(20, 1));
    let (s, b) = http(&addr, "POST", "/v1/jobs/hourly/backfill?namespace=small", Some(&range(8, 1))).unwrap();
    assert_eq!(s, 201, "{b}");
    refused_by(&addr, "backfills", "/v1/jobs/hourly/backfill?namespace=small", &[], &range(2, 1));
    let (_, usage) = http(&addr, "GET", "/v1/namespaces/small", None).unwrap();
    assert_eq!(usage["backfills"], 1, "{usage}");
    assert!(usage["open_runs"].as_u64().unwrap() >= 47, "the backfill's instants count before they are created: {usage}");
    let (s, b) = http(&addr, "POST", &format!("/v1/backfills/{}/cancel", b["id"].as_str().unwrap()), None).unwrap();
    assert_eq!(s, 200, "{b}");
    wait_until("the leader to drop the cancelled backfill", Duration::from_secs(10), || {
        http(&addr, "GET", "/v1/namespaces/small", None).unwrap().1["backfills"] == 0
    });

    // open_runs: fill what is left, then one more, keyed or not.
    let (_, usage) = http(&addr, "GET", "/v1/namespaces/small", None).unwrap();
    let room = 50 - usage["open_runs"].as_u64().unwrap();
    refused_by(&addr, "open_runs", &format!("/v1/jobs/manual/trigger?namespace=small&count={}", room + 1), &[], b"{}");
    let (s, v) = post(&addr, &format!("/v1/jobs/manual/trigger?namespace=small&count={room}"), json!({}));
    assert_eq!(s, 201, "{v}");
    refused_by(&addr, "open_runs", "/v1/jobs/manual/trigger?namespace=small", &[("Idempotency-Key", "k-1")], b"{}");

    // request_bytes: a webhook call whose payload alone passes 4 KiB.
    let body = format!(r#"{{"blob":"{}"}}"#, "x".repeat(5000));
    let ts = now_ms();
    let sig = sign(SECRET, "small", "manual", ts, "", body.as_bytes());
    let ts_text = ts.to_string();
    let headers = [("Gnomon-Timestamp", ts_text.as_str()), ("Gnomon-Signature", sig.as_str())];
    refused_by(&addr, "request_bytes", "/v1/hooks/small/manual", &headers, body.as_bytes());

    // Another namespace keeps the defaults.
    let (s, v) = post(&addr, "/v1/jobs", json!({"name": "other", "namespace": "big", "executor": absent}));
    assert_eq!(s, 201, "{v}");
    let (s, v) = post(&addr, "/v1/jobs/other/trigger?namespace=big&count=100", json!({}));
    assert_eq!(s, 201, "{v}");
    let (_, list) = http(&addr, "GET", "/v1/namespaces", None).unwrap();
    let names: Vec<&str> = list["namespaces"].as_array().unwrap().iter().map(|n| n["namespace"].as_str().unwrap()).collect();
    assert!(names.contains(&"small") && names.contains(&"big"), "{list}");
    let metrics = raw_get(&addr, "/metrics").unwrap();
    for line in [
        r#"gnomon_namespace_open_runs{namespace="big"} 100"#,
        r#"gnomon_namespace_quota{namespace="small",quota="open_runs"} 50"#,
        r#"gnomon_quota_refusals_total{namespace="small",quota="open_runs"}"#,
    ] {
        assert!(metrics.contains(line), "metrics lack {line}");
    }
}

/// Runs of `job` in `ns`, with (scheduled_at, fired_at, state).
fn runs_of(addr: &str, ns: &str, job: &str) -> Vec<(i64, i64, String)> {
    let (_, v) = http(addr, "GET", &format!("/v1/runs?namespace={ns}&job={job}&limit=1000"), None).unwrap();
    let ms = |t: &Value| chrono::DateTime::parse_from_rfc3339(t.as_str().unwrap()).unwrap().timestamp_millis();
    v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (ms(&r["scheduled_at"]), ms(&r["fired_at"]), r["state"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn a_flooded_namespace_neither_defers_another_namespaces_fires_nor_takes_its_slots() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = dev(dir.path(), &[], &[]);
    // Namespace a: a large backfill and 10,000 triggered runs, all of a
    // handler the embedded worker runs, so they also compete for its slots.
    let noop = json!({"handler": {"name": "noop"}});
    let (s, v) = post(&addr, "/v1/jobs", json!({"name": "flood", "namespace": "a", "executor": noop}));
    assert_eq!(s, 201, "{v}");
    let (s, v) = post(&addr, "/v1/jobs", json!({"name": "past", "namespace": "a", "schedule": {"every": "1s"}, "executor": noop}));
    assert_eq!(s, 201, "{v}");
    let at = |s: i64| (chrono::Utc::now() - chrono::Duration::seconds(s)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let (s, v) = post(&addr, "/v1/jobs/past/backfill?namespace=a", json!({"from": at(40_000), "to": at(60), "rate": 1000}));
    assert_eq!(s, 201, "{v}");
    let (s, v) = post(&addr, "/v1/jobs/flood/trigger?namespace=a&count=10000", json!({}));
    assert_eq!(s, 201, "{v}");
    // Namespace b: a job every 2 s.
    let (s, v) = post(&addr, "/v1/jobs", json!({"name": "tick", "namespace": "b", "schedule": {"every": "2s"}, "executor": noop}));
    assert_eq!(s, 201, "{v}");
    let created = now_ms();
    std::thread::sleep(Duration::from_secs(20));
    let (_, usage) = http(&addr, "GET", "/v1/namespaces/a", None).unwrap();
    let ticks: Vec<(i64, i64, String)> =
        runs_of(&addr, "b", "tick").into_iter().filter(|(at, _, _)| *at > created + 2_000 && *at < created + 18_000).collect();
    eprintln!("namespace a while b ticked: {usage}");
    assert!(ticks.len() >= 7, "b fires every 2 s while a floods: {ticks:?}");
    for (at, fired, _) in &ticks {
        assert!(fired - at < 1_500, "b's instant {at} fired {} ms late: {ticks:?}", fired - at);
    }
    // Its runs were given slots too: every one but the newest has ended.
    wait_until("b's runs to end", Duration::from_secs(10), || {
        let ticks = runs_of(&addr, "b", "tick");
        ticks.iter().filter(|(at, _, _)| *at < created + 16_000).all(|(_, _, state)| state == "succeeded")
    });
}

/// Sends a signed webhook call of `body` to job `job` of namespace `small`.
fn hook_call(addr: &str, job: &str, body: &str) -> (u16, String, Value) {
    let ts = now_ms();
    let sig = sign(SECRET, "small", job, ts, "", body.as_bytes());
    let ts_text = ts.to_string();
    let headers = [("Gnomon-Timestamp", ts_text.as_str()), ("Gnomon-Signature", sig.as_str())];
    http_head(None, addr, "POST", &format!("/v1/hooks/small/{job}"), &headers, Some(body.as_bytes())).unwrap()
}

fn keyed(addr: &str, job: &str, key: &str) -> (u16, Value) {
    let (status, _, v) =
        http_head(None, addr, "POST", &format!("/v1/jobs/{job}/trigger?namespace=small"), &[("Idempotency-Key", key)], Some(b"{}"))
            .unwrap();
    (status, v)
}

#[test]
fn held_keyed_runs_and_open_bytes_count_against_the_quotas_through_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let hook = [("GNOMON_HOOK_SECRET_small__HOOK", SECRET)];
    let quotas = ["--quota", "small:open_runs=4,small:open_bytes=2KiB"];
    let (mut server, addr) = dev(dir.path(), &quotas, &hook);
    let (s, v) = post(&addr, "/v1/jobs", json!({"name": "quick", "namespace": "small", "executor": {"handler": {"name": "noop"}}}));
    assert_eq!(s, 201, "{v}");
    let absent = json!({"handler": {"name": "no-worker-has-this"}});
    let (s, v) = post(
        &addr,
        "/v1/jobs",
        json!({"name": "stuck", "namespace": "small", "executor": absent, "triggers": {"webhook": {"secret": "hook"}}}),
    );
    assert_eq!(s, 201, "{v}");

    // open_bytes: a webhook call's payload stays counted while its run is
    // open; a second that would pass 2 KiB is refused and writes nothing.
    let blob = |c: char| format!(r#"{{"blob":"{}"}}"#, c.to_string().repeat(1200));
    let (s, _, v) = hook_call(&addr, "stuck", &blob('a'));
    assert!(s == 200 || s == 201, "{s} {v}");
    let before = held(&addr, "small");
    let (s, head, v) = hook_call(&addr, "stuck", &blob('b'));
    assert_eq!((s, v["error"]["quota"]["quota"].as_str()), (429, Some("open_bytes")), "{v}");
    assert!(head.to_ascii_lowercase().contains("retry-after: 5"), "{head}");
    assert_eq!(held(&addr, "small"), before, "a refused call wrote");

    // Keyed runs that ended are held, and count: three succeed, and with
    // the open webhook run the namespace is at its 4 open runs.
    for key in ["k1", "k2", "k3"] {
        let (s, v) = keyed(&addr, "quick", key);
        assert_eq!(s, 201, "{key}: {v}");
    }
    let usage = |addr: &str| http(addr, "GET", "/v1/namespaces/small", None).unwrap().1;
    wait_until("the keyed runs to end and be counted as kept", Duration::from_secs(30), || usage(&addr)["runs"]["kept"] == 3);
    let check_held = |addr: &str| {
        let u = usage(addr);
        assert_eq!(
            (u["open_runs"].as_u64(), u["runs"]["pending"].as_u64(), u["runs"]["active"].as_u64()),
            (Some(4), Some(1), Some(0)),
            "{u}"
        );
        assert!(u["runs"]["bytes"].as_u64().unwrap() > 1200, "the open webhook run's payload counts: {u}");
        refused_by(addr, "open_runs", "/v1/jobs/quick/trigger?namespace=small", &[("Idempotency-Key", "k4")], b"{}");
        refused_by(addr, "open_runs", "/v1/jobs/quick/trigger?namespace=small", &[], b"{}");
        // A repeat of a held key is answered with its run, not refused.
        let (s, v) = keyed(addr, "quick", "k1");
        assert_eq!((s, v["state"].as_str()), (200, Some("succeeded")), "{v}");
    };
    check_held(&addr);
    // A new term rebuilds the same counts from the store.
    server.signal(SIGTERM);
    server.wait_exit(Duration::from_secs(30));
    let (_server, addr) = dev(dir.path(), &quotas, &hook);
    wait_until("the rebuilt leader to count the kept runs", Duration::from_secs(30), || usage(&addr)["runs"]["kept"] == 3);
    check_held(&addr);
}

#[test]
fn a_namespace_past_its_backlog_line_refuses_triggers_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let hook = [("GNOMON_HOOK_SECRET_small__HOOK", SECRET)];
    let (_server, addr) = dev(dir.path(), &["--max-pending", "10"], &hook);
    let absent = json!({"handler": {"name": "no-worker-has-this"}});
    for ns in ["small", "calm"] {
        let (s, v) = post(
            &addr,
            "/v1/jobs",
            json!({"name": "stuck", "namespace": ns, "executor": absent, "triggers": {"webhook": {"secret": "hook"}}}),
        );
        assert_eq!(s, 201, "{v}");
    }
    // 9 pending runs: the red line (90 % of 10).
    let (s, v) = post(&addr, "/v1/jobs/stuck/trigger?namespace=small&count=9", json!({}));
    assert_eq!(s, 201, "{v}");
    wait_until("namespace small to turn red", Duration::from_secs(30), || {
        http(&addr, "GET", "/v1/namespaces/small", None).unwrap().1["pressure"] == "red"
    });
    refused_by(&addr, "backlog", "/v1/jobs/stuck/trigger?namespace=small", &[], b"{}");
    refused_by(&addr, "backlog", "/v1/jobs/stuck/trigger?namespace=small", &[("Idempotency-Key", "later")], b"{}");
    let (s, _, v) = hook_call(&addr, "stuck", "{}");
    assert_eq!((s, v["error"]["quota"]["quota"].as_str()), (429, Some("backlog")), "{v}");
    let (s, v) = post(&addr, "/v1/jobs/stuck/trigger?namespace=calm", json!({}));
    assert_eq!(s, 201, "another namespace is let in: {v}");
}
