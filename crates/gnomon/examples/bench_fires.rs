//! Fire benchmark: starts a real `gnomon dev` (release build), creates N jobs
//! on `every: X` with the built-in `noop` handler, lets them run, then reads
//! every run back through the API and prints fires/s, fire lateness
//! (scheduled time -> run created) p50/p99/max, duplicates, misses and the
//! server's peak RSS. Nothing is asserted. Run it with `bench/fires.sh`.
//!
//! Usage: bench_fires BIN JOBS EVERY_SECS DURATION_SECS

use std::collections::{HashMap, HashSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn pct(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(v: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or("")).map(|d| d.timestamp_millis()).unwrap_or(0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let bin = args.get(1).cloned().unwrap_or_else(|| "target/release/gnomon".into());
    let jobs: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let every: i64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(1);
    let duration: u64 = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(60);
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let url = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(&bin)
        // The pending limit is raised so backpressure (default 10,000
        // pending runs) does not defer the 100,000-job burst: this measures
        // the fire path, not the controller.
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--capacity", "2048", "--max-pending", "1000000", "--data-dir"])
        .arg(dir.path())
        // A benchmark on a machine of its own: its jobs may run as root.
        .env("GNOMON_ALLOW_ROOT_JOBS", "1")
        .env("GNOMON_LOG", std::env::var("GNOMON_LOG").unwrap_or_else(|_| "warn".into()))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let pid = child.id();
    let http = reqwest::Client::new();
    for _ in 0..300 {
        if http.get(format!("{url}/v1/leader")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "gnomon fire benchmark: {jobs} jobs, every {every}s, measured for {duration}s (SQLite, synchronous=FULL, --max-pending 1000000)"
    );
    let created = Instant::now();
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = Vec::new();
    for i in 0..jobs {
        let http = http.clone();
        let url = url.clone();
        let permit = sem.clone().acquire_owned().await?;
        tasks.push(tokio::spawn(async move {
            let body = json!({"name": format!("j{i}"), "schedule": {"every": format!("{every}s")}, "misfire": "fire_all", "executor": {"handler": {"name": "noop"}}});
            let r = http.post(format!("{url}/v1/jobs")).json(&body).send().await;
            drop(permit);
            r.map(|r| r.status().is_success()).unwrap_or(false)
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap_or(false));
    }
    println!("created {ok}/{jobs} jobs in {:.1}s", created.elapsed().as_secs_f64());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let settled_rss = rss_kib(pid);
    let start_ms = chrono::Utc::now().timestamp_millis() + 2000;
    let mut peak_rss = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(duration + 2) {
        peak_rss = peak_rss.max(rss_kib(pid));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let end_ms = start_ms + (duration as i64) * 1000;
    tokio::time::sleep(Duration::from_secs(20)).await;
    peak_rss = peak_rss.max(rss_kib(pid));
    // Read every run back.
    let mut runs = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut q = vec![("limit", "1000".to_string())];
        if let Some(c) = &cursor {
            q.push(("cursor", c.clone()));
        }
        let page: Value = http.get(format!("{url}/v1/runs")).query(&q).send().await?.json().await?;
        runs.extend(page["runs"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    // SIGTERM the server we started.
    unsafe { kill(pid as i32, 15) };
    let _ = child.wait();
    let mut lateness = Vec::new();
    let mut seen: HashMap<(String, i64), usize> = HashMap::new();
    let mut states: HashMap<String, usize> = HashMap::new();
    for r in &runs {
        let at = ms(&r["scheduled_at"]);
        *seen.entry((r["job"].as_str().unwrap_or("").to_string(), at)).or_default() += 1;
        if at >= start_ms && at < end_ms {
            lateness.push(ms(&r["fired_at"]) - at);
            *states.entry(r["state"].as_str().unwrap_or("").to_string()).or_default() += 1;
        }
    }
    let duplicates: usize = seen.values().filter(|c| **c > 1).map(|c| c - 1).sum();
    let period = every * 1000;
    let first = (start_ms + period - 1) / period * period;
    let expected: HashSet<i64> = (0..).map(|k| first + k * period).take_while(|t| *t < end_ms).collect();
    let mut misses = 0;
    let mut missed_at: HashMap<i64, usize> = HashMap::new();
    for i in 0..jobs {
        let name = format!("j{i}");
        for t in &expected {
            if !seen.contains_key(&(name.clone(), *t)) {
                misses += 1;
                *missed_at.entry(*t).or_default() += 1;
            }
        }
    }
    for (t, n) in &missed_at {
        println!("  missed at {}: {n}", chrono::DateTime::from_timestamp_millis(*t).map(|d| d.to_rfc3339()).unwrap_or_default());
    }
    lateness.sort_unstable();
    let window = (end_ms - start_ms) as f64 / 1000.0;
    println!("runs in window:      {} ({:?})", lateness.len(), states);
    println!("fires/s:             {:.0}", lateness.len() as f64 / window);
    println!(
        "fire lateness ms:    p50 {}  p99 {}  max {}",
        pct(&lateness, 0.5),
        pct(&lateness, 0.99),
        lateness.last().copied().unwrap_or(0)
    );
    println!("duplicates:          {duplicates}");
    println!("misses:              {misses} (of {} expected)", expected.len() * jobs);
    println!(
        "server RSS:          {:.1} MiB after creating the jobs, {:.1} MiB peak",
        settled_rss as f64 / 1024.0,
        peak_rss as f64 / 1024.0
    );
    Ok(())
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}
