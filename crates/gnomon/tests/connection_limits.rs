//! The listener against idle and slow clients, on real `gnomon dev`
//! processes: sockets that send nothing (plain TCP) or go quiet after the
//! TLS handshake neither keep `/healthz`, the CLI or a worker out nor stay
//! open; a request body that stalls is answered 408; one address at its
//! cap of busy connections is refused while another is served.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn env() -> Vec<(String, String)> {
    vec![("GNOMON_ALLOW_ROOT_JOBS".into(), "1".into())]
}

/// A `gnomon dev` with `extra` flags, once it leads.
fn dev(dir: &Path, extra: &[&str], ready: impl Fn(&str) -> bool) -> (Proc, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args: Vec<String> = ["dev", "--listen", &addr, "--data-dir", dir.join("data").to_str().unwrap()].map(String::from).to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    let p = Proc::spawn_env(dir, "dev", &args, &env());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(&addr) {
        if Instant::now() > deadline {
            dump_logs(dir);
            panic!("the server did not come up");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    (p, addr)
}

fn leading(addr: &str) -> bool {
    http(addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == json!(true)).unwrap_or(false)
}

/// A GET over a fresh connection, each step within `limit`: the status, or
/// 0 when there is no answer.
fn get_within(addr: &str, path: &str, limit: Duration) -> u16 {
    let Ok(mut s) = TcpStream::connect_timeout(&addr.parse().unwrap(), limit) else { return 0 };
    s.set_read_timeout(Some(limit)).unwrap();
    s.set_write_timeout(Some(limit)).unwrap();
    if write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").is_err() {
        return 0;
    }
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    String::from_utf8_lossy(&resp).split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// Waits until the peer closes `s` (EOF or reset), at most `limit`: whether it did.
fn closed_by_peer(s: &mut impl Read, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 512];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

fn idle_socket(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    s
}

fn worker_ids(addr: &str) -> Vec<String> {
    http(addr, "GET", "/v1/workers", None)
        .map(|(_, v)| {
            v["workers"].as_array().map(|a| a.iter().filter_map(|w| w["id"].as_str().map(String::from)).collect()).unwrap_or_default()
        })
        .unwrap_or_default()
}

/// Triggers `job` and waits for its run to succeed: the worker that ran it.
fn run_once(addr: &str, job: &str) -> String {
    let (status, run) = http(addr, "POST", &format!("/v1/jobs/{job}/trigger"), None).unwrap();
    assert!((200..300).contains(&status), "{status} {run}");
    let id = run["id"].as_str().unwrap().to_string();
    let mut last = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        last = http(addr, "GET", &format!("/v1/runs/{id}"), None).map(|r| r.1).unwrap_or(Value::Null);
        if last["state"] == "succeeded" {
            return last["attempts"][0]["worker"].as_str().unwrap_or("").to_string();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("the run did not succeed: {last}");
}

#[test]
fn idle_plain_sockets_neither_keep_clients_out_nor_stay_open() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_dev, addr) = dev(d, &["--max-connections", "8"], leading);
    wait_until("the embedded worker", Duration::from_secs(30), || worker_ids(&addr).contains(&"dev-worker".to_string()));
    // As many sockets as the server takes, none sending a byte.
    let opened = Instant::now();
    let mut idle: Vec<TcpStream> = (0..8).map(|_| idle_socket(&addr)).collect();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get_within(&addr, "/healthz", Duration::from_secs(5)), 200, "/healthz must answer beside idle sockets");
    // A worker connects and runs a job, the server again full of idle sockets.
    let _w = Proc::spawn_env(
        d,
        "ext-1",
        &["--server", &format!("http://{addr}"), "worker", "--id", "ext-1", "--label", "pool=ext", "--capacity", "2"]
            .map(String::from)
            .into_iter()
            .chain(["--data-dir".to_string(), d.join("ext-1").display().to_string()])
            .collect::<Vec<_>>(),
        &env(),
    );
    idle.extend((0..8).map(|_| idle_socket(&addr)));
    wait_until("the external worker", Duration::from_secs(30), || worker_ids(&addr).contains(&"ext-1".to_string()));
    let job = json!({"name": "ext", "executor": {"handler": {"name": "noop"}}, "route": {"labels": {"pool": "ext"}}});
    let (status, body) = http(&addr, "POST", "/v1/jobs", Some(job.to_string().as_bytes())).unwrap();
    assert_eq!(status, 201, "{body}");
    idle.extend((0..8).map(|_| idle_socket(&addr)));
    assert_eq!(run_once(&addr, "ext"), "ext-1");
    // The server closes every idle socket (10 s to start a request).
    for (i, s) in idle.iter_mut().enumerate() {
        let left = Duration::from_secs(40).saturating_sub(opened.elapsed());
        assert!(closed_by_peer(s, left), "idle socket {i} still open after {:?}", opened.elapsed());
    }
    // The worker's session is busy, not idle: it outlived all of that.
    assert!(worker_ids(&addr).contains(&"ext-1".to_string()));
    assert_eq!(run_once(&addr, "ext"), "ext-1");
}

/// A CA and a server certificate for 127.0.0.1: (CA PEM, cert, key).
fn certificates(dir: &Path) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(params, ca_key);
    let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let paths = ["ca.pem", "server.crt", "server.key"].map(|n| dir.join(n).display().to_string());
    std::fs::write(&paths[0], ca.pem()).unwrap();
    std::fs::write(&paths[1], cert.pem()).unwrap();
    std::fs::write(&paths[2], key.serialize_pem()).unwrap();
    let [a, b, c] = paths;
    (a, b, c)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection whose handshake has completed.
