//! Safe to expose: browser requests from other sites and DNS rebinding are
//! refused, credentials carry roles and namespaces, worker credentials open
//! only worker sessions under their prefix, and rotating a credential needs
//! no restart.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// A `gnomon dev` on a free loopback port, ready to answer.
fn dev(dir: &Path, name: &str, extra: &[&str]) -> (Proc, String) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut args: Vec<String> =
        vec!["dev".into(), "--listen".into(), addr.clone(), "--data-dir".into(), dir.join(name).display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let p = Proc::spawn(dir, name, &args);
    let a = addr.clone();
    wait_until("the server to lead", Duration::from_secs(60), || req(&a, "GET", "/readyz", &[], None).1["leading"] == true);
    (p, addr)
}

/// One HTTP/1.1 request with exactly these headers (plus Host, unless given).
fn req(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>) -> (u16, Value) {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return (0, Value::Null) };
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = body.unwrap_or("");
    head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    if s.write_all(head.as_bytes()).is_err() {
        return (0, Value::Null);
    }
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp).to_string();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

const JSON: (&str, &str) = ("Content-Type", "application/json");

fn job(name: &str, namespace: Option<&str>) -> String {
    let mut j = json!({"name": name, "schedule": {"every": "1h"}, "executor": {"shell": {"command": "true"}}});
    if let Some(ns) = namespace {
        j["namespace"] = json!(ns);
    }
    j.to_string()
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

/// Job names the server holds, asked as the anonymous or the given credential.
fn job_names(addr: &str, auth: &[(&str, &str)]) -> Vec<String> {
    let (_, v) = req(addr, "GET", "/v1/jobs", auth, None);
    v["jobs"].as_array().map(|a| a.iter().filter_map(|j| j["name"].as_str().map(str::to_string)).collect()).unwrap_or_default()
}

fn chromium() -> String {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new(c).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success()) {
            return c.to_string();
        }
    }
    panic!("this test drives a headless Chromium: install the chromium package (scripts/test.sh does)");
}

/// Serves `page` to every request on a free loopback port, for the test's life.
fn serve_page(page: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    port
}

/// Loads `url` in headless Chromium (names `*.test` resolve to 127.0.0.1)
/// and returns the DOM after its scripts ran.
fn chromium_dom(dir: &Path, url: &str) -> String {
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            &format!("--user-data-dir={}", dir.join("chromium-profile").display()),
            "--host-resolver-rules=MAP attacker.test 127.0.0.1, MAP rebind.test 127.0.0.1",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ])
        .stderr(Stdio::null())
        .output()
        .expect("running chromium");
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn a_page_on_another_site_can_neither_write_nor_read() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = dev(dir.path(), "dev", &[]);
    assert_eq!(req(&addr, "POST", "/v1/jobs", &[JSON], Some(&job("private", None))).0, 201);
    let marker = dir.path().join("MARKER");
    // What an attacker's page does: a no-cors POST with text/plain (no
    // preflight), a bodiless trigger, and a read of the job list.
    let evil = json!({"name": "pwned", "schedule": {"every": "1h"},
                      "executor": {"shell": {"command": format!("touch {}", marker.display())}}});
    let page = format!(
        r#"<html><body><pre id="out"></pre><script>
const api = 'http://{addr}';
const out = [];
async function go() {{
  try {{ await fetch(api + '/v1/jobs', {{method: 'POST', mode: 'no-cors', headers: {{'Content-Type': 'text/plain'}}, body: {body}}}); out.push('post-sent'); }} catch (e) {{ out.push('post-error'); }}
  try {{ await fetch(api + '/v1/jobs/pwned/trigger', {{method: 'POST', mode: 'no-cors'}}); out.push('trigger-sent'); }} catch (e) {{ out.push('trigger-error'); }}
  try {{ const r = await fetch(api + '/v1/jobs'); out.push('read:' + (await r.text())); }} catch (e) {{ out.push('read-blocked'); }}
  document.getElementById('out').textContent = out.join(' ');
}}
go();
</script></body></html>"#,
        body = serde_json::to_string(&evil.to_string()).unwrap()
    );
    let page_port = serve_page(page);
    let dom = chromium_dom(dir.path(), &format!("http://attacker.test:{page_port}/"));
    assert!(dom.contains("post-sent") && dom.contains("trigger-sent"), "the page ran: {dom}");
    assert!(dom.contains("read-blocked") && !dom.contains("private"), "the page read nothing: {dom}");
    assert_eq!(job_names(&addr, &[]), vec!["private"], "nothing was created");
    std::thread::sleep(Duration::from_secs(2));
    assert!(!marker.exists(), "no command ran");
    let (_, runs) = req(&addr, "GET", "/v1/runs", &[], None);
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(0), "no run: {runs}");
    // The requests reached the server and were refused there.
    let log = server.log();
    assert!(log.matches("cross-site requests are refused").count() >= 3, "refusals logged:\n{log}");

    // DNS rebinding: the attacker's name now resolves to the server. The
    // browser sends that name as Host, and the server refuses to answer.
    let dom = chromium_dom(dir.path(), &format!("http://rebind.test:{}/v1/jobs", addr.rsplit(':').next().unwrap()));
    assert!(dom.contains("host_not_allowed") && !dom.contains("private"), "rebinding read nothing: {dom}");
    // The same page under the server's own address reads, as the UI does.
    let dom = chromium_dom(dir.path(), &format!("http://{addr}/v1/jobs"));
    assert!(dom.contains("private"), "same origin reads: {dom}");
}

