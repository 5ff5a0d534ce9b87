//! Webhook calls against real `gnomon dev` processes on loopback: what a
//! signature covers (the place, the time, the key and the body), the one
//! answer every refusal gets, checks made before a body is read, the key
//! space of webhook calls apart from manual triggers', secrets scoped by
//! namespace and rotated, answers that show no more than a run's id and
//! state, what a replay makes downstream (nothing), and the audit log.

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

mod common;
use common::*;

const SECRET: &str = "hook-s3cret";
const NEXT: &str = "hook-n3xt";

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    http(addr, "POST", path, Some(body.to_string().as_bytes())).unwrap()
}

fn run_ids(addr: &str, ns: &str, job: &str) -> Vec<String> {
    let (code, body) = http(addr, "GET", &format!("/v1/runs?namespace={ns}&job={job}&limit=1000"), None).unwrap();
    assert_eq!(code, 200, "{body}");
    let mut ids: Vec<String> = body["runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    ids
}

fn ended_run(addr: &str, id: &str) -> Value {
    let mut run = Value::Null;
    wait_until("the run to end", Duration::from_secs(60), || {
        run = http(addr, "GET", &format!("/v1/runs/{id}"), None).unwrap().1;
        ["succeeded", "failed", "timed_out", "cancelled", "skipped"].contains(&run["state"].as_str().unwrap_or(""))
    });
    run
}

/// A call to `/v1/hooks/{ns}/{job}` signed now with `secret` for the place
/// `signed_for` (namespace, job) and `key`.
fn call(addr: &str, ns: &str, job: &str, secret: &str, signed_for: (&str, &str), key: Option<&str>, body: &[u8]) -> (u16, Value) {
    let ts = now_ms();
    let sig = sign(secret, signed_for.0, signed_for.1, ts, key.unwrap_or(""), body);
    call_with(addr, ns, job, ts, &sig, key, body)
}

fn call_with(addr: &str, ns: &str, job: &str, ts: i64, sig: &str, key: Option<&str>, body: &[u8]) -> (u16, Value) {
    let ts = ts.to_string();
    let mut headers = vec![("Gnomon-Timestamp", ts.as_str()), ("Gnomon-Signature", sig)];
    headers.extend(key.map(|k| ("Idempotency-Key", k)));
    http_with(None, addr, "POST", &format!("/v1/hooks/{ns}/{job}"), &headers, Some(body)).unwrap()
}

fn job(name: &str, ns: &str, hook: Value) -> Value {
    json!({"name": name, "namespace": ns, "params": {"branch": {"default": "main"}},
           "triggers": {"webhook": hook}, "executor": {"shell": {"command": "sh", "args": ["-c", "echo branch=$GNOMON_PARAM_BRANCH; cat \"$GNOMON_PAYLOAD_FILE\""]}}})
}

/// Headers only, with a declared length past the bound: refused before
/// any body is sent.
fn declared_too_long(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 2000000\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn a_signature_covers_place_time_key_and_body_and_every_refusal_is_one_answer() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("GNOMON_HOOK_SECRET_team-a__DEPLOY", SECRET),
        ("GNOMON_HOOK_SECRET_team-a__DEPLOY_NEXT", NEXT),
        ("GNOMON_HOOK_SECRET_team-b__DEPLOY", "team-b-secret"),
        ("GNOMON_HOOK_SECRET_PLAIN", "unscoped"),
    ];
    let (_dev, addr) = leading_dev_env(dir.path(), &env);
    // Secrets are named in the job's own namespace only.
    for (hook, field) in [
        (json!({"secret": "team_b__deploy"}), "triggers.webhook.secret"),
        (json!({"secret_env": "GNOMON_HOOK_SECRET_team-b__DEPLOY"}), "triggers.webhook.secret_env"),
        (json!({"secret_env": "GNOMON_HOOK_SECRET_PLAIN"}), "triggers.webhook.secret_env"),
        (json!({"secret_env": "PATH"}), "triggers.webhook.secret_env"),
        (json!({}), "triggers.webhook.secret"),
    ] {
        let (code, body) = post(&addr, "/v1/jobs", &job("deploy", "team-a", hook));
        assert_eq!((code, body["error"]["code"].as_str()), (400, Some("invalid_trigger")), "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(field), "{body}");
    }
    let hook = json!({"secret": "deploy", "params": {"branch": "/ref"}});
    assert_eq!(post(&addr, "/v1/jobs", &job("deploy", "team-a", hook.clone())).0, 201);
    assert_eq!(post(&addr, "/v1/jobs", &job("deploy2", "team-a", hook.clone())).0, 201);
    assert_eq!(post(&addr, "/v1/jobs", &job("deploy", "team-b", hook)).0, 201);
    let plain = json!({"name": "plain", "namespace": "team-a", "executor": {"handler": {"name": "noop"}}});
    assert_eq!(post(&addr, "/v1/jobs", &plain).0, 201);

    // A good call: 201 with the run's id and state, and nothing else.
    let payload = br#"{"ref":"release-7"}"#;
    let ts = now_ms();
    let sig = sign(SECRET, "team-a", "deploy", ts, "", payload);
    let (code, run) = call_with(&addr, "team-a", "deploy", ts, &sig, None, payload);
    assert_eq!(code, 201, "{run}");
    let keys: Vec<&String> = run.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["id", "state"], "an answer shows the run's id and state only: {run}");
    let id = run["id"].as_str().unwrap().to_string();
    let done = ended_run(&addr, &id);
    assert_eq!(done["params"], json!({"branch": "release-7"}), "{done}");
    let out = done["attempts"][0]["output"].as_str().unwrap();
    assert_eq!(out.trim_end(), format!("branch=release-7\n{}", String::from_utf8_lossy(payload)));
    // The replay of that call is refused, and made nothing.
    let (code, body) = call_with(&addr, "team-a", "deploy", ts, &sig, None, payload);
    assert_eq!((code, body["error"]["code"].as_str()), (409, Some("webhook_replayed")), "{body}");

    // Every refusal of the proof is the same answer: a call signed for
    // another place, key, time or body; an unknown job, a job without a
    // webhook; a bad or stale signature; the first form with a key.
    let stale = now_ms() - 301_000;
    let v1 = |key: Option<&str>| {
        use hmac::Mac;
        let ts = now_ms();
        let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(format!("{ts}.").as_bytes());
        mac.update(payload);
        call_with(&addr, "team-a", "deploy", ts, &format!("sha256={}", hex::encode(mac.finalize().into_bytes())), key, payload)
    };
    let refusals: Vec<(&str, (u16, Value))> = vec![
        ("signed for team-a, sent to team-b", call(&addr, "team-b", "deploy", SECRET, ("team-a", "deploy"), None, payload)),
        ("team-b's secret for team-a's job", call(&addr, "team-a", "deploy", "team-b-secret", ("team-a", "deploy"), None, payload)),
        ("signed for deploy, sent to deploy2", call(&addr, "team-a", "deploy2", SECRET, ("team-a", "deploy"), None, payload)),
        ("a key added to a signed call", call_with(&addr, "team-a", "deploy", ts, &sig, Some("new-key"), payload)),
        ("another body", call_with(&addr, "team-a", "deploy", ts, &sig, None, br#"{"ref":"main"}"#)),
        ("another time", call_with(&addr, "team-a", "deploy", ts + 1, &sig, None, payload)),
        (
            "no signature",
            http_with(None, &addr, "POST", "/v1/hooks/team-a/deploy", &[("Gnomon-Timestamp", &ts.to_string())], Some(payload)).unwrap(),
        ),
        ("no timestamp", http_with(None, &addr, "POST", "/v1/hooks/team-a/deploy", &[("Gnomon-Signature", &sig)], Some(payload)).unwrap()),
        ("unknown job", call(&addr, "team-a", "nosuchjob", SECRET, ("team-a", "nosuchjob"), None, payload)),
        ("unknown namespace", call(&addr, "team-z", "deploy", SECRET, ("team-z", "deploy"), None, payload)),
        ("no webhook", call(&addr, "team-a", "plain", SECRET, ("team-a", "plain"), None, payload)),
        ("a bad path", call(&addr, "team-a", "a%0Ab", SECRET, ("team-a", "a\nb"), None, payload)),
        ("the first form with a key", v1(Some("k1"))),
    ];
    let stale_call = {
        let sig = sign(SECRET, "team-a", "deploy", stale, "", payload);
        call_with(&addr, "team-a", "deploy", stale, &sig, None, payload)
    };
    let first = refusals[0].1 .1.clone();
    assert_eq!(first, json!({"error": {"code": "unauthorized", "message": "the webhook call is not authorized"}}));
    for (what, (code, body)) in refusals.iter().chain([("stale", stale_call)].iter()) {
        assert_eq!((*code, body), (401, &first), "{what}: the same 401");
        assert!(!body.to_string().contains("GNOMON_"), "{what}: no answer names a variable");
    }
    // Until its cutover, the first form holds without a key.
    assert_eq!(v1(None).0, 201, "the first form before the cutover");
    // A body too large is refused (past 64 KiB, read no further than the
    // API's bound; declared past that bound, before any of it is read).
    let big = vec![b' '; 64 * 1024 + 1];
    let (code, body) = call(&addr, "team-a", "deploy", SECRET, ("team-a", "deploy"), None, &big);
    assert_eq!((code, body["error"]["code"].as_str()), (413, Some("payload_too_large")), "{body}");
    let (code, body) = call(&addr, "team-z", "nosuchjob", SECRET, ("team-z", "nosuchjob"), None, &big);
    assert_eq!((code, body["error"]["code"].as_str()), (413, Some("payload_too_large")), "the same for any path: {body}");
    let head = declared_too_long(&addr, "/v1/hooks/team-a/deploy");
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert_eq!(declared_too_long(&addr, "/v1/hooks/team-z/nosuchjob").lines().next(), head.lines().next(), "the same for any path");
    // Not UTF-8, once the signature holds: 400.
    let latin1 = b"caf\xe9";
    let (code, body) = call(&addr, "team-a", "deploy", SECRET, ("team-a", "deploy"), None, latin1);
    assert_eq!((code, body["error"]["code"].as_str()), (400, Some("invalid_payload")), "{body}");
    assert_eq!(run_ids(&addr, "team-a", "deploy").len(), 2, "refusals create nothing");
    assert!(run_ids(&addr, "team-b", "deploy").is_empty() && run_ids(&addr, "team-a", "deploy2").is_empty());

    // team-b's own secret works for team-b's job only.
    let (code, b_run) = call(&addr, "team-b", "deploy", "team-b-secret", ("team-b", "deploy"), None, payload);
    assert_eq!(code, 201, "{b_run}");

    // Rotation: a second secret is accepted beside the first.
    let (code, body) = call(&addr, "team-a", "deploy", NEXT, ("team-a", "deploy"), None, br#"{"ref":"r"}"#);
    assert_eq!((code, body["error"]["code"].as_str()), (401, Some("unauthorized")), "not yet named: {body}");
    let rotating = job("deploy", "team-a", json!({"secret": "deploy", "secondary_secret": "deploy_next", "params": {"branch": "/ref"}}));
    let (code, body) = http(&addr, "PUT", "/v1/jobs/deploy?namespace=team-a", Some(rotating.to_string().as_bytes())).unwrap();
    assert_eq!(code, 200, "{body}");
    for (secret, body) in [(NEXT, &br#"{"ref":"n"}"#[..]), (SECRET, &br#"{"ref":"o"}"#[..])] {
        let (code, run) = call(&addr, "team-a", "deploy", secret, ("team-a", "deploy"), None, body);
        assert_eq!(code, 201, "either secret during a rotation: {run}");
    }

    // The audit log names the namespace, and a path cannot write a line.
    let log = std::fs::read_to_string(dir.path().join("dev.log")).unwrap();
    assert!(!log.lines().any(|l| l.starts_with('b') || l.trim_start().starts_with("b namespace")), "no forged line");
    assert!(log.contains("a\\nb"), "the path's newline is escaped");
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("webhook call refused")).collect();
    assert!(refused.iter().all(|l| l.contains("namespace=")), "every line names the namespace");
    assert!(log.lines().any(|l| l.contains("webhook call") && l.contains("namespace=team-b")), "{log}");
}

#[test]
fn webhook_keys_have_their_own_space_and_a_repeat_makes_nothing_downstream() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("GNOMON_HOOK_SECRET_DEPLOY", SECRET)];
    let (dev, addr) = leading_dev_env(dir.path(), &env);
    assert_eq!(post(&addr, "/v1/jobs", &job("deploy", "default", json!({"secret": "deploy", "params": {"branch": "/ref"}}))).0, 201);
    let after = json!({"name": "notify", "after": [{"job": "deploy"}], "executor": {"handler": {"name": "noop"}}});
    assert_eq!(post(&addr, "/v1/jobs", &after).0, 201);

    // An operator's keyed trigger and a webhook call with the same key
    // name two runs: neither sees the other's.
    let operator = || {
        let body = br#"{"params":{"branch":"ops-secret"}}"#;
        http_with(None, &addr, "POST", "/v1/jobs/deploy/trigger", &[("Idempotency-Key", "k-1")], Some(body)).unwrap()
    };
    let (code, manual) = operator();
    assert_eq!(code, 201, "{manual}");
    let event = br#"{"ref":"release-8"}"#;
    let signed = |key: Option<&str>, body: &[u8]| call(&addr, "default", "deploy", SECRET, ("default", "deploy"), key, body);
    let (code, hooked) = signed(Some("k-1"), event);
    assert_eq!(code, 201, "a webhook key is not an operator's key: {hooked}");
    assert_ne!(hooked["id"], manual["id"]);
    assert_eq!(hooked.as_object().unwrap().len(), 2, "{hooked}");
    // A new signature of the same keyed event is a repeat; another payload
    // under the key is refused; neither makes anything.
    std::thread::sleep(Duration::from_millis(1200));
    let (code, again) = signed(Some("k-1"), event);
    assert_eq!((code, &again["id"]), (200, &hooked["id"]), "{again}");
    let (code, other) = signed(Some("k-1"), br#"{"ref":"release-9"}"#);
    assert_eq!((code, other["error"]["code"].as_str()), (409, Some("idempotency_key_reused")), "{other}");
    // The operator's key still names the operator's run.
    let (code, op_again) = operator();
    assert_eq!((code, &op_again["id"]), (200, &manual["id"]), "{op_again}");

    // An unkeyed call replayed: refused, and nothing downstream either.
    let ts = now_ms();
    let replayed = br#"{"ref":"release-10"}"#;
    let sig = sign(SECRET, "default", "deploy", ts, "", replayed);
    assert_eq!(call_with(&addr, "default", "deploy", ts, &sig, None, replayed).0, 201);
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(call_with(&addr, "default", "deploy", ts, &sig, None, replayed).0, 409);

    let ups = run_ids(&addr, "default", "deploy");
    assert_eq!(ups.len(), 3, "{ups:?}");
    let mut instants: Vec<Value> = ups.iter().map(|id| ended_run(&addr, id)["scheduled_at"].clone()).collect();
    wait_until("the downstream runs", Duration::from_secs(60), || run_ids(&addr, "default", "notify").len() >= 3);
    std::thread::sleep(Duration::from_millis(500));
    let downs = run_ids(&addr, "default", "notify");
    assert_eq!(downs.len(), 3, "one downstream run per upstream run, none for a repeat: {downs:?}");
    let mut down_instants: Vec<Value> = downs.iter().map(|id| ended_run(&addr, id)["scheduled_at"].clone()).collect();
    instants.sort_by_key(|v| v.to_string());
    down_instants.sort_by_key(|v| v.to_string());
    assert_eq!(instants, down_instants, "each at its upstream run's instant");

    // The CLI signs as a sender would, and shows the answer.
    let out = Command::new(BIN)
        .args(["--server", &format!("http://{addr}"), "job", "hook", "deploy", "--data", r#"{"ref":"from-cli"}"#, "--output", "json"])
        .args(["--idempotency-key", "cli-1"])
        .env_remove("GNOMON_TOKEN")
        .env("GNOMON_HOOK_SECRET_DEPLOY", SECRET)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ended_run(&addr, cli["id"].as_str().unwrap())["params"], json!({"branch": "from-cli"}), "{cli}");

    // A server without the secret refuses as for any other bad call, and
    // names no variable; after a killed leader, the replay and key hold.
    let mut dev = dev;
    dev.signal(SIGKILL);
    dev.wait_exit(Duration::from_secs(10)).unwrap();
    let (dev, addr) = leading_dev_env(dir.path(), &[]);
    let (code, body) = call(&addr, "default", "deploy", SECRET, ("default", "deploy"), Some("k-2"), event);
    assert_eq!((code, body["error"]["code"].as_str()), (401, Some("unauthorized")), "{body}");
    let mut dev = dev;
    dev.signal(SIGKILL);
    dev.wait_exit(Duration::from_secs(10)).unwrap();
    let (_dev, addr) = leading_dev_env(dir.path(), &env);
    assert_eq!(call_with(&addr, "default", "deploy", ts, &sig, None, replayed).0, 409);
    let (code, again) = call(&addr, "default", "deploy", SECRET, ("default", "deploy"), Some("k-1"), event);
    assert_eq!((code, &again["id"]), (200, &hooked["id"]), "{again}");
    assert_eq!(run_ids(&addr, "default", "notify").len(), 4, "the CLI's run made one more, nothing else did");
}

/// Headers of a webhook call (a timestamp of now, a signature that does not
/// hold) declaring `length` bytes, then `first` of its body.
fn unproven(addr: &str, path: &str, length: usize, first: &[u8]) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let ts = now_ms();
    write!(s, "POST {path} HTTP/1.1\r\nHost: {addr}\r\nGnomon-Timestamp: {ts}\r\nGnomon-Signature: v2={}\r\n", "0".repeat(64)).unwrap();
    write!(s, "Content-Length: {length}\r\n\r\n").unwrap();
    s.write_all(first).unwrap();
    s
}

/// The answer on `s` once the server ends it: its status line and body,
/// and whether the connection was closed after it.
fn answer_of(s: &mut std::net::TcpStream) -> (String, String) {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    (text.lines().next().unwrap_or("").to_string(), text)
}

/// A caller that sends its headers and then part of its body, and stalls
/// or trickles: the call is cut within about a second, before its
/// signature is ever checked, whatever the job (the same answer for one
/// that takes calls and one that does not exist), and its connection is
/// closed.
#[test]
fn a_slow_body_is_cut_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev_env(dir.path(), &[("GNOMON_HOOK_SECRET_DEPLOY", SECRET)]);
    assert_eq!(post(&addr, "/v1/jobs", &job("deploy", "default", json!({"secret": "deploy"}))).0, 201);
    for path in ["/v1/hooks/default/deploy", "/v1/hooks/default/nosuchjob"] {
        // Stalled after ten bytes.
        let t0 = std::time::Instant::now();
        let mut s = unproven(&addr, path, 100, b"0123456789");
        let (status, text) = answer_of(&mut s);
        let took = t0.elapsed();
        assert!(status.starts_with("HTTP/1.1 408"), "{path}: {text}");
        assert!(text.contains("\"body_timeout\""), "{path}: {text}");
        assert!(took < Duration::from_secs(5), "{path}: cut after {took:?}, not about a second");
        // A byte every 100 ms: a trickle is no longer than a stall.
        let t0 = std::time::Instant::now();
        let mut s = unproven(&addr, path, 100, b"0");
        let mut reader = s.try_clone().unwrap();
        let trickle = std::thread::spawn(move || {
            for _ in 0..99 {
                std::thread::sleep(Duration::from_millis(100));
                if s.write_all(b"x").is_err() {
                    return;
                }
            }
        });
        let (status, text) = answer_of(&mut reader);
        let took = t0.elapsed();
        assert!(status.starts_with("HTTP/1.1 408"), "{path}: {text}");
        assert!(took < Duration::from_secs(5), "{path}: a trickle was cut after {took:?}");
        trickle.join().unwrap();
    }
    // The server is still there for a call that holds.
    let (code, run) = call(&addr, "default", "deploy", SECRET, ("default", "deploy"), None, b"{}");
    assert_eq!(code, 201, "{run}");
}

/// The bodies of calls whose signatures are not yet checked share one
/// bound of memory (`--webhook-body-memory`): past it a call is answered
/// 503 `webhooks_busy` with `Retry-After`, before its body is read; once
/// the slow ones are cut, calls are read again.
#[test]
fn unproven_bodies_share_one_bound_of_memory() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> =
        ["dev", "--listen", &addr, "--data-dir", dir.path().join("data").to_str().unwrap(), "--webhook-body-memory", "128KiB"]
            .map(String::from)
            .to_vec();
    let env = vec![("GNOMON_HOOK_SECRET_DEPLOY".to_string(), SECRET.to_string())];
    let _dev = Proc::spawn_env(dir.path(), "dev", &args, &env);
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == json!(true)).unwrap_or(false)
    });
    assert_eq!(post(&addr, "/v1/jobs", &job("deploy", "default", json!({"secret": "deploy"}))).0, 201);
    // Two callers that declare 64 KiB each and send none of it hold the
    // whole bound (a few rounds: each holds it for about a second only).
    let mut busy = None;
    for _ in 0..5 {
        let holders: Vec<std::net::TcpStream> =
            ["/v1/hooks/default/deploy", "/v1/hooks/default/nosuchjob"].iter().map(|p| unproven(&addr, p, 64 * 1024, b"")).collect();
        std::thread::sleep(Duration::from_millis(250));
        let (code, head, body) = http_head(None, &addr, "POST", "/v1/hooks/default/deploy", &[], Some(b"{}")).unwrap();
        drop(holders);
        if code == 503 {
            busy = Some((head, body));
            break;
        }
        std::thread::sleep(Duration::from_millis(1500));
    }
    let (head, body) = busy.expect("a call past the bound was never refused");
    assert_eq!(body["error"]["code"], "webhooks_busy", "{body}");
    assert!(head.to_ascii_lowercase().contains("retry-after:"), "{head}");
    // The bound is free again: a good call is read and starts a run.
    wait_until("a call read again", Duration::from_secs(10), || {
        call(&addr, "default", "deploy", SECRET, ("default", "deploy"), None, b"{}").0 == 201
    });
    // The flag is checked at start.
    let out = Command::new(BIN)
        .args(["dev", "--listen", "127.0.0.1:1", "--data-dir", dir.path().join("bad").to_str().unwrap(), "--webhook-body-memory", "1KiB"])
        .env("GNOMON_ALLOW_ROOT_JOBS", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--webhook-body-memory"), "{err}");
}
