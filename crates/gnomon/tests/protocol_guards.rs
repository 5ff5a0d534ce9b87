//! On real processes: the worker protocol accepts only gRPC over HTTP/2 and,
//! without credentials, only local host names; `--allowed-hosts '*'` needs
//! credentials; HTTP jobs ignore the proxy variables, and with
//! `--http-proxy` a target resolving to a denied address never reaches the
//! proxy.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn env() -> Vec<(String, String)> {
    vec![("GNOMON_ALLOW_ROOT_JOBS".into(), "1".into())]
}

fn worker_ids(addr: &str) -> Vec<String> {
    http(addr, "GET", "/v1/workers", None)
        .map(|(_, v)| {
            v["workers"].as_array().map(|a| a.iter().filter_map(|w| w["id"].as_str().map(String::from)).collect()).unwrap_or_default()
        })
        .unwrap_or_default()
}

fn spawn_worker(dir: &Path, addr: &str, id: &str, extra: &[&str], env: &[(String, String)]) -> Proc {
    let mut args: Vec<String> =
        ["--server", &format!("http://{addr}"), "worker", "--id", id, "--label", &format!("pool={id}")].map(String::from).to_vec();
    args.extend(["--data-dir".to_string(), dir.join(id).display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    Proc::spawn_env(dir, id, &args, env)
}

/// A raw HTTP/1.1 POST: the status.
fn post_raw(addr: &str, path: &str, content_type: &str, body: &[u8]) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    String::from_utf8_lossy(&resp).split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// Opens a worker session as `worker_id`, addressed to `authority`: the
/// gRPC status it is refused with, or `None` if it opened.
async fn open_session(addr: &str, authority: &str, worker_id: &str) -> Option<tonic::Status> {
    use gnomon_proto::v1::{worker_client::WorkerClient, worker_message, Hello, WorkerMessage};
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().origin(authority.parse().unwrap());
    let channel = endpoint.connect().await.unwrap();
    let hello = WorkerMessage {
        msg: Some(worker_message::Msg::Hello(Hello {
            worker_id: worker_id.into(),
            capacity: 1,
            executors: vec!["handler".into()],
            protocol_version: gnomon_proto::PROTOCOL_VERSION,
            ..Default::default()
        })),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(hello).await.unwrap();
    let result = WorkerClient::new(channel).session(tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx)).await;
    match result {
        Err(status) => Some(status),
        Ok(mut stream) => match stream.get_mut().message().await {
            Err(status) => Some(status),
            Ok(_) => {
                drop(tx);
                None
            }
        },
    }
}

#[test]
fn the_worker_protocol_takes_only_grpc_over_http2_and_local_names_without_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_dev, addr) = leading_dev(d);
    let session = "/gnomon.worker.v1.Worker/Session";
    // What a page can send: HTTP/1.1, text/plain. Refused, no session.
    let hello_frame = b"\0\0\0\0\x0b\x0a\x07phantom\x18\x01";
    let status = post_raw(&addr, session, "text/plain", hello_frame);
    assert_eq!(status, 415, "text/plain over HTTP/1.1");
    let status = post_raw(&addr, session, "application/grpc", hello_frame);
    assert!((400..500).contains(&status), "gRPC content over HTTP/1.1: {status}");
    // A gRPC client addressing the server under a name it does not know
    // (what a DNS-rebinding page would do) is refused with a gRPC status.
    let port = addr.rsplit(':').next().unwrap().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let refused = rt.block_on(open_session(&addr, &format!("http://rebind.example:{port}"), "phantom-2"));
    let refused = refused.expect("a session under a foreign host name must be refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("rebind.example"), "{refused:?}");
    // Under the server's own address the guard lets a session through.
    assert!(rt.block_on(open_session(&addr, &format!("http://127.0.0.1:{port}"), "probe")).is_none());
    // A real worker connects; the refused ones left no session behind.
    let _w = spawn_worker(d, &addr, "ext-1", &[], &env());
    wait_until("the external worker", Duration::from_secs(30), || worker_ids(&addr).contains(&"ext-1".to_string()));
    let ids = worker_ids(&addr);
    assert!(!ids.iter().any(|i| i.starts_with("phantom")), "{ids:?}");
}

#[test]
fn any_host_name_needs_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (i, hosts) in ["*", "sched.example.com,*"].iter().enumerate() {
        let addr = format!("127.0.0.1:{}", free_port());
        let data = d.join(format!("data-{i}"));
        let args = ["dev", "--listen", &addr, "--data-dir", data.to_str().unwrap(), "--allowed-hosts", hosts].map(String::from);
        let mut p = Proc::spawn_env(d, &format!("refused-{i}"), &args, &env());
        let status = p.wait_exit(Duration::from_secs(30)).expect("the server must refuse to start");
        assert!(!status.success());
        let log = p.log();
        assert!(log.contains("--allowed-hosts '*' needs credentials"), "{log}");
        assert!(!data.join("gnomon.db").exists(), "nothing is created");
    }
    // With a token it starts.
    let addr = format!("127.0.0.1:{}", free_port());
    let args = [
        "dev",
        "--listen",
        &addr,
        "--data-dir",
        d.join("ok").to_str().unwrap(),
        "--allowed-hosts",
        "*",
        "--token",
        "guards-test-token-0123456789",
    ]
    .map(String::from);
    let _p = Proc::spawn_env(d, "with-token", &args, &env());
    wait_until("the server with a token", Duration::from_secs(60), || http(&addr, "GET", "/healthz", None).is_ok_and(|(s, _)| s == 200));
}

