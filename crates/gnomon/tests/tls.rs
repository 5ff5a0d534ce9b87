//! TLS on the one listener: the CLI and workers over https:// with a CA,
//! certificate reload without a restart, mutual TLS for workers, and the
//! non-loopback rule (credentials and TLS, or --insecure).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use serde_json::Value;

const TOKEN: &str = "tls-test-token-0123456789";

/// A CA that signs certificates into files under `dir`.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: PathBuf,
}

impl Ca {
    fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, format!("{name} test CA"));
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let pem = dir.join(format!("{name}.pem"));
        std::fs::write(&pem, cert.pem()).unwrap();
        Ca { issuer: Issuer::new(params, key), pem }
    }

    /// A leaf for localhost and 127.0.0.1, good for servers and clients:
    /// (cert, key) paths.
    fn leaf(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

fn dev(dir: &Path, extra: &[String]) -> (Proc, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args: Vec<String> = ["dev", "--listen", &addr, "--data-dir", dir.join("dev").to_str().unwrap()].map(String::from).to_vec();
    args.extend(["--token".into(), TOKEN.into()]);
    args.extend(extra.iter().cloned());
    (Proc::spawn(dir, "dev", &args), addr)
}

/// `gnomon --server URL --ca CA --token T …` → (exit ok, stdout JSON, stderr).
fn cli(url: &str, ca: Option<&Path>, args: &[&str]) -> (bool, Value, String) {
    let mut c = Command::new(BIN);
    c.args(["--server", url, "--token", TOKEN, "-o", "json"]);
    if let Some(ca) = ca {
        c.arg("--ca").arg(ca);
    }
    let out = c.args(args).env_remove("GNOMON_TOKEN").output().unwrap();
    (out.status.success(), serde_json::from_slice(&out.stdout).unwrap_or(Value::Null), String::from_utf8_lossy(&out.stderr).to_string())
}

fn worker_ids(url: &str, ca: &Path) -> Vec<String> {
    cli(url, Some(ca), &["worker", "list"]).1["workers"]
        .as_array()
        .map(|a| a.iter().filter_map(|w| w["id"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// The worker credential the server derives from its admin token, as
/// `gnomon auth derive worker` prints it (the admin token itself opens no
/// worker session).
fn worker_token() -> String {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .args(["auth", "derive", "worker"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(TOKEN.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(token.len() == 64 && token != TOKEN, "{token}");
    token
}

fn spawn_worker(dir: &Path, name: &str, url: &str, extra: &[&str]) -> Proc {
    let mut args: Vec<String> = vec!["--server".into(), url.into(), "worker".into(), "--id".into(), name.into()];
    args.extend(["--data-dir".into(), dir.join(name).display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let log = dir.join(format!("{name}.log"));
    let f = std::fs::File::create(&log).unwrap();
    let child = Command::new(BIN)
        .args(&args)
        .env("GNOMON_TOKEN", worker_token())
        .env("GNOMON_ALLOW_ROOT_JOBS", "1")
        .env("GNOMON_LOG", "info")
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap();
    Proc { child, log }
}

#[test]
fn the_api_and_workers_speak_tls_and_a_renewed_certificate_needs_no_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new(d, "ca");
    let (cert, key) = ca.leaf(d, "server");
    let (_server, addr) = dev(d, &["--tls-cert".into(), cert.display().to_string(), "--tls-key".into(), key.display().to_string()]);
    let url = format!("https://{addr}");
    wait_until("the TLS API", Duration::from_secs(60), || cli(&url, Some(&ca.pem), &["leader"]).0);
    // Without the CA the certificate is not trusted; plain HTTP gets no answer.
    let (ok, _, err) = cli(&url, None, &["leader"]);
    assert!(!ok && err.contains("cannot reach"), "{err}");
    assert!(!cli(&format!("http://{addr}"), None, &["leader"]).0);
    // The embedded worker dialled its own listener over TLS; so does an
    // external one.
    wait_until("the embedded worker", Duration::from_secs(30), || worker_ids(&url, &ca.pem).contains(&"dev-worker".to_string()));
    let _w = spawn_worker(d, "ext-1", &url, &["--capacity", "1", "--ca", ca.pem.to_str().unwrap()]);
    wait_until("the external worker", Duration::from_secs(30), || worker_ids(&url, &ca.pem).contains(&"ext-1".to_string()));
    // A run goes end to end.
    assert!(cli(&url, Some(&ca.pem), &["job", "create", "t", "--every", "1h", "--", "true"]).0);
    let (ok, run, err) = cli(&url, Some(&ca.pem), &["job", "trigger", "t"]);
    assert!(ok, "{err}");
    let id = run["id"].as_str().unwrap().to_string();
    wait_until("the run", Duration::from_secs(60), || cli(&url, Some(&ca.pem), &["run", "get", &id]).1["state"] == "succeeded");
    // Renewal: a certificate from another CA replaces the files; clients
    // that trust only the new CA are served without a restart.
    let ca2 = Ca::new(d, "ca2");
    let (cert2, key2) = ca2.leaf(d, "server2");
    std::fs::write(&key, std::fs::read(&key2).unwrap()).unwrap();
    std::fs::write(&cert, std::fs::read(&cert2).unwrap()).unwrap();
    wait_until("the renewed certificate", Duration::from_secs(30), || cli(&url, Some(&ca2.pem), &["leader"]).0);
    assert!(!cli(&url, Some(&ca.pem), &["leader"]).0, "the old certificate is gone");
}

#[test]
fn mutual_tls_admits_only_workers_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new(d, "ca");
    let (cert, key) = ca.leaf(d, "server");
    let (ccert, ckey) = ca.leaf(d, "client");
    let (_server, addr) = dev(
        d,
        &[
            "--tls-cert".into(),
            cert.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
            "--client-ca".into(),
            ca.pem.display().to_string(),
        ],
    );
    let url = format!("https://{addr}");
    wait_until("the TLS API", Duration::from_secs(60), || cli(&url, Some(&ca.pem), &["leader"]).0);
    // API clients need no certificate; the embedded worker presents the server's.
    wait_until("the embedded worker", Duration::from_secs(30), || worker_ids(&url, &ca.pem).contains(&"dev-worker".to_string()));
    let ca_s = ca.pem.display().to_string();
    let bare = spawn_worker(d, "bare-1", &url, &["--ca", &ca_s]);
    let _with =
        spawn_worker(d, "cert-1", &url, &["--ca", &ca_s, "--tls-cert", ccert.to_str().unwrap(), "--tls-key", ckey.to_str().unwrap()]);
    wait_until("the worker with a certificate", Duration::from_secs(30), || worker_ids(&url, &ca.pem).contains(&"cert-1".to_string()));
    wait_until("the refusal", Duration::from_secs(30), || bare.log().contains("requires workers to present a TLS client certificate"));
    assert!(!worker_ids(&url, &ca.pem).contains(&"bare-1".to_string()));
}

#[test]
fn a_public_listener_needs_credentials_and_tls() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).env_remove("GNOMON_TOKEN").output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let data = dir.path().join("d").display().to_string();
    let listen = format!("0.0.0.0:{}", free_port());
    let (ok, err) = run(&["dev", "--listen", &listen, "--data-dir", &data, "--token", TOKEN]);
    assert!(!ok && err.contains("TLS is off"), "{err}");
    let (ok, err) = run(&["dev", "--listen", &listen, "--data-dir", &data]);
    assert!(!ok && err.contains("no credentials"), "{err}");
    let ca = Ca::new(dir.path(), "ca");
    let (cert, _) = ca.leaf(dir.path(), "server");
    let (_, other_key) = ca.leaf(dir.path(), "other");
    let (ok, err) = run(&[
        "dev",
        "--listen",
        "127.0.0.1:1",
        "--data-dir",
        &data,
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        other_key.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("do not belong together"), "{err}");
}
