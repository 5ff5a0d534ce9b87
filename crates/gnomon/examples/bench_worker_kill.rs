//! Worker-death detection on the etcd store: a `gnomon server` (release
//! build, etcd store on the 3-member test cluster) and, N times, a fresh
//! `gnomon worker` that takes a long run and is then killed with SIGKILL.
//! Prints the detection delay — from the kill to the end of the attempt as
//! `lost` (the leader's eviction, normally on the deletion of the worker's
//! session key when its etcd lease runs out) — p50/p99/max, with the
//! session TTL used. Asserts nothing.
//!
//! Usage: bench_worker_kill BIN [--kills N] [--ttl 15s]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn get(http: &reqwest::Client, url: String) -> Value {
    match http.get(url).send().await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

fn ms(v: &Value) -> i64 {
    v.as_str().and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok()).map(|d| d.timestamp_millis()).unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let bin = args.remove(0);
    let mut kills = 20;
    let mut ttl = "15s".to_string();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--kills" => kills = it.next().and_then(|n| n.parse().ok()).expect("--kills N"),
            "--ttl" => ttl = it.next().expect("--ttl 15s"),
            other => panic!("unknown argument {other:?}"),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let cluster = format!("killbench-{:08x}", rand::random::<u32>());
    let endpoints = gnomon_backend::testing::testdb::etcd_endpoints();
    let store = format!("etcd://{endpoints}/{cluster}");
    let _server = Killed(
        Command::new(&bin)
            .args(["server", "--listen", &addr, "--store", &store, "--lease-ttl", &ttl])
            .env("GNOMON_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");
    for _ in 0..600 {
        if get(&http, format!("{base}/v1/leader")).await["is_self"] == json!(true) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let job = json!({"name": "hold", "executor": {"shell": {"command": "sleep", "args": ["600"]}}, "retry": {"max_attempts": 1}});
    let _ = http.post(format!("{base}/v1/jobs")).json(&job).send().await;
    println!("worker kill → attempt lost, etcd store (3 members), session TTL {ttl}, {kills} kills");
    let mut delays = Vec::new();
    for i in 0..kills {
        let id = format!("w{i}");
        let data = dir.path().join(&id);
        let w = Command::new(&bin)
            .args(["--server", &addr, "worker", "--id", &id, "--capacity", "1", "--data-dir", data.to_str().unwrap()])
            .env("GNOMON_ALLOW_ROOT_JOBS", "1")
            .env("GNOMON_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let w = Killed(w);
        let run: Value = match http.post(format!("{base}/v1/jobs/hold/trigger")).send().await {
            Ok(r) => r.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        let run_id = run["id"].as_str().unwrap_or_default().to_string();
        let deadline = Instant::now() + Duration::from_secs(60);
        while get(&http, format!("{base}/v1/runs/{run_id}")).await["state"] != "running" && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Kill it at a random point of its lease's refresh cycle.
        tokio::time::sleep(Duration::from_millis(u64::from(rand::random::<u16>() % 5000))).await;
        let t0 = now_ms();
        // SAFETY: kill(2) on a child this benchmark started.
        unsafe {
            kill(w.0.id() as i32, 9);
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let r = get(&http, format!("{base}/v1/runs/{run_id}")).await;
            if let Some(a) = r["attempts"].as_array().and_then(|a| a.first()).filter(|a| a["state"] == "lost") {
                delays.push(ms(&a["ended_at"]) - t0);
                break;
            }
            if Instant::now() > deadline {
                println!("  kill {i}: not detected within 120 s");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(w);
    }
    delays.sort();
    if delays.is_empty() {
        println!("no detections measured");
        return;
    }
    let pct = |p: f64| delays[((delays.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "detection delay: n={} p50={} ms p99={} ms max={} ms (all: {:?})",
        delays.len(),
        pct(0.5),
        pct(0.99),
        delays[delays.len() - 1],
        delays
    );
    if let Ok(mut c) = etcd_client::Client::connect(gnomon_backend::etcd::parse_endpoints(&endpoints).unwrap_or_default(), None).await {
        let _ = c.delete(format!("/gnomon/{cluster}/"), Some(etcd_client::DeleteOptions::new().with_prefix())).await;
    }
}
