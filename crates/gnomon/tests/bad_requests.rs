//! 100,000 generated bad requests against a real server: malformed JSON,
//! wrong types, huge numbers, odd Unicode, deep nesting, path and query
//! tricks. Every answer is a 4xx with a JSON error code and message, the
//! server never panics, and nothing is written.
//!
//! `GNOMON_BAD_REQUESTS=N` sends N instead; the seed is printed.

mod common;

use std::time::Duration;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// A valid job, the starting point of every mutation.
fn base() -> Value {
    json!({"name": "fuzz", "schedule": {"cron": "*/5 * * * * *", "timezone": "UTC"}, "timeout": "5s",
           "retry": {"max_attempts": 3, "backoff": {"initial": "1s", "max": "10s", "jitter": 0.1}},
           "executor": {"shell": {"command": "true", "args": ["a"], "env": {"K": "v"}}}})
}

const ODD: &[&str] = &[
    "",
    " ",
    "\u{0}",
    "\u{202e}gnp.exe",
    "🦀",
    "\u{fffd}",
    "a/b",
    "..",
    "../../etc/passwd",
    "%2e%2e",
    "\\",
    "null",
    "true",
    "-1",
    "99999999999999999999999999",
    "1e999",
    "NaN",
    "\u{1}\u{7f}",
    "ǅ",
    "ﬀ",
    "İ",
    "a\nb",
    "<script>",
];

fn odd_value(rng: &mut StdRng) -> Value {
    match rng.gen_range(0..9) {
        0 => json!(ODD[rng.gen_range(0..ODD.len())]),
        1 => json!(rng.gen::<i64>()),
        2 => json!(rng.gen::<f64>() * 1e300),
        3 => Value::Null,
        4 => json!([]),
        5 => json!({}),
        6 => json!(rng.gen::<bool>()),
        7 => json!("x".repeat(rng.gen_range(0..5000))),
        _ => json!(u64::MAX),
    }
}

/// Damages the job a little, then breaks it in one guaranteed way (so no
/// request can create it).
fn bad_body(rng: &mut StdRng) -> Vec<u8> {
    let mut job = base();
    // Some damage first.
    let paths: &[&[&str]] = &[
        &["name"],
        &["timeout"],
        &["schedule", "timezone"],
        &["retry", "backoff", "jitter"],
        &["retry", "max_attempts"],
        &["executor", "shell", "args"],
        &["executor", "shell", "env"],
        &["misfire"],
        &["overlap"],
        &["namespace"],
    ];
    for _ in 0..rng.gen_range(0..3) {
        let p = paths[rng.gen_range(0..paths.len())];
        let mut v = &mut job;
        for k in &p[..p.len() - 1] {
            v = &mut v[*k];
        }
        if v.is_object() {
            v[p[p.len() - 1]] = odd_value(rng);
        }
    }
    // The guaranteed defect, last, so nothing above can undo it.
    match rng.gen_range(0..6) {
        0 => job["name"] = json!(format!("{}/{}", ODD[rng.gen_range(0..ODD.len())], rng.gen::<u32>())),
        1 => job["unknown_field"] = odd_value(rng),
        2 => job["schedule"] = json!({"cron": ODD[rng.gen_range(0..ODD.len())], "every": "1s"}),
        3 => job["executor"] = json!({"shell": {"command": ""}}),
        4 => job["retry"]["max_attempts"] = json!(0),
        _ => job["name"] = odd_value(rng).as_array().map(|_| json!(7)).unwrap_or(json!(["n"])),
    }
    let mut bytes = serde_json::to_vec(&job).unwrap();
    match rng.gen_range(0..10) {
        // Truncated, or a byte flipped into invalid UTF-8 or a stray quote.
        0 => bytes.truncate(rng.gen_range(0..bytes.len())),
        1 => {
            let i = rng.gen_range(0..bytes.len());
            bytes[i] = [0xff, b'"', b'{', b'\\', 0x00][rng.gen_range(0..5)];
        }
        // Deep nesting.
        2 => {
            let depth = rng.gen_range(100..5000);
            bytes = format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes();
        }
        // A lone surrogate escape.
        3 => bytes = br#"{"name":"\ud800","executor":{"shell":{"command":"true"}}}"#.to_vec(),
        _ => {}
    }
    bytes
}

