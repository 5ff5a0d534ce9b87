//! Process-level tests of remote workers: real `gnomon server` and
//! `gnomon worker` processes on loopback, with SIGKILL, SIGSTOP, a server
//! restart and a TCP proxy that cuts a worker off. A short lease (3-5 s)
//! keeps them quick; bounds are generous because real processes are involved.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::*;

struct Cluster {
    dir: tempfile::TempDir,
    port: u16,
    ttl: &'static str,
    extra: Vec<String>,
    server: Option<Proc>,
}

impl Cluster {
    fn new(ttl: &'static str) -> Cluster {
        Cluster::with_args(ttl, &[])
    }

    fn with_args(ttl: &'static str, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cluster { dir, port: free_port(), ttl, extra: extra.iter().map(|s| s.to_string()).collect(), server: None };
        c.start_server();
        c
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn start_server(&mut self) {
        std::fs::create_dir_all(self.dir.path().join("db")).unwrap();
        let store = format!("sqlite://{}", self.dir.path().join("db/g.db").display());
        let mut args: Vec<String> = ["server", "--listen", &self.addr(), "--node-id", "s1", "--lease-ttl", self.ttl, "--store", &store]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(self.extra.iter().cloned());
        self.server = Some(Proc::spawn(self.dir.path(), "server", &args));
        let addr = self.addr();
        wait_until("the server to lead", Duration::from_secs(30), || {
            http(&addr, "GET", "/v1/leader", None).is_ok_and(|(_, v)| v["is_self"] == json!(true))
        });
    }

    fn worker_via(&self, id: &str, capacity: u32, server: &str) -> Proc {
        self.worker_in(id, capacity, server, &format!("w-{id}"))
    }

    fn worker_in(&self, id: &str, capacity: u32, server: &str, data_dir: &str) -> Proc {
        self.worker_with(id, capacity, server, data_dir, &[])
    }

    fn worker_with(&self, id: &str, capacity: u32, server: &str, data_dir: &str, extra: &[&str]) -> Proc {
        let data = self.dir.path().join(data_dir);
        let mut args: Vec<String> = [
            "--server",
            server,
            "worker",
            "--id",
            id,
            "--capacity",
            &capacity.to_string(),
            "--data-dir",
            data.to_str().unwrap(),
            "--drain-timeout",
            "20s",
            "--label",
            &format!("name={id}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        Proc::spawn(self.dir.path(), &format!("worker-{data_dir}"), &args)
    }

    fn worker(&self, id: &str, capacity: u32) -> Proc {
        self.worker_via(id, capacity, &self.addr())
    }

    fn api(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|b| b.to_string());
        http(&self.addr(), method, path, body.as_deref().map(str::as_bytes)).unwrap()
    }

    fn wait_workers(&self, ids: &[&str]) {
        wait_until(&format!("workers {ids:?} to be live"), Duration::from_secs(30), || {
            let (_, v) = self.api("GET", "/v1/workers", None);
            let live: Vec<String> = v["workers"]
                .as_array()
                .map(|a| a.iter().filter(|w| w["state"] == "live").map(|w| w["id"].as_str().unwrap_or("").to_string()).collect())
                .unwrap_or_default();
            ids.iter().all(|id| live.iter().any(|l| l == id))
        });
    }

    fn create(&self, job: Value) {
        let (status, body) = self.api("POST", "/v1/jobs", Some(job));
        assert_eq!(status, 201, "{body}");
    }

    fn trigger(&self, job: &str, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                let (status, body) = self.api("POST", &format!("/v1/jobs/{job}/trigger"), None);
                assert!(status < 300, "{body}");
                body["id"].as_str().unwrap().to_string()
            })
            .collect()
    }

