//! Only a worker credential opens a worker session (an admin's does not,
//! namespace-limited or not), a worker credential limited to namespaces is
//! given only their runs, and refused sessions are audited.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn job(name: &str, namespace: &str) -> Vec<u8> {
    json!({"name": name, "namespace": namespace, "schedule": {"every": "1h"},
           "executor": {"shell": {"command": "sh", "args": ["-c", "echo secret=$SECRET"], "env": {"SECRET": format!("{namespace}-secret")}}},
           "route": {"labels": {"pool": "ext"}}})
    .to_string()
    .into_bytes()
}

#[test]
fn worker_sessions_need_a_worker_credential_and_keep_to_its_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let (admin, e1) = new_credential("admin", &["--role", "admin"]);
    let (admin_a, e2) = new_credential("admin-a", &["--role", "admin", "--namespace", "teama"]);
    let (worker_a, e3) = new_credential("worker-a", &["--role", "worker", "--namespace", "teama"]);
    let file = dir.path().join("auth.toml");
    std::fs::write(&file, [e1, e2, e3].join("\n\n")).unwrap();
    let (server, addr) = leading_dev_with(dir.path(), &["--auth-file".into(), file.display().to_string()]);
    let worker = |name: &str, token: &str| {
        Proc::spawn_env(
            dir.path(),
            name,
            &[
                "worker".into(),
                "--server".into(),
                addr.clone(),
                "--id".into(),
                name.into(),
                "--label".into(),
                "pool=ext".into(),
                "--data-dir".into(),
                dir.path().join(name).display().to_string(),
            ],
            &[("GNOMON_TOKEN".into(), token.into())],
        )
    };
    let workers = || -> Vec<Value> {
        http_as(Some(&admin), &addr, "GET", "/v1/workers", None).unwrap().1["workers"].as_array().cloned().unwrap_or_default()
    };
    // An admin credential is not a worker's, even unrestricted.
    let by_admin = worker("by-admin", &admin);
    let by_admin_a = worker("by-admin-a", &admin_a);
    wait_until("both refusals", Duration::from_secs(30), || {
        by_admin.log().contains("needs the worker role") && by_admin_a.log().contains("needs the worker role")
    });
    wait_until("the refusals to be audited", Duration::from_secs(10), || {
        let log = server.log();
        log.contains("worker session refused") && log.contains("credential=admin-a")
    });
    // A worker credential limited to teama.
    let _a = worker("pool-a-1", &worker_a);
    wait_until("the teama worker", Duration::from_secs(30), || workers().iter().any(|w| w["id"] == "pool-a-1"));
    let listed = workers().into_iter().find(|w| w["id"] == "pool-a-1").unwrap();
    assert_eq!(listed["namespaces"], json!(["teama"]), "the worker list shows what it may take: {listed}");
    let table = || {
        let out = std::process::Command::new(BIN)
            .args(["--server", &format!("http://{addr}"), "worker", "list"])
            .env("GNOMON_TOKEN", &admin)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    wait_until("the CLI to show the worker's namespaces", Duration::from_secs(20), || {
        let t = table();
        t.contains("NAMESPACES") && t.lines().any(|l| l.contains("pool-a-1") && l.contains("teama"))
    });
    assert!(workers().iter().all(|w| w["id"] != "by-admin" && w["id"] != "by-admin-a"), "refused sessions are not listed: {:?}", workers());
    let mut ids = Vec::new();
    for ns in ["teama", "teamb"] {
        let (s, v) = http_as(Some(&admin), &addr, "PUT", &format!("/v1/jobs/j?namespace={ns}"), Some(&job("j", ns))).unwrap();
        assert_eq!(s, 201, "{v}");
        let (s, run) = http_as(Some(&admin), &addr, "POST", &format!("/v1/jobs/j/trigger?namespace={ns}"), None).unwrap();
        assert_eq!(s, 201, "{run}");
        ids.push(run["id"].as_str().unwrap().to_string());
    }
    let run = |id: &str| http_as(Some(&admin), &addr, "GET", &format!("/v1/runs/{id}"), None).unwrap().1;
    wait_until("the teama run to succeed", Duration::from_secs(60), || run(&ids[0])["state"] == "succeeded");
    let a = run(&ids[0]);
    assert!(a["attempts"][0]["output"].as_str().unwrap_or("").contains("secret=teama-secret"), "{a}");
    // The teamb run waits, and says why; it was never handed to the teama worker.
    std::thread::sleep(Duration::from_secs(3));
    let b = run(&ids[1]);
    assert_eq!(b["state"], "pending", "{b}");
    assert!(b["attempts"].as_array().is_none_or(|a| a.is_empty()), "{b}");
    assert!(b["waiting_for"].as_str().unwrap_or("").contains("namespace \"teamb\""), "{b}");
}

/// An empty token is an error, never "no credentials", for a server and a
/// worker alike; nothing starts.
#[test]
fn an_empty_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").display().to_string();
    let runs: [&[&str]; 2] = [
        &["dev", "--listen", "127.0.0.1:1", "--data-dir", &data],
        &["worker", "--server", "127.0.0.1:1", "--id", "w", "--data-dir", &data],
    ];
    for args in runs {
        let out = std::process::Command::new(BIN)
            .args(args)
            .env("GNOMON_TOKEN", "")
            .env("GNOMON_ALLOW_ROOT_JOBS", "1")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("empty"), "{args:?}: {err}");
    }
    assert!(!dir.path().join("data").join("gnomon.db").exists(), "nothing was created");
}

