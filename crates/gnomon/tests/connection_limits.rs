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

/// The most streams a client may have open at once on one HTTP/2
/// connection, as the server announces it.
const MAX_STREAMS: u32 = 32;

/// One HTTP/2 frame: (type, flags, stream, payload).
type Frame = (u8, u8, u32, Vec<u8>);

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len() as u32;
    let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A header field as an HPACK literal without indexing, named by its
/// index in the static table.
fn literal(out: &mut Vec<u8>, index: u8, value: &str) {
    if index < 15 {
        out.push(index);
    } else {
        out.extend_from_slice(&[15, index - 15]);
    }
    out.push(value.len() as u8);
    out.extend_from_slice(value.as_bytes());
}

/// The frames read so far from one connection, whole frames only.
#[derive(Default)]
struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    /// The next whole frame, or `None` when none came in time (what was
    /// read of one is kept for the next call) or the connection ended.
    fn next(&mut self, s: &mut impl Read) -> Option<Frame> {
        loop {
            if self.buf.len() >= 9 {
                let len = (usize::from(self.buf[0]) << 16) | (usize::from(self.buf[1]) << 8) | usize::from(self.buf[2]);
                if self.buf.len() >= 9 + len {
                    let f: Vec<u8> = self.buf.drain(..9 + len).collect();
                    return Some((f[3], f[4], u32::from_be_bytes([f[5], f[6], f[7], f[8]]) & 0x7fff_ffff, f[9..].to_vec()));
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

/// Opens `n` streams at once on a fresh HTTP/2 connection (a webhook call
/// each, whose body never comes, so every stream stays open), without
/// waiting for the server's settings, as a client that ignores them
/// would: the server's announced stream limit, the streams it refused
/// (`RST_STREAM` `REFUSED_STREAM`) and the ones it answered.
fn open_streams(s: &mut (impl Read + Write), addr: &str, scheme: &str, n: u32) -> (Option<u32>, Vec<u32>, Vec<u32>) {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(4, 0, 0, &[]));
    for i in 0..n {
        let mut block = vec![0x83, if scheme == "https" { 0x87 } else { 0x86 }];
        literal(&mut block, 4, &format!("/v1/hooks/default/nosuchjob-{i}"));
        literal(&mut block, 1, addr);
        literal(&mut block, 28, "10");
        out.extend(frame(1, 0x4, 2 * i + 1, &block));
    }
    s.write_all(&out).unwrap();
    s.flush().unwrap();
    let (mut announced, mut refused, mut answered) = (None, Vec::new(), Vec::new());
    let mut frames = Frames::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && (refused.len() + answered.len()) < n as usize {
        let Some((kind, flags, stream, payload)) = frames.next(s) else { continue };
        match kind {
            // SETTINGS: MAX_CONCURRENT_STREAMS is setting 3; acknowledged.
            4 if flags & 1 == 0 => {
                for set in payload.chunks(6) {
                    if set.len() == 6 && u16::from_be_bytes([set[0], set[1]]) == 3 {
                        announced = Some(u32::from_be_bytes([set[2], set[3], set[4], set[5]]));
                    }
                }
                s.write_all(&frame(4, 1, 0, &[])).unwrap();
            }
            // RST_STREAM REFUSED_STREAM (7).
            3 if payload == [0, 0, 0, 7] => refused.push(stream),
            // HEADERS: an answer.
            1 if !answered.contains(&stream) => answered.push(stream),
            // GOAWAY ends the connection.
            7 => break,
            _ => {}
        }
    }
    (announced, refused, answered)
}

/// HTTP/2 connections, cleartext (h2c) and TLS alike, announce a small
/// limit of concurrent streams and refuse the streams past it: one client
/// cannot hold more than that many requests open on one connection.
#[test]
fn http2_streams_past_the_limit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let check = |(announced, mut refused, mut answered): (Option<u32>, Vec<u32>, Vec<u32>), how: &str| {
        refused.sort();
        answered.sort();
        assert_eq!(announced, Some(MAX_STREAMS), "{how}: the announced limit");
        assert_eq!(refused, (MAX_STREAMS..40).map(|i| 2 * i + 1).collect::<Vec<_>>(), "{how}: the streams past the limit are refused");
        assert_eq!(answered, (0..MAX_STREAMS).map(|i| 2 * i + 1).collect::<Vec<_>>(), "{how}: the others are answered");
    };
    // h2c: HTTP/2 with prior knowledge on the plain port.
    let plain = d.join("plain");
    std::fs::create_dir(&plain).unwrap();
    let (_dev, addr) = dev(&plain, &[], leading);
    let mut tcp = TcpStream::connect(&addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    check(open_streams(&mut tcp, &addr, "http", 40), "h2c");
    assert_eq!(get_within(&addr, "/healthz", Duration::from_secs(5)), 200);
    // h2 over TLS (ALPN).
    let tls_dir = d.join("tls");
    std::fs::create_dir(&tls_dir).unwrap();
    let (ca, cert, key) = certificates(&tls_dir);
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(&std::fs::read(&ca).unwrap()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let plain_config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut h2 = plain_config.clone();
    h2.alpn_protocols = vec![b"h2".to_vec()];
    let (plain_config, h2) = (Arc::new(plain_config), Arc::new(h2));
    let ready = move |addr: &str| healthz_over_tls(addr, &plain_config, Duration::from_secs(5)) == 200;
    let (_tls_dev, addr) = dev(&tls_dir, &["--tls-cert", &cert, "--tls-key", &key], ready);
    let mut tls = tls_connect(&addr, &h2);
    assert_eq!(tls.conn.alpn_protocol(), Some(&b"h2"[..]), "the server speaks h2 over TLS");
    check(open_streams(&mut tls, &addr, "https", 40), "h2 over TLS");
}