fn bad_path(rng: &mut StdRng) -> (reqwest::Method, String, bool) {
    let name = match rng.gen_range(0..6) {
        0 => "nope".to_string(),
        1 => "%00".to_string(),
        2 => "..%2f..%2fetc%2fpasswd".to_string(),
        3 => "%ff%fe".to_string(),
        4 => "a".repeat(rng.gen_range(129..3000)),
        _ => format!("%F0%9F%A6%80{}", rng.gen::<u16>()),
    };
    let query = match rng.gen_range(0..8) {
        0 => "?limit=99999999999999999999999".to_string(),
        1 => "?namespace=%ff".to_string(),
        2 => "?state=bogus".to_string(),
        3 => "?count=0".to_string(),
        4 => "?version=-1".to_string(),
        5 => "?cursor=x&cursor=y".to_string(),
        6 => "?namespace=a/b".to_string(),
        _ => String::new(),
    };
    use reqwest::Method;
    match rng.gen_range(0..11) {
        0 => (Method::POST, format!("/v1/jobs{query}"), true),
        1 => (Method::PUT, format!("/v1/jobs/{name}{query}"), true),
        2 => (Method::GET, format!("/v1/jobs/{name}{query}"), false),
        3 => (Method::DELETE, format!("/v1/jobs/{name}{query}"), false),
        4 => (Method::POST, format!("/v1/jobs/{name}/trigger{query}"), false),
        5 => (Method::POST, format!("/v1/jobs/{name}/pause{query}"), false),
        6 => (Method::GET, format!("/v1/runs/{name}{query}"), false),
        7 => (Method::POST, format!("/v1/runs/{name}/cancel{query}"), false),
        8 => (Method::GET, format!("/v1/runs{query}&bogus=1"), false),
        9 => (Method::PATCH, format!("/v1/jobs/{name}"), true),
        _ => (Method::GET, format!("/v1/{name}"), false),
    }
}

#[test]
fn a_hundred_thousand_bad_requests_get_4xx_and_change_nothing() {
    let n: usize = std::env::var("GNOMON_BAD_REQUESTS").ok().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let seed: u64 = std::env::var("GNOMON_BAD_REQUESTS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("bad requests: {n}, seed {seed} (GNOMON_BAD_REQUESTS_SEED={seed} replays)");
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> = ["dev", "--listen", &addr, "--data-dir", dir.path().join("d").to_str().unwrap()].map(String::from).to_vec();
    let mut server = Proc::spawn(dir.path(), "dev", &args);
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/readyz", None).is_ok_and(|(_, v)| v["leading"] == true)
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let failures = rt.block_on(async {
        let client = reqwest::Client::builder().pool_max_idle_per_host(8).timeout(Duration::from_secs(60)).build().unwrap();
        let tasks = 8;
        let mut handles = Vec::new();
        for t in 0..tasks {
            let (client, addr) = (client.clone(), addr.clone());
            handles.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_add(t as u64));
                let mut failures: Vec<String> = Vec::new();
                for _ in 0..n / tasks {
                    let (method, path, with_body) = bad_path(&mut rng);
                    let mut req = client.request(method.clone(), format!("http://{addr}{path}"));
                    let body = with_body.then(|| bad_body(&mut rng));
                    if let Some(b) = &body {
                        req = req.header("Content-Type", "application/json").body(b.clone());
                    }
                    let resp = match req.send().await {
                        Ok(r) => r,
                        Err(e) => {
                            failures.push(format!("{method} {path}: no answer: {e}"));
                            continue;
                        }
                    };
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    let coded = v["error"]["code"].as_str().is_some_and(|c| !c.is_empty())
                        && v["error"]["message"].as_str().is_some_and(|m| !m.is_empty());
                    if !(400..500).contains(&status) || !coded {
                        let b = body.map(|b| String::from_utf8_lossy(&b[..b.len().min(300)]).to_string()).unwrap_or_default();
                        failures.push(format!("{method} {path} {b:?} -> {status} {}", &text[..text.len().min(300)]));
                    }
                }
                failures
            }));
        }
        let mut all = Vec::new();
        for h in handles {
            all.extend(h.await.unwrap());
        }
        all
    });
    assert!(
        failures.is_empty(),
        "{} of {n} requests were not a coded 4xx (seed {seed}), e.g.:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
    let (_, jobs) = http(&addr, "GET", "/v1/jobs", None).unwrap();
    assert_eq!(jobs["jobs"].as_array().map(Vec::len), Some(0), "nothing was written: {jobs}");
    let (_, runs) = http(&addr, "GET", "/v1/runs", None).unwrap();
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(0), "{runs}");
    let log = server.log();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    assert!(server.child.try_wait().unwrap().is_none(), "the server is still up");
    server.signal(SIGTERM);
    let _ = server.wait_exit(Duration::from_secs(20));
}
