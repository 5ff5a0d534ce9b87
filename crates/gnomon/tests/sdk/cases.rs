//! The protocol conformance cases: one list, run against every worker
//! implementation on a real server.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::workers::Sdk;
use crate::common::*;

/// Generous: several servers and workers may share a busy machine.
pub const WITHIN: Duration = Duration::from_secs(60);

/// A server the cases talk to, and the SDK whose workers run its jobs.
pub struct Ctx {
    pub sdk: Sdk,
    pub addr: String,
    /// The credential API calls carry, when the server wants one.
    pub token: Option<String>,
}

pub fn ms(rfc3339: &str) -> i64 {
    gnomon_core::chrono::DateTime::parse_from_rfc3339(rfc3339).unwrap_or_else(|e| panic!("{rfc3339}: {e}")).timestamp_millis()
}

impl Ctx {
    /// Creates job `<sdk>-<name>` running `handler` with `payload`, routed
    /// to this SDK's workers, with `extra` fields; its name.
    pub fn job(&self, name: &str, handler: &str, payload: Value, extra: Value) -> String {
        let name = format!("{}-{name}", self.sdk.label());
        let mut job = json!({
            "name": name,
            "executor": {"handler": {"name": handler, "payload": payload}},
            "route": {"labels": {"sdk": self.sdk.label()}},
        });
        for (k, v) in extra.as_object().expect("an object") {
            job[k] = v.clone();
        }
        let (s, v) = http_as(self.token.as_deref(), &self.addr, "POST", "/v1/jobs", Some(job.to_string().as_bytes())).unwrap();
        assert_eq!(s, 201, "creating {name}: {v}");
        name
    }

    /// Triggers one run of `job`: its id.
    pub fn trigger(&self, job: &str, body: Value) -> String {
        let (s, v) =
            http_as(self.token.as_deref(), &self.addr, "POST", &format!("/v1/jobs/{job}/trigger"), Some(body.to_string().as_bytes()))
                .unwrap();
        assert_eq!(s, 201, "triggering {job}: {v}");
        v["id"].as_str().unwrap_or_else(|| panic!("{v}")).to_string()
    }

    pub fn run(&self, id: &str) -> Value {
        http_as(self.token.as_deref(), &self.addr, "GET", &format!("/v1/runs/{id}"), None).map(|(_, v)| v).unwrap_or(Value::Null)
    }

