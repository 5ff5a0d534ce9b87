//! The embedded Raft store at process level: three `gnomon server --store
//! raft://…` members on loopback, each with an embedded worker, and a job
//! that fires every second with `fire_all` (every missed second caught up).
//! The leader is SIGKILLed, then the next one is SIGSTOPped past the
//! election timeout and resumed, then the killed member restarts from its
//! directory. The whole history must show every second fired exactly once,
//! and every run end; the stopped leader must come back as a follower.
//!
//! Bounds are generous (shared, noisy machines); failover times are
//! measured by the benchmarks, not asserted here.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

mod common;
use common::*;

#[path = "raft/cluster.rs"]
mod cluster;
use cluster::{http, tick_job, Cluster, TOKEN};

/// Every second between the first and last run fired exactly once.
fn check_history(runs: &[Value]) -> (i64, i64) {
    let times: Vec<i64> = runs.iter().map(scheduled).collect();
    let unique: BTreeSet<i64> = times.iter().copied().collect();
    assert_eq!(unique.len(), times.len(), "a second fired twice: {times:?}");
    let (lo, hi) = (*unique.first().unwrap(), *unique.last().unwrap());
    let missing: Vec<i64> = (0..=(hi - lo) / 1000).map(|k| lo + k * 1000).filter(|t| !unique.contains(t)).collect();
    assert!(missing.is_empty(), "seconds never fired: {missing:?} (history {lo}..={hi})");
    (lo, hi)
}

fn scheduled(r: &Value) -> i64 {
    r["id"].as_str().and_then(|id| id.rsplit('-').next()).and_then(|t| t.parse().ok()).expect("a scheduled run id")
}

