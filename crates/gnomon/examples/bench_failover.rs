//! Failover benchmark: three `gnomon server` replicas (release build) and
//! one worker on loopback, a job firing every second, and the leader killed
//! again and again. For each election backend — etcd (with a PostgreSQL
//! store), MySQL `GET_LOCK`, PostgreSQL advisory lock — and each signal
//! (SIGKILL, SIGTERM) it prints the failover time over N kills: from the
//! signal to the first fire by the new leader (the `fired_at` of the first
//! run fired by the new term), p50 and max, and from the signal to the new
//! term's fence. The signal is sent 100 ms before a scheduled second, so the
//! new leader owns that fire and the figure is not the schedule's phase.
//! `raft`: three members of the embedded Raft store (no database), observed
//! through their API. Asserts nothing.
//!
//! Usage: bench_failover BIN [--kills N] [--ttl 5s] [etcd|mysql|postgres|etcd-store|raft ...]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gnomon_backend::testing::testdb::{etcd_endpoints, Server as Db, TestDb};
use gnomon_backend::{RunFilter, Store};

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Replica {
    id: String,
    args: Vec<String>,
    child: Option<Child>,
}

impl Replica {
    fn start(&mut self, bin: &str) {
        self.child = Some(
            Command::new(bin)
                .args(&self.args)
                .env("GNOMON_LOG", "warn")
                .env("GNOMON_ALLOW_ROOT_JOBS", "1")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    fn signal(&mut self, sig: i32) {
        let mut c = self.child.take().unwrap();
        // SAFETY: kill(2) on a child this benchmark started.
        unsafe {
            kill(c.id() as i32, sig);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Bench {
    bin: String,
    /// The shared store, read directly; `None` for raft (read through the API).
    store: Option<Arc<dyn Store>>,
    addrs: Vec<String>,
    http: reqwest::Client,
    replicas: Vec<Replica>,
    _worker: Replica,
    _dir: tempfile::TempDir,
}

impl Bench {
    async fn start(bin: &str, backend: &str, url: &str, ttl: &str) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        let store = match backend {
            "raft" => None,
            _ => Some(gnomon_backend::open_store(url).await.expect("store")),
        };
        let cluster = format!("bench-{}", now_ms());
        let mut replicas = Vec::new();
        let addrs: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let peers: Vec<String> = addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect();
        for (i, addr) in addrs.iter().enumerate().map(|(i, a)| (i + 1, a)) {
            let member_store = format!("raft://{}", dir.path().join(format!("m{i}")).display());
            let url = if backend == "raft" { member_store.as_str() } else { url };
            let mut args: Vec<String> = ["server", "--listen", addr, "--node-id", &format!("s{i}"), "--store", url, "--election-ttl", ttl]
                .iter()
                .map(|s| s.to_string())
                .collect();
            if backend == "etcd" {
                args.extend(["--etcd".into(), etcd_endpoints(), "--cluster".into(), cluster.clone()]);
            }
            if backend == "raft" {
                args.extend(["--raft-id".into(), i.to_string(), "--raft-peers".into(), peers.join(",")]);
                if i == 1 {
                    args.push("--raft-bootstrap".into());
                }
            }
            let mut r = Replica { id: format!("s{i}"), args, child: None };
            r.start(bin);
            replicas.push(r);
        }
        let wdir = dir.path().join("w");
        let mut worker = Replica {
            id: "w".into(),
            args: ["--server", &addrs.join(","), "worker", "--id", "w", "--capacity", "16", "--data-dir", wdir.to_str().unwrap()]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            child: None,
        };
        worker.start(bin);
        let http = reqwest::Client::new();
        let b = Bench { bin: bin.into(), store, addrs: addrs.clone(), http: http.clone(), replicas, _worker: worker, _dir: dir };
        let job = r#"{"name":"tick","schedule":{"every":"1s"},"misfire":"fire_once","executor":{"handler":{"name":"noop"}}}"#;
        for _ in 0..600 {
            let mut ok = false;
            for a in &addrs {
                if let Ok(r) = http.post(format!("http://{a}/v1/jobs")).header("content-type", "application/json").body(job).send().await {
                    ok = r.status().is_success() || r.status().as_u16() == 409;
                    if ok {
                        break;
                    }
                }
            }
            if ok {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        b
    }

    /// (holder, token, since) of the scheduler's leadership.
    async fn leadership(&self) -> Option<(String, u64, i64)> {
        if let Some(store) = &self.store {
            return store.leadership("scheduler").await.ok().flatten().map(|l| (l.holder, l.token, l.since));
        }
        for (i, a) in self.addrs.iter().enumerate() {
            if self.replicas[i].child.is_none() {
                continue;
            }
            let Ok(r) = self.http.get(format!("http://{a}/v1/leader")).send().await else { continue };
            let Ok(v) = r.json::<serde_json::Value>().await else { continue };
            if let (Some(h), Some(t), Some(since)) = (v["holder"].as_str(), v["token"].as_u64(), v["since"].as_str().and_then(ms)) {
                return Some((h.to_string(), t, since));
            }
        }
        None
    }

    /// (fired_at, scheduled_at) of the newest `n` runs of the job.
    async fn runs(&self, n: u32) -> Vec<(i64, i64)> {
        if let Some(store) = &self.store {
            let filter = RunFilter { job: Some("tick".into()), ..Default::default() };
            return match store.list_runs(&filter, n, None).await {
                Ok(p) => p.runs.iter().map(|r| (r.fired_at, r.scheduled_at)).collect(),
                Err(_) => Vec::new(),
            };
        }
        for (i, a) in self.addrs.iter().enumerate() {
            if self.replicas[i].child.is_none() {
                continue;
            }
            let Ok(r) = self.http.get(format!("http://{a}/v1/runs?job=tick&limit={n}")).send().await else { continue };
            let Ok(v) = r.json::<serde_json::Value>().await else { continue };
            if let Some(runs) = v["runs"].as_array() {
                return runs
                    .iter()
                    .filter_map(|r| Some((r["fired_at"].as_str().and_then(ms)?, r["scheduled_at"].as_str().and_then(ms)?)))
                    .collect();
            }
        }
        Vec::new()
    }

    async fn leader(&self) -> (usize, u64) {
        loop {
            if let Some((holder, token, _)) = self.leadership().await {
                if let Some(i) = self.replicas.iter().position(|r| r.id == holder && r.child.is_some()) {
                    return (i, token);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// (fired_at, scheduled_at) of the newest run.
    async fn last_fire(&self) -> (i64, i64) {
        self.runs(5).await.into_iter().max().unwrap_or((0, 0))
    }

    /// One failover: signal the leader; ms from the signal to the first fire of the new term.
    async fn failover(&mut self, sig: i32) -> Option<(i64, i64)> {
        // Steady state first: the leader fires.
        let deadline = Instant::now() + Duration::from_secs(60);
        let last_scheduled = loop {
            let (fired, scheduled) = self.last_fire().await;
            if now_ms() - fired <= 1500 {
                break scheduled;
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (old, token) = self.leader().await;
        // Signal 100 ms before a scheduled second, so the new leader owns
        // that fire: its lateness is the failover, not the schedule's phase.
        let mut due = last_scheduled + 1000;
        while due - 100 < now_ms() {
            due += 1000;
        }
        tokio::time::sleep(Duration::from_millis((due - 100 - now_ms()) as u64)).await;
        let t0 = now_ms();
        self.replicas[old].signal(sig);
        let deadline = Instant::now() + Duration::from_secs(60);
        let since = loop {
            if let Some((_, t, since)) = self.leadership().await {
                if t > token {
                    break since;
                }
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let took = loop {
            if let Some(first) = self.runs(20).await.iter().filter(|r| r.0 >= since).map(|r| r.0).min() {
                break first - t0;
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let bin = self.bin.clone();
        self.replicas[old].start(&bin);
        tokio::time::sleep(Duration::from_secs(2)).await;
        Some((since - t0, took))
    }
}

/// Milliseconds since the epoch of an RFC 3339 time.
fn ms(t: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(t).ok().map(|d| d.timestamp_millis())
}

fn summary(mut v: Vec<i64>) -> String {
    if v.is_empty() {
        return "no failovers measured".into();
    }
    v.sort();
    let p50 = v[v.len() / 2];
    format!("n={} p50={} ms max={} ms (all: {:?})", v.len(), p50, v[v.len() - 1], v)
}

#[tokio::main]
async fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let bin = args.remove(0);
    let mut kills = 10;
    let mut ttl = "5s".to_string();
    let mut backends = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--kills" => kills = it.next().and_then(|n| n.parse().ok()).expect("--kills N"),
            "--ttl" => ttl = it.next().expect("--ttl 5s"),
            b @ ("etcd" | "mysql" | "postgres" | "etcd-store" | "raft") => backends.push(b.to_string()),
            other => panic!("unknown argument {other:?}"),
        }
    }
    if backends.is_empty() {
        backends = vec!["etcd".into(), "mysql".into(), "postgres".into(), "etcd-store".into(), "raft".into()];
    }
    println!("failover: leader signalled -> first fire by the new leader; election TTL {ttl}, {kills} kills per signal");
    for backend in backends {
        // etcd-store: the etcd store with the election in its cluster.
        let db = match backend.as_str() {
            "etcd-store" | "raft" => None,
            "mysql" => Some(TestDb::create(Db::MySql).await.unwrap_or_else(|e| panic!("{e}"))),
            _ => Some(TestDb::create(Db::Postgres).await.unwrap_or_else(|e| panic!("{e}"))),
        };
        let url = match (&db, backend.as_str()) {
            (Some(db), _) => db.url.clone(),
            (None, "raft") => String::new(),
            (None, _) => format!("etcd://{}/bench-failover-{}", etcd_endpoints(), now_ms()),
        };
        let mut b = Bench::start(&bin, &backend, &url, &ttl).await;
        for (name, sig) in [("SIGKILL", SIGKILL), ("SIGTERM", SIGTERM)] {
            let (mut times, mut fenced) = (Vec::new(), Vec::new());
            for _ in 0..kills {
                match b.failover(sig).await {
                    Some((f, t)) => {
                        fenced.push(f);
                        times.push(t);
                    }
                    None => println!("  {backend} {name}: a failover did not complete within 60 s"),
                }
            }
            let label = match backend.as_str() {
                "etcd" => "etcd election (postgres store)".to_string(),
                "etcd-store" => "etcd store + etcd election".to_string(),
                "raft" => "raft store (3 members)".to_string(),
                other => format!("{other} lock"),
            };
            println!("{label:32} {name}: first fire {}", summary(times));
            println!("{:32} {name}: new term fenced {}", "", summary(fenced));
        }
        drop(b);
        if let Some(db) = db {
            db.drop_database().await;
        }
    }
}