    /// Waits until the run satisfies `ok`; the run.
    pub fn wait_run(&self, id: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WITHIN;
        loop {
            let run = self.run(id);
            if ok(&run) {
                return run;
            }
            assert!(Instant::now() < deadline, "{:?}: run {id} never {what}: {run}", self.sdk);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_state(&self, id: &str, state: &str) -> Value {
        self.wait_run(id, state, |r| r["state"] == state)
    }

    pub fn output(&self, id: &str, from: u64) -> Value {
        http(&self.addr, "GET", &format!("/v1/runs/{id}/output?from={from}"), None).map(|(_, v)| v).unwrap_or(Value::Null)
    }
}

fn attempts(run: &Value) -> Vec<Value> {
    run["attempts"].as_array().cloned().unwrap_or_default()
}

/// A case: its name and what it does.
pub type Case = (&'static str, fn(&Ctx));

/// Every case, by name.
pub const CASES: &[Case] = &[
    ("an attempt is handed what it runs for", handed_what_it_runs_for),
    ("a failure is retried per the job's policy", failure_is_retried),
    ("NonRetryable ends the run", non_retryable_ends_the_run),
    ("RetryAfter sets the next attempt's time", retry_after_delays),
    ("output is live while it runs, and a cancel stops it", live_output_and_cancel),
    ("a timeout ends the attempt timed out", timeout_ends_it),
    ("the output kept is bounded", output_is_bounded),
];

fn handed_what_it_runs_for(c: &Ctx) {
    let job = c.job("echo", "echo", json!({"a": 1}), json!({"params": {"region": {"default": "eu"}}}));
    let id = c.trigger(&job, json!({"params": {"region": "us"}}));
    let run = c.wait_state(&id, "succeeded");
    let a = &attempts(&run)[0];
    let seen: Value = serde_json::from_str(a["output"].as_str().unwrap_or_default().trim())
        .unwrap_or_else(|e| panic!("{:?}: echo's output is one line of JSON ({e}): {a}", c.sdk));
    assert_eq!(seen["run_id"], id.as_str(), "{seen}");
    assert_eq!(seen["attempt"], 1, "{seen}");
    assert_eq!(seen["job"], job.as_str(), "{seen}");
    assert_eq!(seen["namespace"], "default", "{seen}");
    assert_eq!(seen["scheduled_at_ms"].as_i64(), Some(ms(run["scheduled_at"].as_str().unwrap())), "{seen}");
    assert_eq!(seen["params"], json!({"region": "us"}), "{seen}");
    assert_eq!(seen["payload"], json!({"a": 1}), "{seen}");
    assert_eq!(seen["run_payload"], Value::Null, "{seen}");
    assert_eq!(seen["token"].as_str().and_then(|t| t.parse::<u64>().ok()), a["token"].as_u64(), "{seen}");
}

fn failure_is_retried(c: &Ctx) {
    let retry = json!({"retry": {"max_attempts": 2, "backoff": {"initial": "100ms", "max": "100ms"}}});
    let job = c.job("fail", "fail", Value::Null, retry);
    let id = c.trigger(&job, json!({}));
    let run = c.wait_state(&id, "failed");
    let all = attempts(&run);
    assert_eq!(all.len(), 2, "{run}");
    for a in &all {
        assert_eq!(a["state"], "failed", "{run}");
        assert!(a["output"].as_str().unwrap_or_default().contains("boom"), "{run}");
    }
}

fn non_retryable_ends_the_run(c: &Ctx) {
    let retry = json!({"retry": {"max_attempts": 3, "backoff": {"initial": "100ms", "max": "100ms"}}});
    let job = c.job("no-retry", "no_retry", Value::Null, retry);
    let id = c.trigger(&job, json!({}));
    let run = c.wait_state(&id, "failed");
    assert_eq!(attempts(&run).len(), 1, "{run}");
    assert!(run["reason"].as_str().unwrap_or_default().contains("asked not to be retried"), "{run}");
    assert!(attempts(&run)[0]["output"].as_str().unwrap_or_default().contains("bad input"), "{run}");
}

fn retry_after_delays(c: &Ctx) {
    let retry = json!({"retry": {"max_attempts": 3, "backoff": {"initial": "100ms", "max": "100ms"}}});
    let job = c.job("retry-after", "retry_after", json!({"seconds": 1.5}), retry);
    let id = c.trigger(&job, json!({}));
    let run = c.wait_state(&id, "succeeded");
    let all = attempts(&run);
    assert_eq!(all.len(), 2, "{run}");
    let ended = ms(all[0]["ended_at"].as_str().unwrap());
    let assigned = ms(all[1]["assigned_at"].as_str().unwrap());
    assert!(assigned - ended >= 1_500, "the second attempt waited 1.5 s, not the 100 ms backoff: {run}");
}

fn live_output_and_cancel(c: &Ctx) {
    let job = c.job("sleep", "sleep", json!({"seconds": 60}), json!({}));
    let id = c.trigger(&job, json!({}));
    c.wait_state(&id, "running");
    // The ticks arrive while it runs, read on from `next`.
    let deadline = Instant::now() + WITHIN;
    let (mut text, mut from) = (String::new(), 0u64);
    while !text.contains("tick 5") {
        assert!(Instant::now() < deadline, "{:?}: no live output: {text:?}", c.sdk);
        let o = c.output(&id, from);
        assert_eq!(o["live"], true, "{o}");
        assert!(o["from"].as_u64() >= Some(from), "{o}");
        text.push_str(o["text"].as_str().unwrap_or_default());
        from = o["next"].as_u64().unwrap_or(from);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(text.contains("tick 1") && text.contains("tick 2"), "in order, from the start: {text:?}");
    let (s, v) = http(&c.addr, "POST", &format!("/v1/runs/{id}/cancel"), None).unwrap();
    assert!(s == 200 || s == 202, "{s} {v}");
    let run = c.wait_state(&id, "cancelled");
    assert_eq!(attempts(&run)[0]["state"], "cancelled", "{run}");
    let o = c.output(&id, 0);
    assert_eq!(o["live"], false, "{o}");
    assert!(o["text"].as_str().unwrap_or_default().contains("tick 1"), "the kept output: {o}");
}

fn timeout_ends_it(c: &Ctx) {
    let job = c.job("timeout", "sleep", json!({"seconds": 60}), json!({"timeout": "1s"}));
    let id = c.trigger(&job, json!({}));
    let run = c.wait_state(&id, "failed");
    assert_eq!(attempts(&run)[0]["state"], "timed_out", "{run}");
}

fn output_is_bounded(c: &Ctx) {
    let job = c.job("log", "log", json!({"lines": 2000, "width": 100}), json!({}));
    let id = c.trigger(&job, json!({}));
    let run = c.wait_state(&id, "succeeded");
    let out = attempts(&run)[0]["output"].as_str().unwrap_or_default().to_string();
    assert!(out.len() <= 64 * 1024 + 100, "{:?}: {} bytes kept", c.sdk, out.len());
    assert!(out.len() >= 60 * 1024, "{:?}: the newest 64 KiB are kept, {} bytes", c.sdk, out.len());
    assert!(out.trim_end().ends_with("logged"), "{:?}: ends with the returned value: {}", c.sdk, &out[out.len().saturating_sub(200)..]);
}
