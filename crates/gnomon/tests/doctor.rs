//! `gnomon doctor`: one line per check, exit code 1 when one fails; it
//! reads the configuration file's [server] settings.

mod common;

use std::process::Command;

use common::*;

fn doctor(args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .env_remove("GNOMON_STORE")
        .env_remove("GNOMON_ETCD")
        .env_remove("GNOMON_LISTEN")
        .env_remove("GNOMON_TOKEN")
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn doctor_reports_each_check_and_fails_on_any() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("g.db").display());
    let (ok, out) = doctor(&["doctor", "--store", &db, "--listen", "127.0.0.1:0"]);
    assert!(ok, "{out}");
    assert!(out.contains("ok    store sqlite://") && out.contains("all checks passed"), "{out}");

    // From the configuration file's [server] table.
    let file = dir.path().join("g.toml");
    std::fs::write(&file, format!("[server]\nstore = \"{db}\"\nlisten = \"0.0.0.0:7400\"\n")).unwrap();
    let (ok, out) = doctor(&["--config", file.to_str().unwrap(), "doctor"]);
    assert!(!ok, "a public listener without credentials fails: {out}");
    assert!(out.contains("ok    store sqlite://") && out.contains("FAIL  refusing to listen on 0.0.0.0:7400"), "{out}");

    let (ok, out) = doctor(&["doctor", "--store", "postgres://nobody:secret@127.0.0.1:5432/test", "--etcd", "127.0.0.1:1"]);
    assert!(!ok);
    assert!(out.contains("FAIL  store postgres://nobody:***@") && !out.contains("secret"), "{out}");
    assert!(out.contains("FAIL  etcd 127.0.0.1:1") && out.contains("2 check(s) failed"), "{out}");

    let (ok, out) = doctor(&["doctor", "--etcd", "127.0.0.1:1", "--etcd-ca", "/nonexistent/ca.pem"]);
    assert!(!ok && out.contains("/nonexistent/ca.pem"), "the etcd TLS settings are used: {out}");
    let (ok, out) = doctor(&["doctor", "--etcd", "127.0.0.1:1,,x"]);
    assert!(!ok && out.contains("empty entry"), "{out}");

    let (ok, out) = doctor(&["doctor"]);
    assert!(!ok && out.contains("nothing to check"), "{out}");
}

#[test]
fn doctor_checks_the_servers_a_worker_would_use() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    let (ok, out) = doctor(&["--server", &addr, "doctor", "--workers-view"]);
    assert!(ok, "{out}");
    assert!(out.contains("leader dev") && out.contains("every server reports the same leader"), "{out}");
    let gone = format!("127.0.0.1:{}", free_port());
    let (ok, out) = doctor(&["--server", &format!("{addr},{gone}"), "doctor", "--workers-view"]);
    assert!(!ok && out.contains(&format!("FAIL  server http://{gone}")), "{out}");
}
