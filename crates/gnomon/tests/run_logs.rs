//! `gnomon run logs` on real processes: `-f` follows a running attempt's
//! output as it is written (each line once, in order) until the run ends;
//! without `-f` an ended attempt's kept output is printed; bad requests
//! are refused with a message and a non-zero exit.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;

#[test]
fn run_logs_follows_an_attempt_and_prints_what_was_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    let job = json!({"name": "talk", "executor": {"shell": {"command": "sh", "args": ["-c", "for i in $(seq 1 12); do echo \"line $i\"; sleep 0.3; done"]}}});
    let (s, v) = http(&addr, "POST", "/v1/jobs", Some(job.to_string().as_bytes())).unwrap();
    assert_eq!(s, 201, "{v}");
    let (s, run) = http(&addr, "POST", "/v1/jobs/talk/trigger", None).unwrap();
    assert_eq!(s, 201, "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    let server = format!("http://{addr}");
    wait_until("the attempt to start", Duration::from_secs(30), || {
        http(&addr, "GET", &format!("/v1/runs/{id}"), None).map(|(_, v)| v["state"] == "running").unwrap_or(false)
    });
    let started = std::time::Instant::now();
    let follow = Command::new(BIN)
        .args(["--server", &server, "run", "logs", &id, "-f"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&follow.stdout);
    let err = String::from_utf8_lossy(&follow.stderr);
    assert!(follow.status.success(), "{err}");
    let want: Vec<String> = (1..=12).map(|i| format!("line {i}")).collect();
    assert_eq!(out.lines().collect::<Vec<_>>(), want, "each line once, in order; stderr: {err}");
    assert!(err.contains("succeeded"), "{err}");
    assert!(started.elapsed() >= Duration::from_secs(1), "it followed the attempt while it ran");
    // Ended: the kept output.
    let once = Command::new(BIN).args(["--server", &server, "run", "logs", &id]).output().unwrap();
    assert!(once.status.success());
    assert_eq!(String::from_utf8_lossy(&once.stdout).lines().collect::<Vec<_>>(), want);
    // Bad requests: refused, said why, non-zero.
    let zero = Command::new(BIN).args(["--server", &server, "run", "logs", &id, "--attempt", "0"]).output().unwrap();
    assert!(!zero.status.success() && !zero.stderr.is_empty());
    let nine = Command::new(BIN).args(["--server", &server, "run", "logs", &id, "--attempt", "9"]).output().unwrap();
    assert!(!nine.status.success(), "{}", String::from_utf8_lossy(&nine.stdout));
    assert!(String::from_utf8_lossy(&nine.stderr).contains("attempts"), "{}", String::from_utf8_lossy(&nine.stderr));
    let none = Command::new(BIN).args(["--server", &server, "run", "logs", "no-such-run"]).output().unwrap();
    assert!(!none.status.success() && String::from_utf8_lossy(&none.stderr).contains("does not exist"));
    let (s, v) = http(&addr, "GET", &format!("/v1/runs/{id}/output?from=x"), None).unwrap();
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("invalid_query")), "{v}");
}
