//! Helpers shared by the process-level tests.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;
pub const SIGSTOP: i32 = 19;
pub const SIGCONT: i32 = 18;

pub const BIN: &str = env!("CARGO_BIN_EXE_gnomon");

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// Sends `sig` to a process this test started.
pub fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a child process we spawned.
    unsafe {
        libc_kill(pid, sig);
    }
}

/// A tiny HTTP/1.1 client (no curl needed): method, path, optional JSON body.
pub fn http(addr: &str, method: &str, path: &str, body: Option<&[u8]>) -> std::io::Result<(u16, Value)> {
    http_as(None, addr, method, path, body)
}

/// [`http`] with a bearer token.
pub fn http_as(token: Option<&str>, addr: &str, method: &str, path: &str, body: Option<&[u8]>) -> std::io::Result<(u16, Value)> {
    http_with(token, addr, method, path, &[], body)
}

/// [`http_as`] with more request headers (`("Idempotency-Key", "k")`).
pub fn http_with(
    token: Option<&str>,
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<(u16, Value)> {
    http_head(token, addr, method, path, headers, body).map(|(status, _, value)| (status, value))
}

/// [`http_with`], with the answer's head (status line and headers, as
/// sent) too.
pub fn http_head(
    token: Option<&str>,
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<(u16, String, Value)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let body = body.unwrap_or(b"");
    let mut auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    for (name, value) in headers {
        auth.push_str(&format!("{name}: {value}\r\n"));
    }
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    s.write_all(body)?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let text = String::from_utf8_lossy(&resp).to_string();
    let status: u16 = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body_start = text.find("\r\n\r\n").map(|i| i + 4).unwrap_or(text.len());
    let mut payload = text[body_start..].to_string();
    if text[..body_start].to_ascii_lowercase().contains("transfer-encoding: chunked") {
        payload = dechunk(&payload);
    }
    Ok((status, text[..body_start].to_string(), serde_json::from_str(&payload).unwrap_or(Value::Null)))
}

fn dechunk(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("\r\n") {
        let size = usize::from_str_radix(rest[..i].trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[i + 2..i + 2 + size]);
        rest = &rest[i + 2 + size + 2..];
    }
    out
}

pub fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("timed out waiting for {what}");
}

/// A `gnomon dev` on a free loopback port with its data in `dir`, once it
/// leads: the process and its address.
pub fn leading_dev(dir: &Path) -> (Proc, String) {
    leading_dev_with(dir, &[])
}

/// As [`leading_dev`], with more flags (an `--auth-file`): leading is
/// asked of `/readyz`, which needs no credential.
pub fn leading_dev_with(dir: &Path, extra: &[String]) -> (Proc, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args: Vec<String> =
        vec!["dev".into(), "--listen".into(), addr.clone(), "--data-dir".into(), dir.join("data").display().to_string()];
    args.extend(extra.iter().cloned());
    let dev = Proc::spawn(dir, "dev", &args);
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == serde_json::json!(true)).unwrap_or(false)
    });
    (dev, addr)
}

/// As [`leading_dev`], with environment variables (a webhook secret).
pub fn leading_dev_env(dir: &Path, env: &[(&str, &str)]) -> (Proc, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> =
        vec!["dev".into(), "--listen".into(), addr.clone(), "--data-dir".into(), dir.join("data").display().to_string()];
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let dev = Proc::spawn_env(dir, "dev", &args, &env);
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == serde_json::json!(true)).unwrap_or(false)
    });
    (dev, addr)
}

/// `v2=<hex HMAC-SHA256(secret, "v2\n<ns>\n<job>\n<ts>\n<key>\n<body>")>`,
/// the webhook signature, computed here independently of the server's code.
pub fn sign(secret: &str, ns: &str, job: &str, ts: i64, key: &str, body: &[u8]) -> String {
    use hmac::Mac;
    let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("v2\n{ns}\n{job}\n{ts}\n{key}\n").as_bytes());
    mac.update(body);
    format!("v2={}", hex::encode(mac.finalize().into_bytes()))
}

