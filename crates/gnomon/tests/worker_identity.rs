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