    /// Creates `n` runs of `job` in one trigger call (they reach the leader together).
    fn trigger_batch(&self, job: &str, n: usize) -> Vec<String> {
        let (status, body) = self.api("POST", &format!("/v1/jobs/{job}/trigger?count={n}"), None);
        assert!(status < 300, "{body}");
        body["ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
    }

    fn run(&self, id: &str) -> Value {
        self.api("GET", &format!("/v1/runs/{id}"), None).1
    }

    fn wait_states(&self, ids: &[String], state: &str, timeout: Duration) {
        wait_until(&format!("{} runs to be {state}", ids.len()), timeout, || ids.iter().all(|id| self.run(id)["state"] == state));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // On a failure, show what the processes said.
        if std::thread::panicking() {
            dump_logs(self.dir.path());
        }
    }
}

fn ts(v: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or("")).map(|d| d.timestamp_millis()).unwrap_or(0)
}

fn retrying_shell(name: &str, script: &str) -> Value {
    json!({"name": name, "executor": {"shell": {"command": "sh", "args": ["-c", script]}},
           "retry": {"max_attempts": 3, "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0, "jitter": 0}}})
}

#[test]
fn a_killed_workers_attempts_finish_on_another_worker() {
    let c = Cluster::new("3s");
    let a = c.worker("wa", 60);
    c.wait_workers(&["wa"]);
    c.create(retrying_shell("sleeper", "sleep 5"));
    let runs = c.trigger("sleeper", 50);
    c.wait_states(&runs, "running", Duration::from_secs(30));
    let _b = c.worker("wb", 60);
    c.wait_workers(&["wa", "wb"]);
    let killed = Instant::now();
    a.signal(SIGKILL);
    c.wait_states(&runs, "succeeded", Duration::from_secs(3 + 5 + 20));
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(3 + 5 + 10), "all 50 succeeded {took:?} after the kill (lease 3s + 5s run + margin)");
    for id in &runs {
        let run = c.run(id);
        let attempts = run["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "{run}");
        assert_eq!((attempts[0]["state"].as_str(), attempts[0]["worker"].as_str()), (Some("lost"), Some("wa")), "{run}");
        assert_eq!((attempts[1]["state"].as_str(), attempts[1]["worker"].as_str()), (Some("succeeded"), Some("wb")), "{run}");
        assert!(ts(&attempts[1]["assigned_at"]) >= ts(&attempts[0]["ended_at"]), "no two live attempts at once: {run}");
    }
    drop(a);
}

#[test]
fn a_stopped_worker_is_fenced_and_its_late_reports_are_rejected() {
    let c = Cluster::new("3s");
    let a = c.worker("wa", 20);
    c.wait_workers(&["wa"]);
    c.create(retrying_shell("nap", "sleep 4"));
    let runs = c.trigger("nap", 10);
    c.wait_states(&runs, "running", Duration::from_secs(30));
    let _b = c.worker("wb", 20);
    c.wait_workers(&["wa", "wb"]);
    a.signal(SIGSTOP);
    // Past the lease: the leader gives the runs to wb.
    std::thread::sleep(Duration::from_secs(6));
    a.signal(SIGCONT);
    c.wait_states(&runs, "succeeded", Duration::from_secs(30));
    // Give wa time to reconnect and send what it still had.
    c.wait_workers(&["wa", "wb"]);
    std::thread::sleep(Duration::from_secs(3));
    for id in &runs {
        let run = c.run(id);
        assert_eq!(run["state"], "succeeded");
        let attempts = run["attempts"].as_array().unwrap();
        let successes = attempts.iter().filter(|a| a["state"] == "succeeded").count();
        assert_eq!(successes, 1, "exactly one success: {run}");
        assert_eq!((attempts[0]["state"].as_str(), attempts[0]["worker"].as_str()), (Some("lost"), Some("wa")), "{run}");
    }
    let log = a.log();
    assert!(
        log.contains("report rejected") || log.contains("aborted") || log.contains("self-fencing"),
        "wa was told or fenced itself:\n{log}"
    );
}

#[test]
fn a_server_restart_loses_no_result() {
    let mut c = Cluster::new("5s");
    let _a = c.worker("wa", 30);
    c.wait_workers(&["wa"]);
    // One attempt only: every result must come from the original attempt.
    c.create(json!({"name": "work", "executor": {"shell": {"command": "sh", "args": ["-c", "sleep 3; echo done-$GNOMON_ATTEMPT"]}}}));
    let runs = c.trigger("work", 20);
    c.wait_states(&runs, "running", Duration::from_secs(30));
    let mut server = c.server.take().unwrap();
    server.signal(SIGKILL);
    server.wait_exit(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(2));
    c.start_server();
    c.wait_states(&runs, "succeeded", Duration::from_secs(40));
    for id in &runs {
        let run = c.run(id);
        let attempts = run["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "recorded exactly once: {run}");
        assert_eq!(attempts[0]["state"], "succeeded");
        assert!(attempts[0]["output"].as_str().unwrap_or("").contains("done-1"), "{run}");
    }
}

/// A TCP proxy the test controls: `cut` closes every connection and refuses
/// new ones until `restore`.
#[test]
fn a_cut_off_worker_stops_its_attempts_before_they_are_retried() {
    let c = Cluster::new("3s");
    let proxy = Proxy::start(c.addr());
    let log = c.dir.path().join("ticks.log");
    let _a = c.worker_via("wa", 10, &format!("127.0.0.1:{}", proxy.port));
    c.wait_workers(&["wa"]);
    // Each attempt writes a timestamped line every 100 ms for ~6 s.
    let script =
        format!("for i in $(seq 1 60); do echo \"$GNOMON_RUN_ID $GNOMON_ATTEMPT $(date +%s%N)\" >> {}; sleep 0.1; done", log.display());
    c.create(retrying_shell("ticker", &script));
    let runs = c.trigger("ticker", 5);
    c.wait_states(&runs, "running", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let _b = c.worker("wb", 10);
    c.wait_workers(&["wa", "wb"]);
    proxy.cut();
    c.wait_states(&runs, "succeeded", Duration::from_secs(40));
    proxy.restore();
    // Per run and attempt, the first and last tick.
    let mut spans: HashMap<(String, u32), (i64, i64)> = HashMap::new();
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [run, attempt, ns] = parts[..] else { continue };
        let t: i64 = ns.parse().unwrap_or(0) / 1_000_000;
        let e = spans.entry((run.to_string(), attempt.parse().unwrap_or(0))).or_insert((t, t));
        e.0 = e.0.min(t);
        e.1 = e.1.max(t);
    }
    for id in &runs {
        let run = c.run(id);
        let attempts = run["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "{run}");
        assert_eq!(attempts[0]["state"], "lost", "{run}");
        let first = spans.get(&(id.clone(), 1)).expect("attempt 1 ticked");
        let second = spans.get(&(id.clone(), 2)).expect("attempt 2 ticked");
        assert!(first.1 < second.0, "run {id}: attempt 1 ticked until {} but attempt 2 started at {}", first.1, second.0);
    }
}

/// (assigned, started, ended) of each run's first attempt, by start.
fn attempt_times(c: &Cluster, runs: &[String]) -> Vec<(i64, i64, i64)> {
    let mut times: Vec<(i64, i64, i64)> = runs
        .iter()
        .map(|id| {
            let a = &c.run(id)["attempts"][0];
            (ts(&a["assigned_at"]), ts(&a["started_at"]), ts(&a["ended_at"]))
        })
        .collect();
    times.sort_by_key(|t| t.1);
    times
}

#[test]
fn short_runs_queue_on_a_busy_worker_and_slow_ones_wait_pending() {
    let c = Cluster::new("5s");
    let _a = c.worker_with("wa", 1, &c.addr(), "w-wa", &["--prefetch", "4"]);
    c.wait_workers(&["wa"]);
    let (_, v) = c.api("GET", "/v1/workers", None);
    assert_eq!((v["workers"][0]["capacity"].as_u64(), v["workers"][0]["prefetch"].as_u64()), (Some(1), Some(4)), "{v}");
    let shell = |name: &str, secs: &str| json!({"name": name, "executor": {"shell": {"command": "sleep", "args": [secs]}}});
    // Short runs (5 ms, well under the 100 ms gate even on a loaded
    // machine): once the worker is known to finish quickly, runs are
    // queued on it ahead of its one slot, and still run one at a time.
    c.create(shell("quick", "0.005"));
    let warm = c.trigger("quick", 3);
    c.wait_states(&warm, "succeeded", Duration::from_secs(30));
    let quick = c.trigger_batch("quick", 8);
    c.wait_states(&quick, "succeeded", Duration::from_secs(30));
    let times = attempt_times(&c, &quick);
    for w in times.windows(2) {
        assert!(w[1].1 >= w[0].2, "capacity 1: executions never overlap: {times:?}");
    }
    assert!(times.windows(2).any(|w| w[1].0 < w[0].2), "some runs were queued before the previous one ended: {times:?}");
    // Slow runs (a known duration over 100 ms) are never queued: each is
    // assigned only once a slot is free.
    c.create(shell("slow", "0.4"));
    let first = c.trigger("slow", 1);
    c.wait_states(&first, "succeeded", Duration::from_secs(30));
    let slow = c.trigger_batch("slow", 3);
    c.wait_states(&slow, "succeeded", Duration::from_secs(30));
    let times = attempt_times(&c, &slow);
    for w in times.windows(2) {
        assert!(w[1].0 >= w[0].2, "a slow run waits pending, not queued behind another: {times:?}");
    }
}

#[test]
fn runs_are_spread_by_each_routing_strategy() {
    let c = Cluster::new("5s");
    let _a = c.worker("wa", 50);
    let _b = c.worker("wb", 50);
    c.wait_workers(&["wa", "wb"]);
    let noop =
        |name: &str, strategy: &str| json!({"name": name, "executor": {"handler": {"name": "noop"}}, "route": {"strategy": strategy}});
    c.create(noop("ll", "least_loaded"));
    c.create(noop("rr", "round_robin"));
    for i in 0..20 {
        c.create(noop(&format!("ch-{i}"), "consistent_hash"));
    }
    // Label selectors: only wb may run this one.
    c.create(json!({"name": "pinned", "executor": {"handler": {"name": "noop"}}, "route": {"labels": {"name": "wb"}}}));
    let mut by_job: Vec<(String, Vec<String>)> =
        vec![("ll".into(), c.trigger("ll", 400)), ("rr".into(), c.trigger("rr", 400)), ("pinned".into(), c.trigger("pinned", 20))];
    for i in 0..20 {
        let job = format!("ch-{i}");
        let runs = c.trigger(&job, 10);
        by_job.push((job, runs));
    }
    let all: Vec<String> = by_job.iter().flat_map(|(_, r)| r.clone()).collect();
    assert_eq!(all.len(), 1020);
    c.wait_states(&all, "succeeded", Duration::from_secs(120));
    let worker_of = |id: &str| c.run(id)["attempts"][0]["worker"].as_str().unwrap_or("").to_string();
    let mut ch_workers = std::collections::HashSet::new();
    for (job, runs) in &by_job {
        let workers: Vec<String> = runs.iter().map(|r| worker_of(r)).collect();
        let on_a = workers.iter().filter(|w| *w == "wa").count();
        match job.as_str() {
            "ll" | "rr" => assert!((100..=300).contains(&on_a), "{job}: {on_a} of 400 on wa"),
            "pinned" => assert_eq!(on_a, 0, "the label selector keeps pinned off wa"),
            _ => {
                assert!(on_a == 0 || on_a == runs.len(), "{job}: consistent hash keeps a job on one worker ({on_a}/{})", runs.len());
                ch_workers.insert(workers[0].clone());
            }
        }
    }
    assert_eq!(ch_workers.len(), 2, "20 consistent-hash jobs use both workers");
}

#[test]
fn worker_drains_on_sigterm_and_bad_hellos_are_refused() {
    let c = Cluster::new("5s");
    let mut a = c.worker("wa", 5);
    c.wait_workers(&["wa"]);
    c.create(json!({"name": "short", "executor": {"shell": {"command": "sleep", "args": ["2"]}}}));
    let runs = c.trigger("short", 3);
    c.wait_states(&runs, "running", Duration::from_secs(30));
    a.signal(SIGTERM);
    let status = a.wait_exit(Duration::from_secs(30)).expect("the worker exits after draining");
    assert!(status.success(), "exit status {status:?}\n{}", a.log());
    c.wait_states(&runs, "succeeded", Duration::from_secs(10));
    // A second worker with the id of a live session is refused.
    let _b = c.worker("wb", 5);
    c.wait_workers(&["wb"]);
    let mut dup = c.worker_in("wb", 5, &c.addr(), "w-wb-duplicate");
    wait_until("the duplicate to be refused", Duration::from_secs(20), || dup.log().contains("already has a live session"));
    dup.signal(SIGTERM);
    dup.wait_exit(Duration::from_secs(30));
    // Bad flags: a clear message and a non-zero exit.
    for (args, needle) in [
        (vec!["--server", "127.0.0.1:1", "worker", "--capacity", "0"], "--capacity"),
        (vec!["--server", "127.0.0.1:1", "worker", "--capacity", "70000"], "over the limit"),
        (vec!["--server", "127.0.0.1:1", "worker", "--label", "novalue"], "key=value"),
        (vec!["--server", "ftp://x", "worker"], "host:port"),
    ] {
        let out = Command::new(BIN).args(&args).arg("--data-dir").arg(c.dir.path().join("bad")).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(needle), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// The raw text of `GET path` (for the Prometheus endpoint).
fn get_text(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn red_backpressure_defers_fires_until_workers_catch_up() {
    let c = Cluster::with_args("5s", &["--max-pending", "10"]);
    c.create(json!({"name": "tick", "schedule": {"every": "1s"}, "misfire": "fire_once", "executor": {"handler": {"name": "noop"}}}));
    let runs = || c.api("GET", "/v1/runs?job=tick&limit=1000", None).1["runs"].as_array().cloned().unwrap_or_default();
    // No worker: pending grows to 90 % of 10, and the leader turns red.
    wait_until("red backpressure", Duration::from_secs(30), || c.api("GET", "/v1/leader", None).1["backpressure"]["state"] == "red");
    assert!(get_text(&c.addr(), "/metrics").contains("gnomon_backpressure_state 2"), "the metric shows red");
    let pending = runs().into_iter().find(|r| r["state"] == "pending").expect("a pending run");
    let detail = c.run(pending["id"].as_str().unwrap());
    assert!(detail["waiting_for"].as_str().unwrap_or("").contains("no connected worker offers handler"), "run get says why: {detail}");
    let before = runs().len();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(runs().len(), before, "no new fires while red");
    // A worker drains the backlog; the deferred fires come back through the
    // misfire policy (fire_once: one catch-up run, the rest recorded skipped).
    let _w = c.worker("wa", 4);
    wait_until("green again", Duration::from_secs(30), || c.api("GET", "/v1/leader", None).1["backpressure"]["state"] == "green");
    std::thread::sleep(Duration::from_secs(2));
    let all = runs();
    let mut times: Vec<i64> = all.iter().map(|r| ts(&r["scheduled_at"])).collect();
    times.sort_unstable();
    let n = times.len();
    times.dedup();
    assert_eq!(times.len(), n, "no (job, scheduled_at) twice");
    assert!(times.windows(2).all(|w| w[1] - w[0] == 1000), "every second has a run or a skip record");
    assert!(all.iter().any(|r| r["state"] == "skipped"), "deferred seconds beyond the catch-up are recorded skipped");
}

/// The value of the series `series` (name and labels, as rendered) in the
/// server's metrics; 0 while it is absent.
fn metric(addr: &str, series: &str) -> u64 {
    let prefix = format!("{series} ");
    get_text(addr, "/metrics").lines().find_map(|l| l.strip_prefix(prefix.as_str())?.trim().parse::<f64>().ok()).map_or(0, |v| v as u64)
}

/// `gnomon_runs_total{state="…"}` from the server's metrics.
fn runs_total(addr: &str, state: &str) -> u64 {
    metric(addr, &format!("gnomon_runs_total{{state=\"{state}\"}}"))
}

/// A worker with thousands of slots gets thousands of assignments in one
/// turn, and acks for as many reports: none of them is dropped on the way
/// (a full session queue once dropped persisted assignments, leaving their
/// runs `assigned` to a worker that never got them).
#[test]
fn a_burst_larger_than_any_queue_reaches_a_big_worker_whole() {
    const RUNS: usize = 9000;
    let c = Cluster::new("5s");
    c.create(json!({"name": "many", "executor": {"handler": {"name": "noop"}}}));
    for _ in 0..RUNS / 1000 {
        c.trigger_batch("many", 1000);
    }
    let _w = c.worker_with("big", RUNS as u32, &c.addr(), "w-big", &["--prefetch", "0"]);
    wait_until(&format!("{RUNS} runs to succeed"), Duration::from_secs(120), || runs_total(&c.addr(), "succeeded") >= RUNS as u64);
    let (_, v) = c.api("GET", "/v1/runs?job=many&state=assigned&limit=10", None);
    assert_eq!(v["runs"].as_array().map(Vec::len), Some(0), "no run is left assigned: {v}");
}

/// A burst of one-shot jobs due at the same instant, with a worker
/// connected, is fired in chunks that each go out with dispatch (so the
/// worker starts on the first chunk while the next is written), and every
/// job still runs exactly once.
#[test]
fn a_burst_with_a_worker_connected_fires_in_chunks_and_runs_each_job_once() {
    const JOBS: usize = 300;
    let c = Cluster::new("5s");
    let _w = c.worker("wa", 10);
    c.wait_workers(&["wa"]);
    let started = Instant::now();
    let due = chrono::Utc::now() + chrono::Duration::seconds(10);
    let at = due.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    for i in 0..JOBS {
        c.create(json!({"name": format!("b{i}"), "schedule": {"at": at}, "executor": {"handler": {"name": "noop"}}}));
    }
    assert!(started.elapsed() < Duration::from_secs(9), "the jobs were created before they were due");
    let fires_before = metric(&c.addr(), "gnomon_store_fire_seconds_count");
    wait_until(&format!("{JOBS} runs to succeed"), Duration::from_secs(120), || runs_total(&c.addr(), "succeeded") >= JOBS as u64);
    let (_, v) = c.api("GET", "/v1/runs?limit=1000", None);
    let runs = v["runs"].as_array().cloned().unwrap_or_default();
    assert_eq!(runs.len(), JOBS, "one run per job: {v}");
    let mut jobs: Vec<&str> = runs.iter().filter_map(|r| r["job"].as_str()).collect();
    jobs.sort_unstable();
    jobs.dedup();
    assert_eq!(jobs.len(), JOBS, "every job ran, none twice");
    for r in &runs {
        assert_eq!(r["state"], "succeeded", "{r}");
        assert_eq!(r["attempt"].as_u64(), Some(1), "one attempt each: {r}");
    }
    // A history-less worker of 10 slots takes 10 at once: the first chunk is
    // the smallest interleaved one (256), the rest follows in its own write.
    let fire_writes = metric(&c.addr(), "gnomon_store_fire_seconds_count") - fires_before;
    assert!(fire_writes >= 2, "the burst was fired in more than one write ({fire_writes})");
}