/// The wall clock in Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// `gnomon auth new NAME --role ROLE …`: (token, auth file entry).
pub fn new_credential(name: &str, args: &[&str]) -> (String, String) {
    let out = Command::new(BIN).args(["auth", "new", name]).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let (token, entry) = text.split_once('\n').unwrap();
    (token.trim().to_string(), entry.trim().to_string())
}

/// A gnomon process this test started, its output in `<dir>/<name>.log`.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(dir: &Path, name: &str, args: &[String]) -> Proc {
        Proc::spawn_env(dir, name, args, &[])
    }

    /// As [`Proc::spawn`], with more environment variables.
    pub fn spawn_env(dir: &Path, name: &str, args: &[String], env: &[(String, String)]) -> Proc {
        Proc::spawn_with(dir, name, args, env, |_| {})
    }

    /// As [`Proc::spawn_env`], with the command adjusted by `adjust` last
    /// (another user, a variable removed).
    ///
    /// The tests run as root and start servers and workers that run shell
    /// jobs without `--run-as`: they say so with `GNOMON_ALLOW_ROOT_JOBS`.
    pub fn spawn_with(dir: &Path, name: &str, args: &[String], env: &[(String, String)], adjust: impl FnOnce(&mut Command)) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.env_remove("GNOMON_TOKEN")
            .env_remove("GNOMON_STORE")
            .env("GNOMON_ALLOW_ROOT_JOBS", "1")
            .env("GNOMON_LOG", "info,sqlx=warn")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        adjust(&mut cmd);
        let child = cmd.spawn().unwrap();
        Proc { child, log }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        kill(self.pid(), sig);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            kill(self.pid(), SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A TCP proxy the test controls, standing in for a network path (this
/// kernel has no netem). `cut` closes every connection and refuses new ones
/// (both ends see the break at once); `blackhole` keeps connections open but
/// passes nothing, as a partition does (both ends only see silence).
pub struct Proxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    hole: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    pub fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let hole = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (cut2, hole2, conns2) = (cut.clone(), hole.clone(), conns.clone());
        std::thread::spawn(move || {
            for down in listener.incoming().flatten() {
                if cut2.load(Ordering::SeqCst) {
                    drop(down);
                    continue;
                }
                if hole2.load(Ordering::SeqCst) {
                    // Accepted, never answered.
                    conns2.lock().unwrap().push(down);
                    continue;
                }
                let Ok(up) = TcpStream::connect(&upstream) else { continue };
                let _ = (down.set_nodelay(true), up.set_nodelay(true));
                let mut list = conns2.lock().unwrap();
                list.push(down.try_clone().unwrap());
                list.push(up.try_clone().unwrap());
                for (mut from, mut to) in [(down.try_clone().unwrap(), up.try_clone().unwrap()), (up, down)] {
                    let hole = hole2.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            if hole.load(Ordering::SeqCst) {
                                continue;
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, cut, hole, conns }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn blackhole(&self) {
        self.hole.store(true, Ordering::SeqCst);
    }

    /// Passes traffic again; connections broken or swallowed meanwhile are closed.
    pub fn restore(&self) {
        if self.hole.swap(false, Ordering::SeqCst) {
            for s in self.conns.lock().unwrap().drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// Prints the tail of every process log in `dir` (for a failing test).
pub fn dump_logs(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            eprintln!("--- {} (last 60 lines)", e.path().display());
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

/// Removes a test's keys from the shared etcd cluster.
pub async fn delete_etcd_prefix(prefix: &str) {
    let Ok(endpoints) = gnomon_backend::etcd::parse_endpoints(&gnomon_backend::testing::testdb::etcd_endpoints()) else { return };
    if let Ok(mut c) = etcd_client::Client::connect(endpoints, None).await {
        let _ = c.delete(prefix, Some(etcd_client::DeleteOptions::new().with_prefix())).await;
    }
}

pub fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    t ^ std::process::id().rotate_left(16)
}

pub fn raw_get(addr: &str, path: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}
