//! The work around a fire, through the API and the CLI of real `gnomon dev`
//! processes (embedded SQLite) on loopback: idempotency keys on manual
//! triggers (and what a repeat makes downstream: nothing), run params,
//! across a killed and restarted leader. Webhook calls are in
//! `webhooks.rs`; the replicated stores' failovers repeat keys and webhook
//! calls in `failover.rs`.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

mod common;
use common::*;

/// `POST /v1/jobs/{job}/trigger` with an `Idempotency-Key` header.
fn trigger_keyed(addr: &str, job: &str, query: &str, key: &str) -> (u16, Value) {
    http_with(None, addr, "POST", &format!("/v1/jobs/{job}/trigger{query}"), &[("Idempotency-Key", key)], None).unwrap()
}

fn run_ids(addr: &str, job: &str) -> Vec<String> {
    let (code, body) = http(addr, "GET", &format!("/v1/runs?job={job}&limit=1000"), None).unwrap();
    assert_eq!(code, 200, "{body}");
    let mut ids: Vec<String> = body["runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    ids
}

fn create_manual_job(addr: &str, name: &str) {
    let spec = json!({"name": name, "executor": {"handler": {"name": "noop"}}});
    let (code, body) = http(addr, "POST", "/v1/jobs", Some(spec.to_string().as_bytes())).unwrap();
    assert_eq!(code, 201, "{body}");
}

fn cli_trigger(addr: &str, job: &str, key: &str) -> Value {
    let out = Command::new(BIN)
        .args(["--server", &format!("http://{addr}"), "job", "trigger", job, "--idempotency-key", key, "--output", "json"])
        .env_remove("GNOMON_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn stop_hard(mut dev: Proc) {
    dev.signal(SIGKILL);
    dev.wait_exit(Duration::from_secs(10)).expect("the killed server exits");
}

#[test]
fn an_idempotency_key_names_one_run_even_across_a_killed_leader() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, addr) = leading_dev(dir.path());
    create_manual_job(&addr, "keyed");

    let (code, first) = trigger_keyed(&addr, "keyed", "", "order-1");
    assert_eq!(code, 201, "the first call with a key creates its run: {first}");
    let id = first["id"].as_str().unwrap().to_string();
    let (code, again) = trigger_keyed(&addr, "keyed", "", "order-1");
    assert_eq!((code, again["id"].as_str()), (200, Some(id.as_str())), "a repeat answers with the same run: {again}");
    let (code, other) = trigger_keyed(&addr, "keyed", "", "order-2");
    assert_eq!(code, 201, "{other}");
    assert_ne!(other["id"], first["id"]);
    assert_eq!(cli_trigger(&addr, "keyed", "order-1")["id"].as_str(), Some(id.as_str()), "the CLI sends the key");

    // Bad keys and a key on many runs are refused, and create nothing.
    let before = run_ids(&addr, "keyed");
    assert_eq!(before.len(), 2);
    for (query, key, code) in
        [("", "", "invalid_idempotency_key"), ("", &"k".repeat(256), "invalid_idempotency_key"), ("?count=2", "order-3", "invalid_count")]
    {
        let (status, body) = trigger_keyed(&addr, "keyed", query, key);
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some(code)), "{key:?}: {body}");
    }
    let raw = http_with(None, &addr, "POST", "/v1/jobs/keyed/trigger", &[("Idempotency-Key", "cl\u{e9}")], None).unwrap();
    assert_eq!((raw.0, raw.1["error"]["code"].as_str()), (400, Some("invalid_idempotency_key")), "{}", raw.1);
    assert_eq!(run_ids(&addr, "keyed"), before, "a refused call changes nothing");

    // The key outlives the leader that answered it.
    stop_hard(dev);
    let (dev, addr) = leading_dev(dir.path());
    let (code, after) = trigger_keyed(&addr, "keyed", "", "order-1");
    assert_eq!((code, after["id"].as_str()), (200, Some(id.as_str())), "{after}");
    let (code, third) = trigger_keyed(&addr, "keyed", "", "order-3");
    assert_eq!(code, 201, "{third}");
    assert_eq!(run_ids(&addr, "keyed").len(), 3, "one run per key");
    wait_until("the keyed runs to end", Duration::from_secs(60), || {
        let (_, body) = http(&addr, "GET", "/v1/runs?job=keyed&limit=1000", None).unwrap();
        body["runs"].as_array().is_some_and(|r| r.iter().all(|r| r["state"] == "succeeded"))
    });
    let (code, ended) = trigger_keyed(&addr, "keyed", "", "order-1");
    assert_eq!((code, ended["state"].as_str()), (200, Some("succeeded")), "an ended run still answers for its key: {ended}");
    drop(dev);
}

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    http(addr, "POST", path, Some(body.to_string().as_bytes())).unwrap()
}

/// The run `id` once it has ended.
fn ended_run(addr: &str, id: &str) -> Value {
    let mut run = Value::Null;
    wait_until("the run to end", Duration::from_secs(60), || {
        run = http(addr, "GET", &format!("/v1/runs/{id}"), None).unwrap().1;
        ["succeeded", "failed", "timed_out", "cancelled"].contains(&run["state"].as_str().unwrap_or(""))
    });
    run
}

