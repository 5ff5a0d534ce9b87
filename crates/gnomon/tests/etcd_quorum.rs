//! The etcd store under member failures, on a 3-member etcd cluster of its
//! own (so killing members does not disturb other tests): a member killed
//! in the middle of a burst; with one member down scheduling goes on; with
//! two down (no quorum) leader work stops; when one returns it resumes,
//! catching up without a duplicate, and every run of the burst ends.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gnomon_backend::{RunFilter, Store};
use serde_json::json;

mod common;
use common::*;

struct Member {
    args: Vec<String>,
    child: Option<Child>,
    client: u16,
}

impl Member {
    fn start(&mut self) {
        let child = Command::new("etcd")
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd ({e}); scripts/test.sh installs it (Debian package etcd-server)"));
        self.child = Some(child);
    }
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

fn cluster(dir: &std::path::Path) -> Vec<Member> {
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let initial: Vec<String> = ports.iter().enumerate().map(|(i, (_, peer))| format!("q{i}=http://127.0.0.1:{peer}")).collect();
    let mut members: Vec<Member> = ports
        .iter()
        .enumerate()
        .map(|(i, (client, peer))| Member {
            client: *client,
            child: None,
            args: [
                "--name",
                &format!("q{i}"),
                "--data-dir",
                dir.join(format!("q{i}")).to_str().unwrap(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-cluster",
                &initial.join(","),
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                "gnomon-quorum",
                "--heartbeat-interval",
                "100",
                "--election-timeout",
                "1000",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        })
        .collect();
    for m in &mut members {
        m.start();
    }
    members
}

fn healthy(client: u16) -> bool {
    http(&format!("127.0.0.1:{client}"), "GET", "/health", None).is_ok_and(|(code, v)| code == 200 && v["health"] == json!("true"))
}

#[test]
fn scheduling_survives_one_etcd_member_and_resumes_after_quorum_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = cluster(dir.path());
    wait_until("the etcd cluster to be healthy", Duration::from_secs(60), || members.iter().all(|m| healthy(m.client)));
    let endpoints: Vec<String> = members.iter().map(|m| format!("127.0.0.1:{}", m.client)).collect();
    let url = format!("etcd://{}/quorum", endpoints.join(","));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let store = rt.block_on(gnomon_backend::open_store(&url)).expect("store");
    let runs_of = |store: &std::sync::Arc<dyn Store>, job: &str| {
        let filter = RunFilter { job: Some(job.into()), ..Default::default() };
        let mut all = Vec::new();
        let mut cursor = None;
        loop {
            let page = rt.block_on(store.list_runs(&filter, 1000, cursor)).expect("runs");
            all.extend(page.runs);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return all,
            }
        }
    };
    let runs = |store: &std::sync::Arc<dyn Store>| runs_of(store, "tick");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let args: Vec<String> = ["server", "--listen", &addr, "--node-id", "s1", "--store", &url, "--election-ttl", "3s", "--capacity", "8"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let _server = Proc::spawn(dir.path(), "server", &args);
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/v1/leader", None).is_ok_and(|(_, v)| v["is_self"] == json!(true))
    });
    let body = json!({"name": "tick", "schedule": {"every": "1s"}, "misfire": "fire_all", "catchup_window": "10m",
                      "executor": {"handler": {"name": "noop"}}});
    let (code, v) = http(&addr, "POST", "/v1/jobs", Some(&serde_json::to_vec(&body).unwrap())).unwrap();
    assert_eq!(code, 201, "{v}");
    wait_until("the job to fire", Duration::from_secs(30), || runs(&store).len() >= 3);
    let first = runs(&store).iter().map(|r| r.scheduled_at).min().unwrap();

    // A burst is being written and dispatched when a member is killed.
    let burst = json!({"name": "burst", "executor": {"handler": {"name": "noop"}},
                       "retry": {"max_attempts": 5, "backoff": {"initial": "100ms", "max": "1s", "jitter": 0}}});
    let (code, v) = http(&addr, "POST", "/v1/jobs", Some(&serde_json::to_vec(&burst).unwrap())).unwrap();
    assert_eq!(code, 201, "{v}");
    let (code, v) = http(&addr, "POST", "/v1/jobs/burst/trigger?count=500", None).unwrap();
    assert!(code < 300, "{v}");
    std::thread::sleep(Duration::from_millis(100));

    // One member down: scheduling goes on.
    members[0].kill();
    let t = Instant::now();
    let before = runs(&store).len();
    wait_until("fires with one member down", Duration::from_secs(30), || runs(&store).len() >= before + 3);
    eprintln!("one member down: still firing ({:?})", t.elapsed());

    // Two down: no quorum. The leader's lease cannot be kept alive; it stops.
    members[1].kill();
    let stopped = Instant::now();
    wait_until("the leader to step down without quorum", Duration::from_secs(30), || raw_metric(&addr, "gnomon_is_leader") == Some(0.0));
    eprintln!("no quorum: leader stepped down after {:?}", stopped.elapsed());
    std::thread::sleep(Duration::from_secs(3));

    // One returns: quorum again; the leader campaigns, wins and catches up.
    members[1].start();
    let back = Instant::now();
    wait_until("the leader to lead again", Duration::from_secs(60), || {
        http(&addr, "GET", "/v1/leader", None).is_ok_and(|(_, v)| v["is_self"] == json!(true))
    });
    eprintln!("quorum back: leading again after {:?}", back.elapsed());
    let resumed_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    wait_until("fires to resume", Duration::from_secs(30), || runs(&store).iter().any(|r| r.fired_at > resumed_at));
    std::thread::sleep(Duration::from_secs(3));
    // No duplicates, and fire_all caught up every second of the outage.
    let all = runs(&store);
    let mut by_time: BTreeMap<i64, usize> = BTreeMap::new();
    for r in &all {
        *by_time.entry(r.scheduled_at).or_default() += 1;
    }
    assert!(by_time.values().all(|n| *n == 1), "a scheduled time fired twice");
    let last = *by_time.keys().last().unwrap();
    let missing: Vec<i64> = (0..).map(|i| first + 1000 * i).take_while(|t| *t <= last).filter(|t| !by_time.contains_key(t)).collect();
    assert!(missing.is_empty(), "missed seconds: {missing:?}");
    // Every run of the burst ends; one that took more than one attempt never
    // had two live at once.
    wait_until("every burst run to end", Duration::from_secs(120), || {
        let b = runs_of(&store, "burst");
        b.len() == 500 && b.iter().all(|r| r.state.is_terminal())
    });
    for r in runs_of(&store, "burst").into_iter().filter(|r| r.attempt > 1) {
        let d = rt.block_on(store.get_run(&r.id)).expect("get run").expect("run exists");
        let mut spans: Vec<(i64, i64)> = d.attempts.iter().map(|a| (a.assigned_at, a.ended_at.unwrap_or(i64::MAX))).collect();
        spans.sort();
        assert!(spans.windows(2).all(|w| w[1].0 >= w[0].1), "run {}: attempts overlap: {:?}", r.id, d.attempts);
    }
}

fn raw_metric(addr: &str, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}
