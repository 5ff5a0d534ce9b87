//! Worker benchmark: real `gnomon server` (SQLite, `synchronous=FULL`) and
//! `gnomon worker` processes (release build) on loopback. Prints, asserting
//! nothing:
//! - **A, throughput**: 20,000 runs of the `noop` handler, one worker with
//!   capacity 50. Runs/s from the first creation to the last completion and
//!   from the worker's start to the last completion, with the runs created
//!   before the worker starts (A1) and while it runs (A2). Runs are created
//!   with `POST /v1/jobs/{name}/trigger?count=1000`, four calls in flight.
//! - **B1, burst lateness**: 2,000 one-shot (`at`) jobs due at the same
//!   instant; attempt-start lateness (started_at − scheduled_at) p50/p99/max.
//! - **B2, spread lateness**: 2,000 one-shot jobs due 1 ms apart.
//!
//! Usage: bench_workers BIN [A|B1|B2 ...]; `BENCH_CAPACITY` sets A's worker
//! capacity (50), `BENCH_B_CAPACITY` B's (256), `BENCH_PREFETCH` the
//! worker's prefetch queue (default: eight times its capacity),
//! `BENCH_ROUNDS` how many times to run them (then it prints each figure's
//! min / median / max). `BENCH_STORE=raft` runs three members of the
//! embedded Raft store instead of one SQLite server (the worker and the
//! API calls go to the leader; "server" CPU is the leader's).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const RUNS: usize = 20_000;
const ONE_SHOTS: usize = 2_000;

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Env {
    bin: String,
    dir: tempfile::TempDir,
    addr: String,
    http: reqwest::Client,
    procs: Procs,
}