fn tls_connect(addr: &str, config: &Arc<rustls::ClientConfig>) -> Tls {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).unwrap();
    }
    tcp.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

#[test]
fn tls_sockets_quiet_after_the_handshake_are_closed_and_keep_no_one_out() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ca, cert, key) = certificates(d);
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(&ca).unwrap();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let https_ready = |config: Arc<rustls::ClientConfig>| {
        move |addr: &str| {
            let Ok(tcp) = TcpStream::connect(addr) else { return false };
            drop(tcp);
            healthz_over_tls(addr, &config, Duration::from_secs(5)) == 200
        }
    };
    let (_dev, addr) = dev(d, &["--max-connections", "8", "--tls-cert", &cert, "--tls-key", &key], https_ready(config.clone()));
    let opened = Instant::now();
    let mut quiet: Vec<Tls> = (0..8).map(|_| tls_connect(&addr, &config)).collect();
    assert_eq!(healthz_over_tls(&addr, &config, Duration::from_secs(5)), 200, "/healthz must answer beside quiet TLS sockets");
    // The CLI (and its worker list: the embedded worker over TLS) too.
    let out = std::process::Command::new(BIN)
        .args(["--server", &format!("https://{addr}"), "--ca", &ca, "-o", "json", "worker", "list"])
        .env_remove("GNOMON_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (i, s) in quiet.iter_mut().enumerate() {
        let left = Duration::from_secs(40).saturating_sub(opened.elapsed());
        assert!(closed_by_peer(s, left), "quiet TLS socket {i} still open after {:?}", opened.elapsed());
    }
}

fn healthz_over_tls(addr: &str, config: &Arc<rustls::ClientConfig>, limit: Duration) -> u16 {
    let Ok(tcp) = TcpStream::connect_timeout(&addr.parse().unwrap(), limit) else { return 0 };
    tcp.set_read_timeout(Some(limit)).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    if write!(s, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").is_err() {
        return 0;
    }
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    String::from_utf8_lossy(&resp).split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// A request whose body stops halfway: (the stream, when it was sent).
fn stalled_body(addr: &str, from: Option<&str>) -> TcpStream {
    let mut s = match from {
        None => TcpStream::connect(addr).unwrap(),
        Some(src) => connect_from(src, addr),
    };
    write!(s, "POST /v1/jobs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{{\"na").unwrap();
    s
}

/// A connection to `addr` from the loopback address `src` (127.0.0.2: another client).
fn connect_from(src: &str, addr: &str) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{src}:0").parse().unwrap()).unwrap();
        let s = socket.connect(addr.parse().unwrap()).await.unwrap().into_std().unwrap();
        s.set_nonblocking(false).unwrap();
        s
    })
}

#[test]
fn a_stalled_body_is_answered_408_and_a_busy_address_at_its_cap_leaves_others_served() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_dev, addr) = dev(d, &["--max-connections", "64", "--max-connections-per-client", "4"], leading);
    // A body that stops: 408 within the body deadline (30 s), then closed.
    let started = Instant::now();
    let mut s = stalled_body(&addr, None);
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.1 408"), "after {:?}: {text:?}", started.elapsed());
    assert!(text.contains("\"timeout\""), "{text}");
    // 127.0.0.1 fills its cap of 4 with busy connections (its embedded
    // worker holds one): a fifth from it is closed at once, unanswered,
    // while another address is served.
    let busy: Vec<TcpStream> = (0..4).map(|_| stalled_body(&addr, None)).collect();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get_within(&addr, "/healthz", Duration::from_secs(5)), 0, "the address at its cap is refused");
    let mut other = connect_from("127.0.0.2", &addr);
    other.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(other, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut resp = Vec::new();
    let _ = other.read_to_end(&mut resp);
    assert!(String::from_utf8_lossy(&resp).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&resp));
    drop(busy);
    wait_until("the address served again", Duration::from_secs(10), || get_within(&addr, "/healthz", Duration::from_secs(5)) == 200);
}

/// The deadlines are flags: with `--header-read-timeout 2s` a socket that
/// sends nothing is closed well before the 10 s default, and every close
/// is counted by reason in `/metrics`. A deadline out of range stops the
/// start.
#[test]
fn deadlines_are_flags_and_closes_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .args(["dev", "--listen", "127.0.0.1:1", "--data-dir", dir.path().join("bad").to_str().unwrap(), "--idle-timeout", "0s"])
        .env("GNOMON_ALLOW_ROOT_JOBS", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--idle-timeout must be between 1s and 1h"), "{err}");
    let (_dev, addr) = dev(dir.path(), &["--header-read-timeout", "2s", "--idle-timeout", "3s", "--body-timeout", "2s"], leading);
    let mut s = idle_socket(&addr);
    let opened = Instant::now();
    assert!(closed_by_peer(&mut s, Duration::from_secs(30)), "the idle socket was never closed");
    assert!(opened.elapsed() < Duration::from_secs(9), "closed after {:?}: the 2 s deadline was not used", opened.elapsed());
    wait_until("the close counted", Duration::from_secs(10), || {
        let Ok(mut m) = TcpStream::connect(&addr) else { return false };
        let _ = write!(m, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let mut text = String::new();
        let _ = m.read_to_string(&mut text);
        text.lines().any(|l| l.starts_with("gnomon_connections_closed_total{reason=\"idle\"}"))
    });
}
