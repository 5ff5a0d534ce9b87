//! Helpers shared by the process-level tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::Value;

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
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let body = body.unwrap_or(b"");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
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
    Ok((status, serde_json::from_str(&payload).unwrap_or(Value::Null)))
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
