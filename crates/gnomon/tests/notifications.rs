//! Notifications end to end: a real `gnomon dev` posts to a local HTTP
//! receiver — a signed webhook retried after a 503, a Slack message, a
//! target that refuses for good, a recovery — and `run get` shows each
//! delivery.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Got {
    path: String,
    headers: HashMap<String, String>,
    body: String,
}

/// A local HTTP receiver: answers each path with the statuses scripted for
/// it, in turn (the last one repeats), and keeps what it got.
struct Receiver {
    addr: String,
    got: Arc<Mutex<Vec<Got>>>,
}

impl Receiver {
    fn start(script: HashMap<&'static str, Vec<u16>>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let kept = got.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                let mut headers = HashMap::new();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                    }
                }
                let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
                let mut body = vec![0; len];
                let _ = reader.read_exact(&mut body);
                let mut all = kept.lock().unwrap();
                let seen = all.iter().filter(|g: &&Got| g.path == path).count();
                let statuses = script.get(path.as_str()).cloned().unwrap_or_else(|| vec![404]);
                let status = statuses[seen.min(statuses.len() - 1)];
                all.push(Got { path, headers, body: String::from_utf8_lossy(&body).into() });
                drop(all);
                let _ = write!(stream, "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            }
        });
        Receiver { addr, got }
    }

    fn at(&self, path: &str) -> Vec<Got> {
        self.got.lock().unwrap().iter().filter(|g| g.path == path).cloned().collect()
    }
}

fn notifications(addr: &str, run: &str) -> Vec<Value> {
    let (status, v) = http(addr, "GET", &format!("/v1/runs/{run}"), None).unwrap();
    assert_eq!(status, 200, "{v}");
    v["notifications"].as_array().cloned().unwrap_or_default()
}

fn trigger(addr: &str, job: &str) -> String {
    let (status, v) = http(addr, "POST", &format!("/v1/jobs/{job}/trigger"), None).unwrap();
    assert_eq!(status, 201, "{v}");
    v["id"].as_str().unwrap().to_string()
}

fn wait_state(addr: &str, run: &str, state: &str) {
    wait_until(&format!("run {run} {state}"), Duration::from_secs(60), || {
        http(addr, "GET", &format!("/v1/runs/{run}"), None).map(|(_, v)| v["state"] == state).unwrap_or(false)
    });
}