/// A forward proxy on loopback that records each request's first line and
/// answers 200 "ok".
fn recording_proxy() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            log.lock().unwrap().push(String::from_utf8_lossy(&buf).lines().next().unwrap_or("").to_string());
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    (addr, seen)
}

/// Creates an HTTP job for `url` on the worker `pool`, runs it once: the
/// finished run.
fn run_http_job(addr: &str, name: &str, pool: &str, url: &str) -> Value {
    let job = json!({"name": name, "executor": {"http": {"method": "GET", "url": url}}, "route": {"labels": {"pool": pool}}});
    let (status, body) = http(addr, "POST", "/v1/jobs", Some(job.to_string().as_bytes())).unwrap();
    assert_eq!(status, 201, "{body}");
    let (status, run) = http(addr, "POST", &format!("/v1/jobs/{name}/trigger"), None).unwrap();
    assert!((200..300).contains(&status), "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, run) = http(addr, "GET", &format!("/v1/runs/{id}"), None).unwrap();
        if matches!(run["state"].as_str(), Some("succeeded" | "failed" | "timed_out")) {
            return run;
        }
        assert!(Instant::now() < deadline, "the run did not finish: {run}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn http_jobs_ignore_proxy_variables_and_check_targets_before_an_explicit_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (proxy, seen) = recording_proxy();
    let (_dev, addr) = leading_dev(d);
    let proxy_url = format!("http://{proxy}");
    let mut vars = env();
    for v in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"] {
        vars.push((v.to_string(), proxy_url.clone()));
    }
    let _env_worker = spawn_worker(d, &addr, "env", &["--executors", "http"], &vars);
    let _proxied = spawn_worker(d, &addr, "proxied", &["--executors", "http", "--http-proxy", &proxy_url], &env());
    wait_until("the workers", Duration::from_secs(30), || {
        let ids = worker_ids(&addr);
        ids.contains(&"env".to_string()) && ids.contains(&"proxied".to_string())
    });
    let metadata = ["http://169.254.169.254.nip.io/latest/meta-data/", "http://metadata.google.internal/computeMetadata/v1/"];
    // The proxy variables are not used: these names do not resolve here
    // (no network) and the requests fail without reaching the proxy.
    for (i, url) in metadata.iter().enumerate() {
        let run = run_http_job(&addr, &format!("env-{i}"), "env", url);
        assert_eq!(run["state"], "failed", "{run}");
    }
    assert!(seen.lock().unwrap().is_empty(), "the proxy was contacted: {:?}", seen.lock().unwrap());
    // An explicit proxy is used for a target the worker resolved to an
    // allowed address, and never hears of the others.
    let run = run_http_job(&addr, "via-proxy", "proxied", "http://localhost:9/ok");
    assert_eq!(run["state"], "succeeded", "{run}");
    assert_eq!(*seen.lock().unwrap(), vec!["GET http://localhost:9/ok HTTP/1.1".to_string()]);
    for (i, url) in metadata.iter().enumerate() {
        let run = run_http_job(&addr, &format!("proxied-{i}"), "proxied", url);
        assert_eq!(run["state"], "failed", "{run}");
        let output = run["attempts"][0]["output"].as_str().unwrap_or("");
        assert!(output.contains("before --http-proxy"), "{output}");
    }
    assert_eq!(seen.lock().unwrap().len(), 1, "{:?}", seen.lock().unwrap());
    // A bad proxy URL is refused at start.
    let mut bad = spawn_worker(d, &addr, "bad", &["--http-proxy", "socks5://127.0.0.1:1080"], &env());
    let status = bad.wait_exit(Duration::from_secs(30)).expect("a bad --http-proxy must stop the worker");
    assert!(!status.success() && bad.log().contains("--http-proxy"), "{}", bad.log());
}