impl Env {
    async fn start(bin: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let raft = std::env::var("BENCH_STORE").is_ok_and(|s| s == "raft");
        let members = if raft { 3 } else { 1 };
        let addrs: Vec<String> = (0..members)
            .map(|_| format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()))
            .collect();
        let peers: Vec<String> = addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect();
        let mut servers = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let store = if raft {
                format!("raft://{}", dir.path().join(format!("m{}", i + 1)).display())
            } else {
                format!("sqlite://{}", dir.path().join("g.db").display())
            };
            let mut cmd = Command::new(bin);
            cmd.args(["server", "--listen", addr, "--node-id", &format!("bench-{}", i + 1), "--store", &store]);
            // A's 20,000 runs stay below the backlog line (90 % of
            // --max-pending), past which triggers are refused with 429.
            cmd.args(["--max-pending", "50000"]);
            if raft {
                cmd.args(["--raft-id", &(i + 1).to_string(), "--raft-peers", &peers.join(",")]);
                if i == 0 {
                    cmd.arg("--raft-bootstrap");
                }
            }
            servers.push(cmd.env("GNOMON_LOG", "warn").stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().unwrap());
        }
        let mut env = Env { bin: bin.into(), dir, addr: addrs[0].clone(), http: reqwest::Client::new(), procs: Procs(servers) };
        'wait: for _ in 0..300 {
            for (i, a) in addrs.iter().enumerate() {
                if let Ok(r) = env.http.get(format!("http://{a}/v1/leader")).send().await {
                    if r.json::<Value>().await.map(|v| v["is_self"] == json!(true)).unwrap_or(false) {
                        // The leader's process first, so "server" CPU is its.
                        env.addr = a.clone();
                        env.procs.0.swap(0, i);
                        break 'wait;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        env
    }

    fn worker(&mut self, capacity: u32) {
        let data = self.dir.path().join(format!("worker-{}", self.procs.0.len()));
        let mut cmd = Command::new(&self.bin);
        cmd.args(["--server", &self.addr, "worker", "--id", &format!("bench-{}", self.procs.0.len()), "--capacity", &capacity.to_string()]);
        // The worker's default prefetch queue is eight times its capacity; BENCH_PREFETCH overrides it.
        if let Ok(p) = std::env::var("BENCH_PREFETCH") {
            cmd.args(["--prefetch", &p]);
        }
        let child = cmd
            .arg("--data-dir")
            .arg(data)
            .env("GNOMON_LOG", "warn")
            .env("GNOMON_ALLOW_ROOT_JOBS", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.procs.0.push(child);
    }

    /// CPU seconds (user + system) each process has used so far: the
    /// server first, then the workers (Linux `/proc`; 0 elsewhere).
    fn cpu_seconds(&self) -> Vec<f64> {
        self.procs
            .0
            .iter()
            .map(|c| {
                let stat = std::fs::read_to_string(format!("/proc/{}/stat", c.id())).unwrap_or_default();
                // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
                let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
                let f: Vec<&str> = rest.split_whitespace().collect();
                let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                (ticks(11) + ticks(12)) / 100.0
            })
            .collect()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let r = self.http.post(format!("http://{}{path}", self.addr)).json(&body).send().await.unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {v}");
        v
    }

    /// A sample's value from /metrics (the first line starting with `name`).
    async fn metric(&self, name: &str) -> f64 {
        let text = match self.http.get(format!("http://{}/metrics", self.addr)).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => return 0.0,
        };
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    }

    /// `gnomon_runs_total{state="succeeded"}` from /metrics.
    async fn succeeded(&self) -> u64 {
        let text = match self.http.get(format!("http://{}/metrics", self.addr)).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => return 0,
        };
        text.lines()
            .find(|l| l.starts_with("gnomon_runs_total{") && l.contains("state=\"succeeded\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
            .unwrap_or(0)
    }

    /// Waits until the leader lists a worker session (polled every 5 ms).
    async fn wait_worker_session(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(r) = self.http.get(format!("http://{}/v1/workers", self.addr)).send().await {
                if r.json::<Value>().await.is_ok_and(|v| v["workers"].as_array().is_some_and(|w| !w.is_empty())) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the worker did not connect within 30 s");
    }

    /// Polls /metrics every `every` until `n` runs succeeded; returns when.
    async fn wait_succeeded(&self, n: u64, every: Duration) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(900);
        while self.succeeded().await < n && Instant::now() < deadline {
            tokio::time::sleep(every).await;
        }
        Instant::now()
    }

    /// `POST`s each `(path, body)`, `in_flight` at a time; panics if one fails.
    async fn post_all(&self, requests: Vec<(String, Value)>, in_flight: usize) {
        let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(in_flight));
        let mut tasks = Vec::new();
        for (path, body) in requests {
            let url = format!("http://{}{path}", self.addr);
            let (http, permit) = (self.http.clone(), sem.clone().acquire_owned().await.unwrap());
            tasks.push(tokio::spawn(async move {
                let r = http.post(url).json(&body).send().await;
                drop(permit);
                r.map(|r| r.status().is_success()).unwrap_or(false)
            }));
        }
        for t in tasks {
            assert!(t.await.unwrap(), "a request failed");
        }
    }

    /// `n` runs of `job` by trigger calls of 1,000, four in flight (the
    /// leader writes one while the next request and the last response are
    /// on the wire).
    async fn create_runs(&self, job: &str, n: usize) {
        self.post_all((0..n / 1000).map(|_| (format!("/v1/jobs/{job}/trigger?count=1000"), json!({}))).collect(), 4).await;
    }

    async fn all_runs(&self) -> Vec<Value> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut q = vec![("limit", "1000".to_string())];
            if let Some(c) = &cursor {
                q.push(("cursor", c.clone()));
            }
            let page: Value = self.http.get(format!("http://{}/v1/runs", self.addr)).query(&q).send().await.unwrap().json().await.unwrap();
            out.extend(page["runs"].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => break,
            }
        }
        out
    }
}

fn ms(v: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or("")).map(|d| d.timestamp_millis()).unwrap_or(0)
}