#[test]
fn outcomes_are_posted_signed_retried_and_shown() {
    let dir = tempfile::tempdir().unwrap();
    let r =
        Receiver::start(HashMap::from([("/hook", vec![503, 200]), ("/slack", vec![200]), ("/gone", vec![404]), ("/recovered", vec![200])]));
    let addr = format!("127.0.0.1:{}", free_port());
    let dev = Proc::spawn_env(
        dir.path(),
        "dev",
        &["dev".into(), "--listen".into(), addr.clone(), "--data-dir".into(), dir.path().join("data").display().to_string()],
        &[("GNOMON_NOTIFY_SECRET_OPS".into(), "s3cret".into())],
    );
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == json!(true)).unwrap_or(false)
    });
    let base = format!("http://{}", r.addr);
    let job = |command: &str| {
        json!({"name": "nightly", "executor": {"shell": {"command": "sh", "args": ["-c", command]}},
        "notify": [
            {"on": ["failed"], "webhook": {"url": format!("{base}/hook"), "secret": "ops", "headers": {"X-Team": "data"}}},
            {"on": ["failed"], "slack": {"url": format!("{base}/slack")}},
            {"on": ["failed"], "webhook": {"url": format!("{base}/gone")}, "max_attempts": 5},
            {"on": ["recovered"], "webhook": {"url": format!("{base}/recovered")}}
        ]})
    };
    // A bad target is refused with its field, and nothing is written.
    let mut bad = job("exit 3");
    bad["notify"][0]["webhook"]["url"] = json!("ftp://x/");
    let (status, v) = http(&addr, "POST", "/v1/jobs", Some(bad.to_string().as_bytes())).unwrap();
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_notify")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("notify[0].webhook.url:"), "{v}");
    assert_eq!(http(&addr, "GET", "/v1/jobs/nightly", None).unwrap().0, 404);

    let (status, v) = http(&addr, "POST", "/v1/jobs", Some(job("echo broken; exit 3").to_string().as_bytes())).unwrap();
    assert_eq!(status, 201, "{v}");
    let failed = trigger(&addr, "nightly");
    wait_state(&addr, &failed, "failed");
    wait_until("the webhook (after one 503), Slack and the refusing target", Duration::from_secs(60), || {
        r.at("/hook").len() >= 2 && !r.at("/slack").is_empty() && !r.at("/gone").is_empty()
    });
    // The webhook: signed, with its headers and the run in the body.
    let hook = r.at("/hook");
    let (first, second) = (&hook[0], &hook[1]);
    assert_eq!(first.headers["gnomon-notification-id"], second.headers["gnomon-notification-id"], "a retry is the same notification");
    let ts = &second.headers["gnomon-timestamp"];
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(b"s3cret").unwrap();
    mac.update(format!("v2\ndefault\nnightly\n{ts}\n\n{}", second.body).as_bytes());
    assert_eq!(second.headers["gnomon-signature"], format!("v2={}", hex::encode(mac.finalize().into_bytes())), "signed");
    assert_eq!(second.headers["x-team"], "data");
    assert_eq!(second.headers["gnomon-event"], "failed");
    let body: Value = serde_json::from_str(&second.body).unwrap();
    assert_eq!((body["event"].as_str(), body["run"]["id"].as_str()), (Some("failed"), Some(failed.as_str())));
    assert_eq!(body["job"], json!({"namespace": "default", "name": "nightly"}));
    assert_eq!(body["attempt"]["exit_code"], json!(3));
    assert!(body["attempt"]["output_tail"].as_str().unwrap().contains("broken"), "{body}");
    // Slack: a text message.
    let slack: Value = serde_json::from_str(&r.at("/slack")[0].body).unwrap();
    let text = slack["text"].as_str().unwrap();
    assert!(text.contains("default/nightly") && text.contains("failed") && text.contains("exit code 3"), "{text}");
    // What `run get` shows: sent after two tries, sent, given up on a 404.
    wait_until("the deliveries recorded", Duration::from_secs(30), || {
        let list = notifications(&addr, &failed);
        list.len() == 3 && list.iter().all(|n| n["state"] != "pending")
    });
    let list = notifications(&addr, &failed);
    let find = |suffix: &str| list.iter().find(|n| n["id"].as_str().unwrap().ends_with(suffix)).cloned().unwrap();
    let (h, s, g) = (find("/failed/0"), find("/failed/1"), find("/failed/2"));
    assert_eq!((h["state"].as_str(), h["attempts"].as_u64(), h["kind"].as_str()), (Some("sent"), Some(2), Some("webhook")), "{h}");
    assert_eq!(h["destination"], json!(base), "only the scheme and host are shown");
    assert_eq!((s["state"].as_str(), s["attempts"].as_u64(), s["kind"].as_str()), (Some("sent"), Some(1), Some("slack")), "{s}");
    assert_eq!((g["state"].as_str(), g["attempts"].as_u64()), (Some("failed"), Some(1)), "a 404 is final: {g}");
    assert!(g["last_error"].as_str().unwrap().contains("404"), "{g}");
    assert_eq!(r.at("/gone").len(), 1, "and is not tried again");
    // The CLI shows them.
    let out = std::process::Command::new(BIN).args(["run", "get", &failed, "--server", &format!("http://{addr}")]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("slack") && text.contains("sent") && text.contains("404"), "{text}");

    // A success after a failure is a recovery; the next success is not.
    let (status, v) = http(&addr, "PUT", "/v1/jobs/nightly", Some(job("true").to_string().as_bytes())).unwrap();
    assert_eq!(status, 200, "{v}");
    let ok = trigger(&addr, "nightly");
    wait_state(&addr, &ok, "succeeded");
    wait_until("the recovery notice", Duration::from_secs(30), || r.at("/recovered").len() == 1);
    let rec: Value = serde_json::from_str(&r.at("/recovered")[0].body).unwrap();
    assert_eq!((rec["event"].as_str(), rec["run"]["id"].as_str()), (Some("recovered"), Some(ok.as_str())));
    let again = trigger(&addr, "nightly");
    wait_state(&addr, &again, "succeeded");
    wait_until("the second success's notice settled", Duration::from_secs(30), || {
        notifications(&addr, &again).first().is_some_and(|n| n["state"] == "skipped")
    });
    assert!(notifications(&addr, &again)[0]["last_error"].as_str().unwrap().contains("not a recovery"));
    assert_eq!(r.at("/recovered").len(), 1, "no recovery notice without a failure before");
    assert_eq!(r.at("/hook").len(), 2, "and nothing was sent twice");
    drop(dev);
}