/// `gnomon dev` with the auth file on `addr` (the same address and data
/// across a restart), once it leads.
fn dev_at(dir: &std::path::Path, name: &str, addr: &str, auth: &std::path::Path) -> Proc {
    let args: Vec<String> = [
        "dev",
        "--listen",
        addr,
        "--data-dir",
        &dir.join("data").display().to_string(),
        "--auth-file",
        &auth.display().to_string(),
        "--lease-ttl",
        "30s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let dev = Proc::spawn(dir, name, &args);
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == json!(true)).unwrap_or(false)
    });
    dev
}

/// A worker id belongs to the credential that first opened a session with
/// it, as the store records it: after the server restarts (its memory
/// gone), a credential of another namespace is still refused that id, the
/// refusal is audited, and the id's own worker reconnects and finishes its
/// attempt. An admin releases the id (`gnomon worker forget`); then another
/// credential may take it.
#[test]
fn a_worker_id_stays_its_first_credentials_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (admin, e1) = new_credential("admin", &["--role", "admin"]);
    let (worker_a, e2) = new_credential("worker-a", &["--role", "worker", "--namespace", "teama"]);
    let (worker_b, e3) = new_credential("worker-b", &["--role", "worker", "--namespace", "teamb"]);
    let file = dir.path().join("auth.toml");
    std::fs::write(&file, [e1, e2, e3].join("\n\n")).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut server = dev_at(dir.path(), "dev", &addr, &file);
    let worker = |log: &str, id: &str, token: &str| {
        let args: Vec<String> = ["worker", "--server", &addr, "--id", id, "--label", "pool=ext", "--data-dir"]
            .iter()
            .map(|s| s.to_string())
            .chain([dir.path().join(log).display().to_string()])
            .collect();
        Proc::spawn_env(dir.path(), log, &args, &[("GNOMON_TOKEN".into(), token.into())])
    };
    let workers = || -> Vec<Value> {
        http_as(Some(&admin), &addr, "GET", "/v1/workers", None).unwrap().1["workers"].as_array().cloned().unwrap_or_default()
    };
    // The teamb worker registers its id and runs a long attempt.
    let owner = worker("owner", "pool-b-1", &worker_b);
    wait_until("the teamb worker", Duration::from_secs(30), || workers().iter().any(|w| w["id"] == "pool-b-1"));
    let long = json!({"name": "long", "namespace": "teamb",
        "executor": {"shell": {"command": "sh", "args": ["-c", "sleep 6; echo done"]}}, "route": {"labels": {"pool": "ext"}}});
    let (s, v) = http_as(Some(&admin), &addr, "PUT", "/v1/jobs/long?namespace=teamb", Some(long.to_string().as_bytes())).unwrap();
    assert_eq!(s, 201, "{v}");
    let (s, run) = http_as(Some(&admin), &addr, "POST", "/v1/jobs/long/trigger?namespace=teamb", None).unwrap();
    assert_eq!(s, 201, "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    let run = |id: &str| http_as(Some(&admin), &addr, "GET", &format!("/v1/runs/{id}"), None).unwrap().1;
    wait_until("the long attempt to run", Duration::from_secs(30), || run(&id)["state"] == "running");

    // The worker holds still (its attempt goes on) while the server restarts.
    owner.signal(SIGSTOP);
    server.signal(SIGKILL);
    server.wait_exit(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(1));
    let server = dev_at(dir.path(), "dev-2", &addr, &file);

    // The teama credential asks for the teamb worker's id: refused.
    let intruder = worker("intruder", "pool-b-1", &worker_a);
    wait_until("the teama credential to be refused the id", Duration::from_secs(30), || {
        let log = server.log();
        assert!(
            !log.lines().any(|l| l.contains("worker session opened") && l.contains("credential=worker-a")),
            "the teama credential opened a session as pool-b-1 after the restart:\n{log}"
        );
        // (The worker logs the reason with its quotes escaped.)
        intruder.log().contains(r#"worker id \"pool-b-1\" belongs to credential \"worker-b\""#)
    });
    wait_until("the refusal to be audited", Duration::from_secs(10), || {
        server.log().lines().any(|l| l.contains("worker session refused") && l.contains("credential=worker-a") && l.contains("pool-b-1"))
    });
    drop(intruder);

    // The id's own worker comes back: its attempt finishes, once.
    owner.signal(SIGCONT);
    wait_until("the long run to succeed", Duration::from_secs(60), || run(&id)["state"] == "succeeded");
    let done = run(&id);
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{done}");
    assert_eq!((attempts[0]["worker"].as_str(), attempts[0]["state"].as_str()), (Some("pool-b-1"), Some("succeeded")), "{done}");
    assert!(attempts[0]["output"].as_str().unwrap_or("").contains("done"), "{done}");
    assert!(
        !server.log().lines().any(|l| l.contains("worker session opened") && l.contains("credential=worker-a")),
        "the teama credential never had a session"
    );

    // An admin releases the id once its worker is gone; then the teama
    // credential may take it.
    drop(owner);
    let cli = |args: &[&str], token: &str| {
        std::process::Command::new(BIN)
            .args(["--server", &format!("http://{addr}")])
            .args(args)
            .env("GNOMON_TOKEN", token)
            .output()
            .unwrap()
    };
    let out = cli(&["worker", "forget", "pool-b-1"], &worker_a);
    assert!(!out.status.success(), "a worker credential releases nothing");
    let out = cli(&["worker", "forget", "pool-b-1"], &admin);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("pool-b-1"), "{}", String::from_utf8_lossy(&out.stdout));
    let out = cli(&["worker", "forget", "pool-b-1"], &admin);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no_binding"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _taken = worker("taken", "pool-b-1", &worker_a);
    wait_until("the released id to open a teama session", Duration::from_secs(30), || {
        server.log().lines().any(|l| l.contains("worker session opened") && l.contains("credential=worker-a") && l.contains("pool-b-1"))
    });
}