fn pct(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

/// Each round's headline figures, by name, for the summary over rounds.
type Figures = Vec<(String, f64)>;

async fn throughput(bin: &str, before: bool) -> Figures {
    let mut env = Env::start(bin).await;
    env.post("/v1/jobs", json!({"name": "a", "executor": {"handler": {"name": "noop"}}})).await;
    let server_cpu = env.cpu_seconds()[0];
    let capacity = std::env::var("BENCH_CAPACITY").ok().and_then(|c| c.parse().ok()).unwrap_or(50);
    let (first, worker_start) = if before {
        let first = Instant::now();
        env.create_runs("a", RUNS).await;
        let created = first.elapsed();
        let ws = Instant::now();
        env.worker(capacity);
        println!("  created {RUNS} runs in {:.2}s before the worker started", created.as_secs_f64());
        (first, ws)
    } else {
        let ws = Instant::now();
        env.worker(capacity);
        env.wait_worker_session().await;
        let first = Instant::now();
        env.create_runs("a", RUNS).await;
        println!("  created {RUNS} runs in {:.2}s while the worker ran", first.elapsed().as_secs_f64());
        (first, ws)
    };
    let done = env.wait_succeeded(RUNS as u64, Duration::from_millis(10)).await;
    let cpu = env.cpu_seconds();
    println!(
        "  CPU seconds used by the workload: server {:.2}, worker {:.2} (2 cores: {:.2} core-seconds available from first creation)",
        cpu[0] - server_cpu,
        cpu.last().copied().filter(|_| cpu.len() > 1).unwrap_or(0.0),
        2.0 * (done - first).as_secs_f64()
    );
    let (writes, busy) =
        (env.metric("gnomon_store_turn_write_seconds_count").await, env.metric("gnomon_store_turn_write_seconds_sum").await);
    let span = (done - worker_start).as_secs_f64();
    println!(
        "  leader turn writes: {writes:.0}, ~{:.0} transitions and {:.2} ms each, the store busy with them {:.0}% of the time from worker start",
        2.0 * RUNS as f64 / writes.max(1.0),
        busy * 1000.0 / writes.max(1.0),
        100.0 * busy / span
    );
    let label = if before { "A1 (created before the worker)" } else { "A2 (created while it runs)" };
    let (from_first, from_worker) = (RUNS as f64 / (done - first).as_secs_f64(), RUNS as f64 / (done - worker_start).as_secs_f64());
    println!(
        "{label}: {from_first:.0} runs/s from first creation, {from_worker:.0} runs/s from worker start ({} succeeded)",
        env.succeeded().await
    );
    let short = if before { "A1" } else { "A2" };
    vec![(format!("{short} runs/s from first creation"), from_first), (format!("{short} runs/s from worker start"), from_worker)]
}

async fn lateness(bin: &str, spread_ms: i64) -> Figures {
    let mut env = Env::start(bin).await;
    let capacity: u32 = std::env::var("BENCH_B_CAPACITY").ok().and_then(|c| c.parse().ok()).unwrap_or(256);
    env.worker(capacity);
    env.wait_worker_session().await;
    let due = chrono::Utc::now().timestamp_millis() + 15_000;
    let created = Instant::now();
    let jobs = (0..ONE_SHOTS)
        .map(|i| {
            let at = chrono::DateTime::from_timestamp_millis(due + i as i64 * spread_ms)
                .unwrap()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            ("/v1/jobs".to_string(), json!({"name": format!("b{i}"), "schedule": {"at": at}, "executor": {"handler": {"name": "noop"}}}))
        })
        .collect();
    env.post_all(jobs, 16).await;
    let took = created.elapsed();
    assert!(took < Duration::from_secs(14), "creating the jobs took {took:?}, past their due time");
    // Lateness comes from the stored timestamps, not from this wait: poll
    // seldom, so the polling does not take CPU from the burst.
    env.wait_succeeded(ONE_SHOTS as u64, Duration::from_millis(500)).await;
    let mut late = Vec::new();
    // Where the time goes: scheduled -> fired (committed), fired -> assigned
    // (persisted), assigned -> started on the worker.
    let (mut fire, mut assign, mut start) = (Vec::new(), Vec::new(), Vec::new());
    for r in env.all_runs().await {
        let detail: Value =
            env.http.get(format!("http://{}/v1/runs/{}", env.addr, r["id"].as_str().unwrap())).send().await.unwrap().json().await.unwrap();
        let (scheduled, fired) = (ms(&detail["scheduled_at"]), ms(&detail["fired_at"]));
        let (assigned, started) = (ms(&detail["attempts"][0]["assigned_at"]), ms(&detail["attempts"][0]["started_at"]));
        late.push(started - scheduled);
        fire.push(fired - scheduled);
        assign.push(assigned - fired);
        start.push(started - assigned);
    }
    late.sort_unstable();
    for v in [&mut fire, &mut assign, &mut start] {
        v.sort_unstable();
    }
    let label = if spread_ms == 0 { "B1 (2,000 due at one instant)" } else { "B2 (2,000 due 1 ms apart)" };
    println!(
        "{label}: attempt-start lateness p50 {} ms, p99 {} ms, max {} ms ({} runs, worker capacity {capacity})",
        pct(&late, 0.5),
        pct(&late, 0.99),
        late.last().copied().unwrap_or(0),
        late.len()
    );
    println!(
        "  stages p50/p99: scheduled->fired {}/{} ms, fired->assigned {}/{} ms, assigned->started {}/{} ms",
        pct(&fire, 0.5),
        pct(&fire, 0.99),
        pct(&assign, 0.5),
        pct(&assign, 0.99),
        pct(&start, 0.5),
        pct(&start, 0.99)
    );
    let short = if spread_ms == 0 { "B1" } else { "B2" };
    vec![
        (format!("{short} lateness p50 ms"), pct(&late, 0.5) as f64),
        (format!("{short} lateness p99 ms"), pct(&late, 0.99) as f64),
        (format!("{short} lateness max ms"), late.last().copied().unwrap_or(0) as f64),
    ]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args.get(1).cloned().unwrap_or_else(|| "target/release/gnomon".into());
    let only: Vec<&str> = args.iter().skip(2).map(String::as_str).collect();
    let wants = |w: &str| only.is_empty() || only.contains(&w);
    // BENCH_ROUNDS runs the chosen workloads that many times and ends with
    // each figure's min / median / max: one run on a shared machine is noise.
    let rounds: usize = std::env::var("BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(1).max(1);
    println!("gnomon worker benchmark (SQLite store, synchronous=FULL; one worker process)");
    let mut all: Vec<(String, Vec<f64>)> = Vec::new();
    for round in 1..=rounds {
        if rounds > 1 {
            println!("round {round} of {rounds}");
        }
        let mut figures = Figures::new();
        if wants("A") {
            figures.extend(throughput(&bin, true).await);
            figures.extend(throughput(&bin, false).await);
        }
        if wants("B1") {
            figures.extend(lateness(&bin, 0).await);
        }
        if wants("B2") {
            figures.extend(lateness(&bin, 1).await);
        }
        for (name, v) in figures {
            match all.iter_mut().find(|(n, _)| *n == name) {
                Some((_, vs)) => vs.push(v),
                None => all.push((name, vec![v])),
            }
        }
    }
    if rounds > 1 {
        println!("summary over {rounds} rounds (min / median / max):");
        for (name, mut vs) in all {
            vs.sort_by(f64::total_cmp);
            let median = if vs.len() % 2 == 1 { vs[vs.len() / 2] } else { (vs[vs.len() / 2 - 1] + vs[vs.len() / 2]) / 2.0 };
            println!("  {name}: {:.0} / {median:.0} / {:.0}", vs[0], vs[vs.len() - 1]);
        }
    }
}