/// A signing secret belongs to a namespace: a job signs only with its own
/// namespace's (`GNOMON_NOTIFY_SECRET_<namespace>__<NAME>`; the unscoped
/// `GNOMON_NOTIFY_SECRET_<NAME>` serves `default` only). A job naming
/// another namespace's secret is refused at write; one naming a secret its
/// namespace lacks is never signed with someone else's.
#[test]
fn a_job_signs_only_with_a_secret_of_its_own_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let r = Receiver::start(HashMap::from([("/a", vec![200]), ("/b", vec![200])]));
    let addr = format!("127.0.0.1:{}", free_port());
    let dev = Proc::spawn_env(
        dir.path(),
        "dev",
        &["dev".into(), "--listen".into(), addr.clone(), "--data-dir".into(), dir.path().join("data").display().to_string()],
        &[("GNOMON_NOTIFY_SECRET_A__OPS".into(), "team-a-secret".into()), ("GNOMON_NOTIFY_SECRET_OPS".into(), "default-secret".into())],
    );
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == json!(true)).unwrap_or(false)
    });
    let base = format!("http://{}", r.addr);
    let job = |namespace: &str, secret: &str, path: &str| {
        json!({"name": "report", "namespace": namespace, "executor": {"shell": {"command": "false"}},
            "notify": [{"on": ["failed"], "webhook": {"url": format!("{base}{path}"), "secret": secret}, "max_attempts": 2}]})
    };
    // Team B spelling out team A's variable: refused, nothing written.
    let (status, v) = http(&addr, "POST", "/v1/jobs", Some(job("b", "A__OPS", "/b").to_string().as_bytes())).unwrap();
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_notify")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("notify[0].webhook.secret:"), "{v}");
    assert_eq!(http(&addr, "GET", "/v1/jobs/report?namespace=b", None).unwrap().0, 404);
    for bad in ["_OPS", "a__ops"] {
        let (status, _) = http(&addr, "POST", "/v1/jobs", Some(job("b", bad, "/b").to_string().as_bytes())).unwrap();
        assert_eq!(status, 400, "{bad}");
    }

    // Team B naming "ops": neither team A's nor the default namespace's.
    let (status, v) = http(&addr, "POST", "/v1/jobs", Some(job("b", "ops", "/b").to_string().as_bytes())).unwrap();
    assert_eq!(status, 201, "{v}");
    // Team A naming "ops": its own.
    let (status, v) = http(&addr, "POST", "/v1/jobs", Some(job("A", "ops", "/a").to_string().as_bytes())).unwrap();
    assert_eq!(status, 201, "{v}");
    let trigger_in = |ns: &str| {
        let (status, v) = http(&addr, "POST", &format!("/v1/jobs/report/trigger?namespace={ns}"), None).unwrap();
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    let (run_b, run_a) = (trigger_in("b"), trigger_in("A"));
    wait_state(&addr, &run_b, "failed");
    wait_state(&addr, &run_a, "failed");
    wait_until("team A's signed notice", Duration::from_secs(30), || !r.at("/a").is_empty());
    let got = &r.at("/a")[0];
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(b"team-a-secret").unwrap();
    mac.update(format!("v2\nA\nreport\n{}\n\n{}", got.headers["gnomon-timestamp"], got.body).as_bytes());
    assert_eq!(got.headers["gnomon-signature"], format!("v2={}", hex::encode(mac.finalize().into_bytes())));
    wait_until("team B's delivery given up", Duration::from_secs(30), || {
        notifications(&addr, &run_b).first().is_some_and(|n| n["state"] == "failed")
    });
    let n = &notifications(&addr, &run_b)[0];
    assert!(n["last_error"].as_str().unwrap().contains("GNOMON_NOTIFY_SECRET_b__OPS"), "{n}");
    assert!(r.at("/b").is_empty(), "nothing was sent unsigned or signed with another namespace's secret: {:?}", r.at("/b"));
    drop(dev);
}