#[test]
fn params_have_defaults_a_trigger_sets_them_and_each_run_keeps_and_runs_with_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    let script = r#"echo "region=$GNOMON_PARAM_REGION date=$GNOMON_PARAM_DATE"; cat "$GNOMON_PARAMS_FILE""#;
    let report = json!({"name": "report", "params": {"region": {"default": "eu"}, "date": {"description": "the day to report"}},
        "executor": {"shell": {"command": "sh", "args": ["-c", script]}}});
    let (code, body) = post(&addr, "/v1/jobs", &report);
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["params"]["region"]["default"], "eu", "the job shows its params: {body}");

    // Refused, with the field, and nothing created.
    // Params the job does not declare, or a required one left out,
    // conflict with the job (409); a malformed body is a 400.
    for (trigger, status, code, field) in [
        (json!({}), 409, "missing_param", "params.date"),
        (json!({"params": {"date": "2026-12-01", "regoin": "us"}}), 409, "unknown_param", "params.regoin"),
        (json!({"params": {"date": "x"}, "extra": 1}), 400, "invalid_body", "extra"),
    ] {
        let (got, body) = post(&addr, "/v1/jobs/report/trigger", &trigger);
        assert_eq!((got, body["error"]["code"].as_str()), (status, Some(code)), "{trigger}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(field), "{body}");
    }
    let raw = http(&addr, "POST", "/v1/jobs/report/trigger", Some(b"{not json")).unwrap();
    assert_eq!(raw.0, 400, "{}", raw.1);
    assert!(run_ids(&addr, "report").is_empty(), "a refused trigger creates nothing");

    let (code, run) = post(&addr, "/v1/jobs/report/trigger", &json!({"params": {"date": "2026-12-01"}}));
    assert_eq!(code, 201, "{run}");
    assert_eq!(run["params"], json!({"date": "2026-12-01", "region": "eu"}), "the run records its values");
    let done = ended_run(&addr, run["id"].as_str().unwrap());
    assert_eq!(done["state"], "succeeded", "{done}");
    let output = done["attempts"][0]["output"].as_str().unwrap();
    assert!(output.starts_with("region=eu date=2026-12-01\n"), "{output}");
    assert!(output.contains(r#"{"date":"2026-12-01","region":"eu"}"#), "{output}");

    // The CLI sets them; a value that is JSON is read as JSON.
    let out = Command::new(BIN)
        .args(["--server", &format!("http://{addr}"), "job", "trigger", "report", "--param", "date=2026-12-02"])
        .args(["--param", "region=5", "--output", "json"])
        .env_remove("GNOMON_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli["params"], json!({"date": "2026-12-02", "region": 5}));
    let bad = Command::new(BIN)
        .args(["--server", &format!("http://{addr}"), "job", "trigger", "report", "--param", "novalue"])
        .env_remove("GNOMON_TOKEN")
        .output()
        .unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("NAME=VALUE"));

    // A key names one run: a repeat that sets other values is refused.
    let keyed = |params: Value| {
        let body = json!({ "params": params }).to_string();
        http_with(None, &addr, "POST", "/v1/jobs/report/trigger", &[("Idempotency-Key", "day-3")], Some(body.as_bytes())).unwrap()
    };
    let (code, first) = keyed(json!({"date": "2026-12-03"}));
    assert_eq!(code, 201, "{first}");
    let (code, other) = keyed(json!({"date": "2026-12-04"}));
    assert_eq!((code, other["error"]["code"].as_str()), (409, Some("idempotency_key_reused")), "{other}");
    let (code, same) = keyed(json!({"date": "2026-12-03"}));
    assert_eq!((code, same["id"].clone()), (200, first["id"].clone()));

    // A scheduled job needs a default for each param; its runs record them.
    let scheduled = |params: Value| json!({"name": "nightly", "schedule": {"every": "1s"}, "params": params, "executor": {"handler": {"name": "noop"}}});
    let (code, body) = post(&addr, "/v1/jobs", &scheduled(json!({"date": {}})));
    assert_eq!((code, body["error"]["code"].as_str()), (400, Some("missing_default")), "{body}");
    let (code, body) = post(&addr, "/v1/jobs", &scheduled(json!({"Date": {"default": 1}, "date": {"default": 2}})));
    assert_eq!((code, body["error"]["code"].as_str()), (400, Some("invalid_params")), "{body}");
    let (code, body) = post(&addr, "/v1/jobs", &scheduled(json!({"window": {"default": "1d"}})));
    assert_eq!(code, 201, "{body}");
    wait_until("a scheduled run", Duration::from_secs(30), || !run_ids(&addr, "nightly").is_empty());
    let id = run_ids(&addr, "nightly").remove(0);
    assert_eq!(ended_run(&addr, &id)["params"], json!({"window": "1d"}));
}

/// A repeated key creates nothing, downstream included: three calls with
/// one key, seconds apart, make one run of the upstream job and one run of
/// each downstream job, at the upstream run's instant as stored.
#[test]
fn a_repeated_key_makes_no_downstream_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    create_manual_job(&addr, "extract");
    let transform = json!({"name": "transform", "after": [{"job": "extract"}], "executor": {"handler": {"name": "noop"}}});
    assert_eq!(post(&addr, "/v1/jobs", &transform).0, 201);
    let mut ids = Vec::new();
    for i in 0..3 {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(1500));
        }
        let (code, body) = http_with(
            None,
            &addr,
            "POST",
            "/v1/jobs/extract/trigger",
            &[("Idempotency-Key", "nightly-2026-12-06")],
            Some(br#"{"params":{}}"#),
        )
        .unwrap();
        assert_eq!(code, if i == 0 { 201 } else { 200 }, "{body}");
        ids.push(body["id"].as_str().unwrap().to_string());
    }
    assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
    let upstream = ended_run(&addr, &ids[0]);
    let downstream = run_ids(&addr, "transform");
    assert_eq!(downstream.len(), 1, "one downstream run for one upstream run: {downstream:?}");
    let down = ended_run(&addr, &downstream[0]);
    assert_eq!(down["scheduled_at"], upstream["scheduled_at"], "at the upstream run's instant: {down}");
    assert_eq!(down["state"], "succeeded", "{down}");
}
