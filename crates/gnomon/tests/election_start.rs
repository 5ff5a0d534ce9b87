//! How `gnomon server` starts with the etcd and database elections: bad
//! settings refused with a clear message, the opt-in fallback to the local
//! elector logged and counted, and a killed worker evicted by its etcd
//! session lease.

use std::time::{Duration, Instant};

use gnomon_backend::testing::testdb::{etcd_endpoints, Server as Db};
use serde_json::{json, Value};

mod common;
use common::*;

/// Runs `gnomon server …` expecting it to refuse to start; returns stderr.
fn refused(args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg("server").args(args).env_remove("GNOMON_STORE").env_remove("GNOMON_ETCD").env_remove("GNOMON_ELECTION");
    cmd.env("GNOMON_ALLOW_ROOT_JOBS", "1");
    let mut child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            assert!(!status.success(), "gnomon server {args:?} started; stderr:\n{err}");
            return err;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gnomon server {args:?} neither started nor refused within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bad_election_settings_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("g.db").display());
    let listen = format!("127.0.0.1:{}", free_port());
    let free = free_port().to_string();
    let unreachable = format!("127.0.0.1:{free}");
    let pg = Db::Postgres.base_url();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--store", &sqlite, "--etcd", "127.0.0.1:2379,,127.0.0.1:2380"], "empty entry"),
        (vec!["--store", &sqlite, "--etcd", "127.0.0.1"], "no port"),
        (vec!["--store", &sqlite, "--etcd", "https://127.0.0.1:2379"], "TLS"),
        (vec!["--store", &sqlite, "--etcd", &unreachable], "unreachable"),
        (vec!["--store", &sqlite, "--etcd", &unreachable], "--election-fallback local"),
        (vec!["--store", &pg, "--election", "local"], "--single-server"),
        (vec!["--store", &sqlite, "--election", "mysql"], "mysql://"),
        (vec!["--store", &sqlite, "--election", "etcd"], "--etcd"),
        (vec!["--store", &sqlite, "--election", "raft"], "not one of"),
        (vec!["--store", &pg, "--election-fallback", "local"], "only applies to the etcd"),
        (vec!["--store", &sqlite, "--election-fallback", "maybe"], "[possible values: none, local]"),
        (vec!["--store", &sqlite, "--election-ttl", "0s"], "--election-ttl"),
        (vec!["--store", &sqlite, "--etcd", &unreachable, "--cluster", "a/b"], "--cluster"),
    ];
    for (args, says) in cases {
        let mut all = vec!["--listen", listen.as_str()];
        all.extend(args.iter().copied());
        let err = refused(&all);
        assert!(err.contains(says), "gnomon server {args:?} should say {says:?}; it said:\n{err}");
        assert!(err.lines().count() <= 4, "a short message, not a dump:\n{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn etcd_fallback_to_local_is_logged_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let unreachable = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> = [
        "server",
        "--listen",
        &addr,
        "--store",
        &format!("sqlite://{}", dir.path().join("g.db").display()),
        "--etcd",
        &unreachable,
        "--election-fallback",
        "local",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let p = Proc::spawn(dir.path(), "server", &args);
    wait_until("the degraded server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/v1/leader", None).is_ok_and(|(_, v)| v["is_self"] == json!(true))
    });
    let metrics = raw_get(&addr, "/metrics").unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("gnomon_leader_election_total")
            && l.contains("backend=\"etcd\"")
            && l.contains("result=\"fallback_local\"")
            && !l.ends_with(" 0")),
        "{metrics}"
    );
    let log = p.log();
    assert!(log.contains("WARN") && log.contains("FALLING BACK TO THE LOCAL ELECTOR"), "{log}");
}

#[test]
fn a_killed_worker_is_evicted_by_its_etcd_session_lease() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let cluster = format!("evict-{:08x}", rand_u32());
    let url = format!("etcd://{}/{cluster}", etcd_endpoints());
    let args: Vec<String> = ["server", "--listen", &addr, "--node-id", "s1", "--store", &url].iter().map(|s| s.to_string()).collect();
    let server = Proc::spawn(dir.path(), "server", &args);
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/v1/leader", None).is_ok_and(|(_, v)| v["is_self"] == json!(true))
    });
    let worker = |id: &str| {
        let data = dir.path().join(id);
        let args: Vec<String> = ["--server", &addr, "worker", "--id", id, "--capacity", "10", "--data-dir", data.to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        Proc::spawn(dir.path(), id, &args)
    };
    let live = |ids: &[&str]| {
        let (_, v) = http(&addr, "GET", "/v1/workers", None).unwrap_or((0, Value::Null));
        let list: Vec<String> = v["workers"]
            .as_array()
            .map(|a| a.iter().filter(|w| w["state"] == "live").filter_map(|w| w["id"].as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        ids.iter().all(|id| list.iter().any(|l| l == id))
    };
    let wa = worker("wa");
    wait_until("wa to be live", Duration::from_secs(30), || live(&["wa"]));
    let job = json!({"name": "sleeper", "executor": {"shell": {"command": "sh", "args": ["-c", "sleep 3"]}},
                     "retry": {"max_attempts": 3, "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0, "jitter": 0}}});
    let (code, body) = http(&addr, "POST", "/v1/jobs", Some(&serde_json::to_vec(&job).unwrap())).unwrap();
    assert_eq!(code, 201, "{body}");
    let ids: Vec<String> =
        (0..4).map(|_| http(&addr, "POST", "/v1/jobs/sleeper/trigger", None).unwrap().1["id"].as_str().unwrap().to_string()).collect();
    let state = |id: &str| http(&addr, "GET", &format!("/v1/runs/{id}"), None).map(|(_, v)| v).unwrap_or(Value::Null);
    wait_until("the runs to be running on wa", Duration::from_secs(30), || ids.iter().all(|id| state(id)["state"] == "running"));
    let _wb = worker("wb");
    wait_until("wb to be live", Duration::from_secs(30), || live(&["wa", "wb"]));
    let killed_ms = now_ms();
    let killed = Instant::now();
    wa.signal(SIGKILL);
    // Default session TTL on etcd: 15 s; then the 3 s run on wb.
    wait_until("the runs to succeed on wb", Duration::from_secs(15 + 2 + 3 + 20), || {
        ids.iter().all(|id| state(id)["state"] == "succeeded")
    });
    eprintln!("all runs done {:?} after the kill", killed.elapsed());
    let log = server.log();
    assert!(log.contains("worker session lease deleted in the store"), "the store's lease deletion evicted wa:\n{log}");
    for id in &ids {
        let run = state(id);
        let attempts = run["attempts"].as_array().unwrap();
        assert_eq!((attempts[0]["state"].as_str(), attempts[0]["worker"].as_str()), (Some("lost"), Some("wa")), "{run}");
        assert_eq!(attempts.last().unwrap()["worker"].as_str(), Some("wb"), "{run}");
        let ended = chrono::DateTime::parse_from_rfc3339(attempts[0]["ended_at"].as_str().unwrap()).unwrap().timestamp_millis();
        assert!(ended - killed_ms <= 17_000, "evicted {} ms after the kill (TTL 15 s + 2 s)", ended - killed_ms);
    }
    drop(server);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(delete_etcd_prefix(&format!("/gnomon/{cluster}/")));
}