/// A refused request: method, path, headers, body, status, error code.
type Case = (&'static str, &'static str, Vec<(&'static str, String)>, Option<String>, u16, &'static str);

#[test]
fn cross_site_writes_and_foreign_hosts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = dev(dir.path(), "dev", &["--allowed-hosts", "sched.example"]);
    let port = addr.rsplit(':').next().unwrap().to_string();
    let cases: Vec<Case> = vec![
        ("POST", "/v1/jobs", vec![("Content-Type", "text/plain".into())], Some(job("a", None)), 415, "unsupported_media_type"),
        (
            "POST",
            "/v1/jobs",
            vec![("Content-Type", "application/x-www-form-urlencoded".into())],
            Some(job("a", None)),
            415,
            "unsupported_media_type",
        ),
        ("POST", "/v1/jobs", vec![], Some(job("a", None)), 415, "unsupported_media_type"),
        ("POST", "/v1/jobs", vec![JSON_S(), ("Origin", "http://evil.example".into())], Some(job("a", None)), 403, "cross_site_request"),
        ("POST", "/v1/jobs", vec![JSON_S(), ("Origin", "null".into())], Some(job("a", None)), 403, "cross_site_request"),
        ("POST", "/v1/jobs", vec![JSON_S(), ("Sec-Fetch-Site", "same-site".into())], Some(job("a", None)), 403, "cross_site_request"),
        ("GET", "/v1/jobs", vec![("Sec-Fetch-Site", "cross-site".into())], None, 403, "cross_site_request"),
        ("GET", "/v1/jobs", vec![("Host", format!("evil.example:{port}"))], None, 403, "host_not_allowed"),
        ("GET", "/ui", vec![("Host", format!("evil.example:{port}"))], None, 403, "host_not_allowed"),
        ("POST", "/v1/jobs", vec![JSON_S(), ("Host", format!("evil.example:{port}"))], Some(job("a", None)), 403, "host_not_allowed"),
    ];
    for (method, path, headers, body, status, want) in cases {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (got, v) = req(&addr, method, path, &h, body.as_deref());
        assert_eq!((got, code(&v)), (status, want), "{method} {path} {headers:?}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    assert!(job_names(&addr, &[]).is_empty(), "nothing was created");
    // What the UI, the CLI and curl send is accepted: the server's own
    // origin, no origin, an allowed host name, localhost, an IP address.
    let own = format!("http://{addr}");
    assert_eq!(req(&addr, "POST", "/v1/jobs", &[JSON, ("Origin", &own), ("Sec-Fetch-Site", "same-origin")], Some(&job("a", None))).0, 201);
    assert_eq!(req(&addr, "POST", "/v1/jobs/a/trigger", &[], None).0, 201, "a bodiless write needs no content type");
    assert_eq!(req(&addr, "GET", "/v1/jobs", &[("Host", &format!("sched.example:{port}"))], None).0, 200);
    assert_eq!(req(&addr, "GET", "/v1/jobs", &[("Host", &format!("localhost:{port}"))], None).0, 200);
    // The worker protocol is not subject to the host rule (workers reach
    // servers by names no one lists); the embedded worker connected.
    wait_until("the embedded worker", Duration::from_secs(30), || {
        req(&addr, "GET", "/v1/workers", &[], None).1["workers"].as_array().is_some_and(|w| !w.is_empty())
    });
}

#[allow(non_snake_case)]
fn JSON_S() -> (&'static str, String) {
    ("Content-Type", "application/json".into())
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[test]
fn roles_and_namespaces_limit_each_credential_and_rotation_needs_no_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (viewer, e1) = new_credential("viewer-1", &["--role", "viewer"]);
    let (operator, e2) = new_credential("operator-1", &["--role", "operator"]);
    let (admin, e3) = new_credential("admin-1", &["--role", "admin"]);
    let (worker, e4) = new_credential("pool-a", &["--role", "worker", "--worker-prefix", "pool-a-"]);
    let (team, e5) = new_credential("team-a-admin", &["--role", "admin", "--namespace", "team-a"]);
    let file = dir.path().join("auth.toml");
    std::fs::write(&file, [e1.as_str(), &e2, &e3, &e4, &e5].join("\n\n")).unwrap();
    let (server, addr) = dev(dir.path(), "dev", &["--auth-file", file.to_str().unwrap()]);
    let as_ = |t: &str| bearer(t);
    let (v, o, a, w, t) = (as_(&viewer), as_(&operator), as_(&admin), as_(&worker), as_(&team));
    let call = |method: &str, path: &str, who: &str, body: Option<String>| {
        let mut h: Vec<(&str, &str)> = vec![JSON];
        if !who.is_empty() {
            h.push(("Authorization", who));
        }
        req(&addr, method, path, &h, body.as_deref())
    };
    // Who are you?
    let (s, e) = call("GET", "/v1/jobs", "", None);
    assert_eq!((s, code(&e)), (401, "unauthenticated"), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("requires a bearer token"));
    let (s, e) = call("GET", "/v1/jobs", "Bearer 0123456789abcdef0123", None);
    assert_eq!((s, code(&e)), (401, "unauthenticated"));
    assert!(e["error"]["message"].as_str().unwrap().contains("not one this server knows"));
    assert_eq!(call("GET", "/metrics", "", None).0, 401, "metrics need a credential");
    // What may you do?
    assert_eq!(call("POST", "/v1/jobs", &format!("bearer {admin}"), Some(job("j", None))).0, 201, "bearer in lower case");
    assert_eq!(call("GET", "/v1/jobs", &v, None).0, 200);
    assert_eq!(req(&addr, "GET", "/metrics", &[("Authorization", &v)], None).0, 200);
    let (s, e) = call("POST", "/v1/jobs/j/trigger", &v, None);
    assert_eq!((s, code(&e)), (403, "forbidden"));
    assert!(e["error"]["message"].as_str().unwrap().contains("needs the operator role"), "{e}");
    assert_eq!(call("POST", "/v1/jobs", &o, Some(job("k", None))).0, 403);
    assert_eq!(call("DELETE", "/v1/jobs/j", &o, None).0, 403);
    let (s, run) = call("POST", "/v1/jobs/j/trigger", &o, None);
    assert_eq!(s, 201, "{run}");
    assert_eq!(call("POST", "/v1/jobs/j/pause", &o, None).0, 200);
    let (s, e) = call("GET", "/v1/jobs", &w, None);
    assert_eq!((s, code(&e)), (403, "forbidden"), "a worker credential cannot call the API");
    // A credential limited to a namespace sees and touches only it.
    assert_eq!(call("POST", "/v1/jobs", &t, Some(job("mine", Some("team-a")))).0, 201);
    let (s, e) = call("POST", "/v1/jobs", &t, Some(job("theirs", None)));
    assert_eq!((s, code(&e)), (403, "forbidden"));
    assert!(e["error"]["message"].as_str().unwrap().contains("may not use namespace \"default\""), "{e}");
    assert_eq!(call("GET", "/v1/jobs/j", &t, None).0, 403);
    assert_eq!(call("POST", "/v1/jobs/j/trigger", &t, None).0, 403);
    assert_eq!(job_names(&addr, &[("Authorization", &t)]), vec!["mine"]);
    let mut all = job_names(&addr, &[("Authorization", &a)]);
    all.sort();
    assert_eq!(all, vec!["j", "mine"]);
    let run_id = run["id"].as_str().unwrap();
    assert_eq!(call("GET", &format!("/v1/runs/{run_id}"), &t, None).0, 404, "another namespace's run does not exist for it");
    assert_eq!(call("POST", &format!("/v1/runs/{run_id}/cancel"), &t, None).0, 404);
    let (_, runs) = call("GET", "/v1/runs", &t, None);
    assert!(runs["runs"].as_array().unwrap().iter().all(|r| r["namespace"] == "team-a"), "{runs}");
    // Every write is audited with the credential's name.
    let log = server.log();
    assert!(log.contains("gnomon::audit") && log.contains("credential=admin-1") && log.contains("credential=operator-1"), "{log}");
    // Rotation: a new token for the viewer, the old one revoked, no restart.
    let (viewer2, e1b) = new_credential("viewer-1", &["--role", "viewer"]);
    std::fs::write(&file, [e1b.as_str(), &e2, &e3, &e4, &e5].join("\n\n")).unwrap();
    let v2 = bearer(&viewer2);
    wait_until("the rotated token to work", Duration::from_secs(30), || call("GET", "/v1/jobs", &v2, None).0 == 200);
    assert_eq!(call("GET", "/v1/jobs", &v, None).0, 401, "the old token is revoked");
    // A broken file keeps the credentials in force.
    std::fs::write(&file, "[[credential]]\nname = \"x\"\nrole = \"root\"\n").unwrap();
    wait_until("the bad file to be seen", Duration::from_secs(30), || server.log().contains("credentials not reloaded"));
    assert_eq!(call("GET", "/v1/jobs", &v2, None).0, 200);
}

#[test]
fn worker_credentials_open_only_worker_sessions_under_their_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, e1) = new_credential("pool-a", &["--role", "worker", "--worker-prefix", "pool-a-"]);
    let (viewer, e2) = new_credential("viewer-1", &["--role", "viewer"]);
    let (admin, e3) = new_credential("admin-1", &["--role", "admin"]);
    let (other, e4) = new_credential("pool-any", &["--role", "worker"]);
    let file = dir.path().join("auth.toml");
    std::fs::write(&file, [e1.as_str(), &e2, &e3, &e4].join("\n\n")).unwrap();
    let (_server, addr) = dev(dir.path(), "dev", &["--auth-file", file.to_str().unwrap(), "--capacity", "1"]);
    let spawn_worker = |name: &str, id: &str, token: &str| {
        let log = dir.path().join(format!("{name}.log"));
        let f = std::fs::File::create(&log).unwrap();
        let child = Command::new(BIN)
            .args(["worker", "--server", &addr, "--id", id, "--data-dir", dir.path().join(name).to_str().unwrap()])
            .env("GNOMON_TOKEN", token)
            .env("GNOMON_ALLOW_ROOT_JOBS", "1")
            .env("GNOMON_LOG", "info")
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        (Proc { child, log: log.clone() }, log)
    };
    let admin_h = bearer(&admin);
    let workers = || -> Vec<String> {
        req(&addr, "GET", "/v1/workers", &[("Authorization", &admin_h)], None).1["workers"]
            .as_array()
            .map(|a| a.iter().filter_map(|w| w["id"].as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    // The embedded worker has a credential of its own.
    wait_until("the embedded worker", Duration::from_secs(30), || workers().contains(&"dev-worker".to_string()));
    let (good, _) = spawn_worker("good", "pool-a-1", &worker);
    let (outside, outside_log) = spawn_worker("outside", "pool-b-1", &worker);
    let (wrong_role, wrong_log) = spawn_worker("wrong-role", "pool-a-2", &viewer);
    wait_until("pool-a-1 to connect", Duration::from_secs(30), || workers().contains(&"pool-a-1".to_string()));
    // Another credential cannot take a worker's id (it belongs to the
    // credential that first opened a session with it), not even while its
    // heartbeats are late (frozen for 5 s: more than two heartbeat
    // intervals).
    good.signal(SIGSTOP);
    std::thread::sleep(Duration::from_secs(5));
    let (thief, thief_log) = spawn_worker("thief", "pool-a-1", &other);
    wait_until("the takeover refusal", Duration::from_secs(30), || {
        std::fs::read_to_string(&thief_log).unwrap_or_default().contains("belongs to credential")
    });
    good.signal(SIGCONT);
    wait_until("the refusals", Duration::from_secs(30), || {
        std::fs::read_to_string(&outside_log).unwrap_or_default().contains("may only open sessions for worker ids starting with")
            && std::fs::read_to_string(&wrong_log).unwrap_or_default().contains("needs the worker role")
    });
    let w = workers();
    assert!(!w.contains(&"pool-b-1".to_string()) && !w.contains(&"pool-a-2".to_string()), "{w:?}");
    // A triggered run completes on a credentialed worker.
    let h = [JSON, ("Authorization", admin_h.as_str())];
    assert_eq!(req(&addr, "POST", "/v1/jobs", &h, Some(&job("j", None))).0, 201);
    let (_, run) = req(&addr, "POST", "/v1/jobs/j/trigger", &h, None);
    let id = run["id"].as_str().unwrap().to_string();
    wait_until("the run to succeed", Duration::from_secs(60), || {
        req(&addr, "GET", &format!("/v1/runs/{id}"), &h, None).1["state"] == "succeeded"
    });
    drop((good, outside, wrong_role, thief));
}

#[test]
fn weak_tokens_and_bad_credentials_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["dev", "--listen", &format!("127.0.0.1:{}", free_port()), "--data-dir", dir.path().join("d").to_str().unwrap()])
        .env("GNOMON_TOKEN", "short")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16"), "{}", String::from_utf8_lossy(&out.stderr));
    let bad = dir.path().join("auth.toml");
    std::fs::write(&bad, "[[credential]]\nname = \"x\"\nrole = \"boss\"\ntoken_sha256 = \"00\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["dev", "--listen", &format!("127.0.0.1:{}", free_port()), "--data-dir", dir.path().join("e").to_str().unwrap()])
        .args(["--auth-file", bad.to_str().unwrap()])
        .env_remove("GNOMON_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("auth.toml"), "{}", String::from_utf8_lossy(&out.stderr));
    // A store URL that cannot be used is never printed with its password.
    for url in ["admin:s3cretpw@db.example/gnomon", "ftp://admin:s3cretpw@db.example/gnomon", "etcd:/admin:s3cretpw@h:1"] {
        let out = Command::new(BIN).args(["server", "--store", url]).env_remove("GNOMON_TOKEN").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && !err.contains("s3cretpw") && (err.contains("db.example") || err.contains("h:1")), "{err}");
    }
    let out = Command::new(BIN).args(["auth", "new", "x", "--role", "boss"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--role"));
    let mut child = Command::new(BIN).args(["auth", "hash"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"0123456789abcdef\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim().len(), 64);
}