#[test]
fn raft_cluster_survives_kill_pause_and_restart_without_duplicates_or_gaps() {
    let ports = vec![free_port(), free_port(), free_port()];
    let mut c = Cluster::launch(ports, None);
    let job = tick_job();
    // Created through a member that does not lead: the write is forwarded.
    let leader = c.leader().unwrap();
    let follower = (leader + 1) % 3;
    let (status, body) = http(&c.addr(follower), "POST", "/v1/jobs", Some(job.as_bytes())).unwrap();
    assert_eq!(status, 201, "{body}");
    // Without the credential, nothing is read.
    assert_eq!(http_as(None, &c.addr(follower), "GET", "/v1/jobs", None).unwrap().0, 401);
    wait_until("three runs", Duration::from_secs(30), || c.runs(follower).len() >= 3);

    // SIGKILL the leader: another takes over.
    let first = c.leader().expect("a leader");
    c.procs[first].take().unwrap().signal(SIGKILL);
    wait_until("a new leader after SIGKILL", Duration::from_secs(30), || c.leader().is_some_and(|l| l != first));
    let at = c.any_live();
    let before = c.runs(at).len();
    wait_until("fires after the failover", Duration::from_secs(30), || c.runs(at).len() >= before + 3);

    // SIGSTOP the new leader past the election timeout: the last one takes
    // over; resumed, the stopped one is a follower.
    let second = c.leader().expect("a leader");
    let paused = c.procs[second].as_ref().unwrap().pid();
    kill(paused, SIGSTOP);
    let third = (0..3).find(|i| *i != second && c.procs[*i].is_some()).unwrap();
    // With one member killed and one paused, no quorum: the last one says
    // it is degraded, and refuses reads and writes, until the killed
    // member is back.
    let alone = c.addr(third);
    wait_until(
        "the member without a quorum to say it is degraded",
        Duration::from_secs(30),
        || matches!(http(&alone, "GET", "/readyz", None), Ok((503, v)) if v["error"]["code"] == json!("degraded")),
    );
    let (status, v) = http(&alone, "GET", "/v1/leader", None).unwrap();
    assert_eq!((status, v["error"]["code"].clone()), (503, json!("degraded")), "{v}");
    let other = json!({"name": "other", "schedule": {"every": "1h"}, "executor": {"shell": {"command": "true"}}}).to_string();
    let (status, v) = http(&alone, "POST", "/v1/jobs", Some(other.as_bytes())).unwrap();
    assert_eq!(status, 503, "{v}");
    // Reads are refused unless the client accepts a stale answer.
    let (status, v) = http(&alone, "GET", "/v1/jobs/tick", None).unwrap();
    assert_eq!(status, 503, "{v}");
    let (status, v) = http(&alone, "GET", "/v1/jobs/tick?stale=true", None).unwrap();
    assert_eq!((status, v["name"].clone()), (200, json!("tick")), "{v}");
    let (status, v) = http(&alone, "GET", "/v1/runs?job=tick&stale=true", None).unwrap();
    assert!(status == 200 && v["runs"].as_array().is_some_and(|r| !r.is_empty()), "{status} {v}");
    c.start(first);
    let third_addr = c.addr(third);
    let paused_holder = json!(format!("n{}", second + 1));
    wait_until(
        "a leader other than the paused one",
        Duration::from_secs(60),
        || matches!(http(&third_addr, "GET", "/v1/leader", None), Ok((200, v)) if v["holder"] != paused_holder && v["holder"].is_string()),
    );
    kill(paused, SIGCONT);
    wait_until(
        "the resumed member to follow",
        Duration::from_secs(30),
        || matches!(http(&c.addr(second), "GET", "/v1/leader", None), Ok((200, v)) if v["is_self"] == json!(false) && v["holder"].is_string()),
    );
    // The restarted member has the job (its data dir and the log).
    wait_until("the restarted member to serve the job", Duration::from_secs(30), || {
        matches!(http(&c.addr(first), "GET", "/v1/jobs/tick", None), Ok((200, _)))
    });
    let at = c.any_live();
    let before = c.runs(at).len();
    wait_until("fires after the pause", Duration::from_secs(30), || c.runs(at).len() >= before + 3);

    // SIGTERM the leader: it hands Raft leadership to a member where a
    // scheduler waits (no election timeout to sit out), then exits; it
    // comes back from its data dir as a follower.
    let fourth = c.leader().expect("a leader");
    let mut stopping = c.procs[fourth].take().unwrap();
    stopping.signal(SIGTERM);
    wait_until("a new leader after SIGTERM", Duration::from_secs(30), || c.leader().is_some_and(|l| l != fourth));
    assert!(stopping.wait_exit(Duration::from_secs(30)).is_some(), "the SIGTERMed member exits");
    assert!(stopping.log().contains("handing leadership to a member where one waits"), "it handed over:\n{}", stopping.log());
    drop(stopping);
    c.start(fourth);
    let at = c.any_live();
    let before = c.runs(at).len();
    wait_until("fires after the hand-over", Duration::from_secs(30), || c.runs(at).len() >= before + 3);

    // Every run ends; then the history: each second exactly once, no gaps.
    std::thread::sleep(Duration::from_secs(2));
    let open = |runs: &[Value]| -> Vec<Value> {
        let newest = runs.iter().map(scheduled).max().unwrap_or(0);
        // The newest seconds may still run; everything 5 s older has ended.
        runs.iter()
            .filter(|r| scheduled(r) < newest - 5000 && !matches!(r["state"].as_str(), Some("succeeded" | "skipped")))
            .cloned()
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let runs = loop {
        let runs = c.runs(at);
        let left = open(&runs);
        if left.is_empty() {
            break runs;
        }
        if std::time::Instant::now() > deadline {
            let details: Vec<Value> = left
                .iter()
                .map(|r| http(&c.addr(at), "GET", &format!("/v1/runs/{}", r["id"].as_str().unwrap()), None).unwrap().1)
                .collect();
            let logs: Vec<String> = c.procs.iter().flatten().map(|p| p.log()).collect();
            panic!("runs did not end: {details:#?}\nlogs:\n{}", logs.join("\n-----\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (_, hi) = check_history(&runs);
    let unique: BTreeSet<i64> = runs.iter().map(scheduled).collect();
    assert!(unique.len() >= 9, "{} runs", unique.len());
    // The members agree.
    for i in 0..3 {
        let mine: BTreeSet<i64> = c.runs(i).iter().map(scheduled).filter(|t| *t <= hi).collect();
        assert_eq!(mine, unique, "member {} differs", i + 1);
    }
}

/// libfaketime, which `scripts/test.sh` installs (Debian's `faketime`).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A member whose wall clock is 30 s ahead (libfaketime; its monotonic
/// clock is true) never schedules: if it is the first leader, the other
/// members' clocks outvote it and it steps down; later it measures its
/// skew as a standby and, when Raft makes it leader again, gives the term
/// to a member with a good clock. No instant is ever fired ahead of time.
#[test]
fn a_member_whose_clock_is_ahead_never_fires_early() {
    assert!(Path::new(LIBFAKETIME).exists(), "{LIBFAKETIME} is missing: install Debian's faketime (scripts/test.sh does)");
    let skewed = vec![
        (0, "LD_PRELOAD".to_string(), LIBFAKETIME.to_string()),
        (0, "FAKETIME".to_string(), "+30s".to_string()),
        (0, "DONT_FAKE_MONOTONIC".to_string(), "1".to_string()),
    ];
    let mut c = Cluster::launch_with(vec![free_port(), free_port(), free_port()], None, skewed);
    let holder = |c: &Cluster, at: usize| match http(&c.addr(at), "GET", "/v1/leader", None) {
        Ok((200, v)) => v["holder"].as_str().map(str::to_string),
        _ => None,
    };
    wait_until("a scheduler on a member with a good clock", Duration::from_secs(60), || holder(&c, 1).is_some_and(|h| h != "n1"));
    // The skewed member never committed the leader time (every later
    // leader would start from it, firing ahead of time).
    if let Some(v) = committed_ahead(&c.addr(1)) {
        dump_logs(c.dir.path());
        panic!("the committed leader time is ahead of the real time: {v}");
    }
    let (status, body) = http(&c.addr(1), "POST", "/v1/jobs", Some(tick_job().as_bytes())).unwrap();
    assert_eq!(status, 201, "{body}");
    wait_until("three runs", Duration::from_secs(30), || c.runs(1).len() >= 3);
    wait_until(
        "the skewed member to know it is ahead",
        Duration::from_secs(30),
        || matches!(http(&c.addr(0), "GET", "/v1/leader", None), Ok((200, v)) if v["clock"]["skew_ms"].as_i64().is_some_and(|s| s > 25_000)),
    );
    // Kill the scheduling member: Raft may elect the skewed one, whose
    // scheduler then refuses the term and hands it on.
    let first = c.leader().expect("a leader");
    assert_ne!(first, 0);
    c.procs[first].take().unwrap().signal(SIGKILL);
    let other = 3 - first;
    wait_until("the remaining good member to schedule", Duration::from_secs(60), || {
        holder(&c, other).is_some_and(|h| h == format!("n{}", other + 1))
    });
    let before = c.runs(other).len();
    wait_until("fires after the failover", Duration::from_secs(30), || c.runs(other).len() >= before + 3);
    let runs = c.runs(other);
    let now = now_ms();
    if !runs.iter().all(|r| scheduled(r) <= now + 1_000) || committed_ahead(&c.addr(other)).is_some() {
        // Who led when, and what each member judged of its clock.
        dump_logs(c.dir.path());
    }
    assert!(runs.iter().all(|r| scheduled(r) <= now + 1_000), "an instant fired ahead of time: {runs:#?}");
    assert_eq!(committed_ahead(&c.addr(other)), None, "the committed leader time is ahead of the real time");
    check_history(&runs);
}

/// The leader answer of `addr` when its committed leader time is more than
/// a second ahead of the real time.
fn committed_ahead(addr: &str) -> Option<String> {
    let (_, v) = http(addr, "GET", "/v1/leader", None).unwrap();
    let at = v["leader_time"].as_str().map(|t| gnomon_core::chrono::DateTime::parse_from_rfc3339(t).unwrap().timestamp_millis());
    at.is_some_and(|t| t > now_ms() + 1_000).then(|| v.to_string())
}

#[test]
fn raft_flags_are_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let mut p = Proc::spawn(dir.path(), "bad", &args.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let status = p.wait_exit(Duration::from_secs(30)).expect("exits");
        assert!(!status.success());
        p.log()
    };
    let store = format!("raft://{}", dir.path().join("m").display());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let log = run(&["server", "--store", &store, "--listen", &listen]);
    assert!(log.contains("needs --raft-id"), "{log}");
    let log = run(&["server", "--store", &store, "--listen", &listen, "--raft-id", "4", "--raft-peers", "1=127.0.0.1:1,2=127.0.0.1:2"]);
    assert!(log.contains("does not list this member's id 4"), "{log}");
    let log = run(&["server", "--store", &store, "--listen", &listen, "--raft-id", "1", "--raft-peers", "1=nohost"]);
    assert!(log.contains("is not HOST:PORT"), "{log}");
    let sqlite = format!("sqlite://{}", dir.path().join("x.db").display());
    let log = run(&["server", "--store", &sqlite, "--listen", &listen, "--raft-id", "1"]);
    assert!(log.contains("go with --store raft://"), "{log}");
}

/// A fourth member joins as a learner (it catches up and serves reads),
/// is promoted to voter, and the leader is removed; scheduling goes on with
/// every second fired once. Bad membership requests change nothing.
#[test]
fn members_are_added_promoted_and_removed() {
    let ports = vec![free_port(), free_port(), free_port(), free_port()];
    let mut c = Cluster::launch(ports, None);
    let job = tick_job();
    let leader = c.leader().unwrap();
    let follower = (leader + 1) % 3;
    assert_eq!(http(&c.addr(follower), "POST", "/v1/jobs", Some(job.as_bytes())).unwrap().0, 201);
    wait_until("three runs", Duration::from_secs(30), || c.runs(follower).len() >= 3);
    // The follower forwarded the write naming its caller; the leader audited it.
    let leader_log = c.procs[leader].as_ref().unwrap().log();
    assert!(leader_log.contains("forwarded creating or updating a job") && leader_log.contains("caller=token (admin)"), "{leader_log}");

    // Refused, and nothing changes.
    let bad = [
        ("POST", "/v1/cluster/learners", Some(json!({"id": 4, "address": "nohost"})), 400),
        ("POST", "/v1/cluster/learners", Some(json!({"id": 0, "address": "127.0.0.1:1"})), 400),
        ("POST", "/v1/cluster/learners", Some(json!({"id": 4, "address": "127.0.0.1:1", "role": "x"})), 400),
        ("POST", "/v1/cluster/members/9/promote", None, 409),
        ("POST", "/v1/cluster/members/x/promote", None, 400),
        ("DELETE", "/v1/cluster/members/9", None, 409),
    ];
    for (method, path, body, want) in bad {
        let body = body.map(|b| b.to_string());
        let (status, v) = http(&c.addr(follower), method, path, body.as_deref().map(str::as_bytes)).unwrap();
        assert_eq!(status, want, "{method} {path}: {v}");
        assert!(v["error"]["code"].is_string(), "{v}");
    }
    let (_, st) = http(&c.addr(follower), "GET", "/v1/cluster", None).unwrap();
    assert_eq!(st["members"].as_array().map(Vec::len), Some(3), "{st}");
    // The CLI shows the same.
    let out = std::process::Command::new(BIN)
        .args(["--server", &format!("http://{}", c.addr(follower)), "--token", TOKEN, "cluster", "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.matches("voter").count() == 3, "{text}{}", String::from_utf8_lossy(&out.stderr));
    let out = std::process::Command::new(BIN)
        .args(["--server", &format!("http://{}", c.addr(follower)), "--token", TOKEN, "cluster", "promote", "9"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "promoting an unknown member fails");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not in the cluster"), "{}", String::from_utf8_lossy(&out.stderr));

    // Enough writes that the others snapshot and compact their logs.
    let at_leader = c.addr(c.leader().expect("a leader"));
    wait_until("the leader to take a snapshot", Duration::from_secs(60), || {
        for _ in 0..5 {
            let _ = http(&at_leader, "POST", "/v1/jobs/tick/trigger", None);
        }
        matches!(http(&c.addr(follower), "GET", "/v1/cluster", None), Ok((200, v)) if v["last_log"].as_u64().is_some_and(|n| n > 120))
    });
    // A fourth member starts on its own and is added as a learner through
    // a follower (forwarded to the leader); it then serves linearizable reads.
    c.start(3);
    let add = json!({"id": 4, "address": c.addr(3)}).to_string();
    let (status, st) = http(&c.addr(follower), "POST", "/v1/cluster/learners", Some(add.as_bytes())).unwrap();
    assert_eq!(status, 200, "{st}");
    let role =
        |st: &Value, id: u64| st["members"].as_array().and_then(|ms| ms.iter().find(|m| m["id"] == json!(id)).map(|m| m["role"].clone()));
    // The answer comes once the leader committed it; this member applies it
    // a moment later.
    let _ = st;
    wait_until(
        "member 4 to be a learner",
        Duration::from_secs(30),
        || matches!(http(&c.addr(follower), "GET", "/v1/cluster", None), Ok((200, v)) if role(&v, 4) == Some(json!("learner"))),
    );
    wait_until("the learner to serve the job", Duration::from_secs(30), || {
        matches!(http(&c.addr(3), "GET", "/v1/jobs/tick", None), Ok((200, _)))
    });
    // It caught up by snapshot: the others had compacted their logs.
    let (_, st4) = http(&c.addr(3), "GET", "/v1/cluster", None).unwrap();
    assert!(st4["snapshot"].as_u64().is_some(), "the new member installed a snapshot: {st4}");

    // Promoted, it votes; then the leader is removed and stopped.
    let (status, st) = http(&c.addr(follower), "POST", "/v1/cluster/members/4/promote", None).unwrap();
    assert_eq!(status, 200, "{st}");
    let _ = st;
    wait_until(
        "member 4 to be a voter",
        Duration::from_secs(30),
        || matches!(http(&c.addr(follower), "GET", "/v1/cluster", None), Ok((200, v)) if role(&v, 4) == Some(json!("voter"))),
    );
    let leader = c.leader().expect("a leader");
    let survivor = (0..4).find(|i| *i != leader).unwrap();
    let (status, v) = http(&c.addr(survivor), "DELETE", &format!("/v1/cluster/members/{}", leader + 1), None).unwrap();
    assert_eq!(status, 200, "{v}");
    wait_until("a leader among the remaining members", Duration::from_secs(30), || {
        matches!(http(&c.addr(survivor), "GET", "/v1/cluster", None), Ok((200, v))
            if v["leader"].as_u64().is_some_and(|l| l != leader as u64 + 1)
            && v["members"].as_array().is_some_and(|ms| ms.len() == 3 && ms.iter().all(|m| m["role"] == json!("voter"))))
    });
    c.procs[leader].take().unwrap().signal(SIGTERM);
    let before = c.runs(survivor).len();
    wait_until("fires after the removal", Duration::from_secs(30), || c.runs(survivor).len() >= before + 3);
    std::thread::sleep(Duration::from_secs(2));
    let (_, hi) = check_history(&c.runs(survivor));
    for i in (0..4).filter(|i| *i != leader) {
        let mine: BTreeSet<i64> = c.runs(i).iter().map(scheduled).filter(|t| *t <= hi).collect();
        let all: BTreeSet<i64> = c.runs(survivor).iter().map(scheduled).filter(|t| *t <= hi).collect();
        assert_eq!(mine, all, "member {} differs", i + 1);
    }
}

/// A member cut off from the others (every connection to it goes through a
/// proxy the test cuts) says it is degraded and refuses writes, while the
/// other two go on firing; back, it catches up, and the history has every
/// second once.
#[test]
fn a_cut_off_member_refuses_writes_while_the_majority_goes_on() {
    let ports = vec![free_port(), free_port(), free_port()];
    let proxies: Vec<Proxy> = ports.iter().map(|p| Proxy::start(format!("127.0.0.1:{p}"))).collect();
    let c = Cluster::launch(ports, Some(proxies.iter().map(Proxy::addr).collect()));
    let job = tick_job();
    let leader = c.leader().unwrap();
    assert_eq!(http(&c.addr(leader), "POST", "/v1/jobs", Some(job.as_bytes())).unwrap().0, 201);
    wait_until("three runs", Duration::from_secs(30), || c.runs(leader).len() >= 3);

    // Cut a follower off: nothing reaches it.
    let leader = c.leader().unwrap();
    let cut = (leader + 1) % 3;
    proxies[cut].cut();
    let addr = c.addr(cut);
    wait_until(
        "the cut-off member to say it is degraded",
        Duration::from_secs(30),
        || matches!(http(&addr, "GET", "/readyz", None), Ok((503, v)) if v["error"]["code"] == json!("degraded")),
    );
    let other = json!({"name": "other", "schedule": {"every": "1h"}, "executor": {"shell": {"command": "true"}}}).to_string();
    let (status, v) = http(&addr, "POST", "/v1/jobs", Some(other.as_bytes())).unwrap();
    assert_eq!(status, 503, "{v}");
    let on = (0..3).find(|i| *i != cut).unwrap();
    let before = c.runs(on).len();
    wait_until("fires by the majority", Duration::from_secs(30), || c.runs(on).len() >= before + 3);

    // Back: it catches up and agrees.
    proxies[cut].restore();
    wait_until("the member to be ready again", Duration::from_secs(60), || matches!(http(&addr, "GET", "/readyz", None), Ok((200, _))));
    let before = c.runs(on).len();
    wait_until("fires after the cut", Duration::from_secs(30), || c.runs(on).len() >= before + 2);
    std::thread::sleep(Duration::from_secs(2));
    let (_, hi) = check_history(&c.runs(on));
    wait_until("the member to have the same history", Duration::from_secs(30), || {
        let mine: BTreeSet<i64> = c.runs(cut).iter().map(scheduled).filter(|t| *t <= hi).collect();
        let all: BTreeSet<i64> = c.runs(on).iter().map(scheduled).filter(|t| *t <= hi).collect();
        mine == all
    });
}

/// A long attempt on a worker of its own survives a SIGKILL of the Raft
/// leader and a pause of its worker shorter than its fence: the new leader
/// restores the attempt (its start, its timeout), the worker reclaims it,
/// and the run succeeds on attempt 1.
#[test]
fn a_long_attempt_survives_a_leader_kill_and_a_worker_pause_on_raft() {
    // A worker credential, beside the members' admin token.
    let auth = tempfile::tempdir().unwrap();
    let (worker_token, entry) = new_credential("ext", &["--role", "worker"]);
    let auth_file = auth.path().join("auth.toml");
    std::fs::write(&auth_file, entry).unwrap();
    // The failover tests' 15 s lease: on a loaded 2-core machine a Raft
    // re-election after a SIGKILL has taken 7 s, past the worker's fence
    // at 0.7 × the default 10 s, and the worker then rightly killed its
    // attempts.
    let env = (0..3)
        .flat_map(|i| {
            [(i, "GNOMON_AUTH_FILE".to_string(), auth_file.display().to_string()), (i, "GNOMON_LEASE_TTL".to_string(), "15s".to_string())]
        })
        .collect();
    let ports = vec![free_port(), free_port(), free_port()];
    let mut c = Cluster::launch_with(ports, None, env);
    let servers: Vec<String> = (0..3).map(|i| c.addr(i)).collect();
    let data = c.dir.path().join("ext");
    let args: Vec<String> = [
        "--server",
        &servers.join(","),
        "worker",
        "--id",
        "ext",
        "--label",
        "pool=ext",
        "--capacity",
        "4",
        "--allow-root-jobs",
        "--data-dir",
        data.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let worker = Proc::spawn_env(c.dir.path(), "ext", &args, &[("GNOMON_TOKEN".to_string(), worker_token)]);
    let job = json!({"name": "long", "executor": {"shell": {"command": "sleep", "args": ["8"]}}, "timeout": "40s",
                     "route": {"labels": {"pool": "ext"}},
                     "retry": {"max_attempts": 3, "backoff": {"initial": "100ms", "max": "1s"}}})
    .to_string();
    let leader = c.leader().expect("a leader");
    let (status, body) = http(&c.addr(leader), "POST", "/v1/jobs", Some(job.as_bytes())).unwrap();
    assert_eq!(status, 201, "{body}");
    let mut ids = Vec::new();
    for fault in ["leader kill", "worker pause"] {
        let at = c.leader().expect("a leader");
        // A cluster just started may answer 503 (its first writes); a
        // client asks again (the runs of an unconfirmed ask are not ours
        // to count).
        let mut tries = 0;
        let body = loop {
            let (status, body) = http(&c.addr(at), "POST", "/v1/jobs/long/trigger?count=2", None)
                .unwrap_or_else(|e| panic!("{e}: {}", c.procs[at].as_ref().map(|p| p.log()).unwrap_or_default()));
            tries += 1;
            if status < 300 {
                break body;
            }
            assert!(status == 503 && tries < 10, "{status} {body}");
            std::thread::sleep(Duration::from_secs(1));
        };
        let these: Vec<String> = body["ids"].as_array().expect("ids").iter().map(|v| v.as_str().unwrap().to_string()).collect();
        let running = || {
            these.iter().all(
                |id| matches!(http(&c.addr(at), "GET", &format!("/v1/runs/{id}"), None), Ok((200, v)) if v["state"] == json!("running")),
            )
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !running() {
            if std::time::Instant::now() >= deadline {
                let members: Vec<String> = c.procs.iter().flatten().map(|p| p.log()).collect();
                panic!("the long runs never ran; worker log:\n{}\nmembers:\n{}", worker.log(), members.join("\n-----\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if fault == "leader kill" {
            let first = c.leader().expect("a leader");
            c.procs[first].take().unwrap().signal(SIGKILL);
            wait_until("a new leader after SIGKILL", Duration::from_secs(30), || c.leader().is_some_and(|l| l != first));
            c.start(first);
        } else {
            worker.signal(SIGSTOP);
            std::thread::sleep(Duration::from_secs(3));
            worker.signal(SIGCONT);
        }
        ids.extend(these);
    }
    wait_until("the long runs to end", Duration::from_secs(90), || {
        ids.iter().all(|id| {
            matches!(http(&c.addr(c.any_live()), "GET", &format!("/v1/runs/{id}"), None), Ok((200, v)) if v["state"] != json!("running") && v["state"] != json!("assigned") && v["state"] != json!("retrying") && v["state"] != json!("pending"))
        })
    });
    for id in &ids {
        let (_, v) = http(&c.addr(c.any_live()), "GET", &format!("/v1/runs/{id}"), None).unwrap();
        assert_eq!(v["state"], json!("succeeded"), "{v:#}\nworker log:\n{}", worker.log());
        assert_eq!(v["attempts"].as_array().map(Vec::len), Some(1), "ended early and ran again: {v:#}\nworker log:\n{}", worker.log());
    }
}
