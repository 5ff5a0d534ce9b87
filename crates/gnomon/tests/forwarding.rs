//! Leader-only calls made to a follower reach the leader: two `gnomon
//! server` processes on one PostgreSQL store, a trigger and the worker list
//! sent to the one that does not lead. The caller's credential goes along;
//! a request already forwarded once is not forwarded again.

mod common;

use std::time::Duration;

use common::*;
use gnomon_backend::testing::testdb::{Server, TestDb};
use serde_json::json;

const TOKEN: &str = "forwarding-test-token-0123456789";
const HOOK_SECRET: &str = "forwarding-hook-secret";

/// How many calls `addr` has forwarded to its leader.
fn forwarded(addr: &str) -> f64 {
    let (_, text) = http_text(addr, "/metrics");
    text.lines().find_map(|l| l.strip_prefix("gnomon_api_forwarded_total ").and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
}

/// `GET path` with the token, as text.
fn http_text(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_hands_leader_only_calls_to_the_leader() {
    let db = TestDb::create(Server::Postgres).await.expect("a test database (scripts/test.sh starts PostgreSQL)");
    let dir = tempfile::tempdir().unwrap();
    let addrs: Vec<String> = (0..2).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let _servers: Vec<Proc> = addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            Proc::spawn_env(
                dir.path(),
                &format!("s{i}"),
                &[
                    "--token".into(),
                    TOKEN.into(),
                    "server".into(),
                    "--store".into(),
                    db.url.clone(),
                    "--listen".into(),
                    addr.clone(),
                    "--node-id".into(),
                    format!("s{i}"),
                    "--capacity".into(),
                    "4".into(),
                ],
                &[("GNOMON_HOOK_SECRET_FWD".into(), HOOK_SECRET.into())],
            )
        })
        .collect();
    let call = |addr: &str, method: &str, path: &str, body: Option<serde_json::Value>| {
        let bytes = body.map(|b| serde_json::to_vec(&b).unwrap());
        http_as(Some(TOKEN), addr, method, path, bytes.as_deref()).unwrap()
    };
    let mut leader = String::new();
    wait_until("one server to lead", Duration::from_secs(60), || {
        for a in &addrs {
            if let Ok((200, v)) = http_as(Some(TOKEN), a, "GET", "/v1/leader", None) {
                if v["is_self"] == json!(true) {
                    leader = a.clone();
                    return true;
                }
            }
        }
        false
    });
    let follower = addrs.iter().find(|a| **a != leader).unwrap().clone();
    // The follower may still be starting (not yet listening).
    wait_until("the follower to know the leader", Duration::from_secs(60), || {
        http_as(Some(TOKEN), &follower, "GET", "/v1/leader", None).is_ok_and(|(_, v)| v["holder"].is_string())
    });
    let job = json!({"name": "fwd", "executor": {"shell": {"command": "true"}}});
    assert_eq!(call(&follower, "POST", "/v1/jobs", Some(job)).0, 201);

    // A trigger on the follower creates the run on the leader.
    let (status, run) = call(&follower, "POST", "/v1/jobs/fwd/trigger", None);
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_str().expect("the run").to_string();
    wait_until("the forwarded run to succeed", Duration::from_secs(60), || {
        call(&leader, "GET", &format!("/v1/runs/{id}"), None).1["state"] == json!("succeeded")
    });
    let (status, many) = call(&follower, "POST", "/v1/jobs/fwd/trigger?count=3", None);
    assert_eq!((status, many["count"].as_u64()), (201, Some(3)), "{many}");
    // Errors come back as the leader gave them.
    let (status, err) = call(&follower, "POST", "/v1/jobs/nope/trigger", None);
    assert_eq!((status, err["error"]["code"].as_str()), (404, Some("not_found")), "{err}");
    // The worker sessions are the leader's.
    let (status, workers) = call(&follower, "GET", "/v1/workers", None);
    assert_eq!(status, 200);
    assert_eq!(workers["workers"].as_array().map(Vec::len), Some(2), "both embedded workers, as the leader sees them: {workers}");
    // Live output is the leader's: a follower reads it there, and `run
    // logs -f` through the follower follows an attempt to its end.
    let talk = json!({"name": "fwd-talk", "executor": {"shell": {"command": "sh", "args": ["-c", "for i in 1 2 3 4 5 6; do echo \"fwd $i\"; sleep 0.3; done"]}}});
    assert_eq!(call(&follower, "POST", "/v1/jobs", Some(talk)).0, 201);
    let (status, run) = call(&follower, "POST", "/v1/jobs/fwd-talk/trigger", None);
    assert_eq!(status, 201, "{run}");
    let talk_id = run["id"].as_str().unwrap().to_string();
    wait_until("the talker to run", Duration::from_secs(60), || {
        call(&leader, "GET", &format!("/v1/runs/{talk_id}"), None).1["state"] == json!("running")
    });
    let (status, live) = call(&follower, "GET", &format!("/v1/runs/{talk_id}/output"), None);
    assert_eq!((status, live["live"].clone()), (200, json!(true)), "{live}");
    let out = std::process::Command::new(BIN)
        .args(["--server", &format!("http://{follower}"), "--token", TOKEN, "run", "logs", &talk_id, "-f"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
    assert_eq!(lines, (1..=6).map(|i| format!("fwd {i}")).collect::<Vec<_>>());
    // Without the credential the follower refuses before forwarding.
    assert_eq!(http(&follower, "POST", "/v1/jobs/fwd/trigger", None).unwrap().0, 401);
    // The CLI works through the follower too.
    let out = std::process::Command::new(BIN)
        .args(["--server", &format!("http://{follower}"), "--token", TOKEN, "job", "trigger", "fwd"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A webhook call the follower cannot verify is refused there, with
    // the one answer, and never reaches the leader; one it verifies is
    // forwarded.
    let hook = json!({"name": "hooked", "executor": {"shell": {"command": "true"}}, "triggers": {"webhook": {"secret": "fwd"}}});
    assert_eq!(call(&leader, "POST", "/v1/jobs", Some(hook)).0, 201);
    let before = forwarded(&follower);
    let ts = now_ms();
    let body: &[u8] = br#"{"event":"push"}"#;
    let good = sign(HOOK_SECRET, "default", "hooked", ts, "", body);
    let forged = sign("not-the-secret", "default", "hooked", ts, "", body);
    let ts_text = ts.to_string();
    for (path, sig) in
        [("/v1/hooks/default/hooked", forged.as_str()), ("/v1/hooks/default/fwd", good.as_str()), ("/v1/hooks/default/nope", good.as_str())]
    {
        let headers = [("Gnomon-Timestamp", ts_text.as_str()), ("Gnomon-Signature", sig)];
        let (status, answer) = http_with(None, &follower, "POST", path, &headers, Some(body)).unwrap();
        assert_eq!((status, answer["error"]["code"].as_str()), (401, Some("unauthorized")), "{path}: {answer}");
    }
    assert_eq!(forwarded(&follower), before, "a refused webhook call was forwarded");
    let headers = [("Gnomon-Timestamp", ts_text.as_str()), ("Gnomon-Signature", good.as_str())];
    let (status, answer) = http_with(None, &follower, "POST", "/v1/hooks/default/hooked", &headers, Some(body)).unwrap();
    assert_eq!(status, 201, "{answer}");
    assert_eq!(forwarded(&follower), before + 1.0, "a verified call is forwarded once");

    // A request forwarded once is never forwarded again.
    let mut s = std::net::TcpStream::connect(&follower).unwrap();
    use std::io::{Read, Write};
    write!(
        s,
        "POST /v1/jobs/fwd/trigger HTTP/1.1\r\nHost: {follower}\r\nAuthorization: Bearer {TOKEN}\r\nGnomon-Forwarded-By: elsewhere\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 503") && text.contains("not_leader"), "{text}");
    db.drop_database().await;
}
