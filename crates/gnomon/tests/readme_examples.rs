//! The README's worker examples run as written: each is taken from the
//! README, started against a real server (its address in
//! `GNOMON_SERVERS`, as the example reads it), and given the job the
//! README creates; a run with an image succeeds with the example's output,
//! one without fails at once without retries, and SIGTERM drains it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The first fenced block of `lang` in the README's handler section.
fn example(lang: &str) -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme.split("## Handlers in Python and TypeScript").nth(1).expect("the README's handler section");
    let start = section.find(&format!("```{lang}\n")).unwrap_or_else(|| panic!("a {lang} example")) + lang.len() + 4;
    let len = section[start..].find("```").unwrap();
    section[start..start + len].to_string()
}

/// The README's `curl` line's job, as the README writes it.
fn readme_job() -> Value {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let line = readme.lines().find(|l| l.starts_with("curl -s -XPOST 127.0.0.1:7400/v1/jobs -d '")).expect("the README's curl line");
    let body = line.split_once("-d '").unwrap().1.trim_end_matches('\'');
    serde_json::from_str(body).unwrap()
}

fn run_example(program: &str, args: &[String], dir: &Path) {
    let server_dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let store = format!("sqlite://{}/db.sqlite", server_dir.path().display());
    let _server = Proc::spawn(server_dir.path(), "server", &["server", "--store", &store, "--listen", &addr].map(String::from));
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == json!(true)).unwrap_or(false)
    });
    let (s, v) = http(&addr, "POST", "/v1/jobs", Some(readme_job().to_string().as_bytes())).unwrap();
    assert_eq!(s, 201, "{v}");
    let log = dir.join("example.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut example = Proc {
        child: Command::new(program)
            .args(args)
            .current_dir(dir)
            .env("GNOMON_SERVERS", &addr)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap(),
        log: log.clone(),
    };
    let trigger = |body: Value| {
        let (s, v) = http(&addr, "POST", "/v1/jobs/resize/trigger", Some(body.to_string().as_bytes())).unwrap();
        assert_eq!(s, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    let settled = |id: &str| {
        let mut run = Value::Null;
        wait_until(&format!("run {id} to end ({})", example.log()), Duration::from_secs(60), || {
            run = http(&addr, "GET", &format!("/v1/runs/{id}"), None).map(|(_, v)| v).unwrap_or(Value::Null);
            matches!(run["state"].as_str(), Some("succeeded" | "failed"))
        });
        run
    };
    let run = settled(&trigger(json!({"params": {"image": "cat.png"}})));
    assert_eq!(run["state"], "succeeded", "{run}");
    let out = run["attempts"][0]["output"].as_str().unwrap_or_default();
    assert!(out.contains("INFO resizing cat.png") && out.trim_end().ends_with("resized cat.png"), "{out:?}");
    let run = settled(&trigger(json!({"params": {"image": ""}})));
    assert_eq!((run["state"].as_str(), run["attempts"].as_array().map(Vec::len)), (Some("failed"), Some(1)), "{run}");
    assert!(run["attempts"][0]["output"].as_str().unwrap_or_default().contains("no image given"), "{run}");
    example.signal(SIGTERM);
    let status = example.wait_exit(Duration::from_secs(40)).unwrap_or_else(|| panic!("no exit after SIGTERM: {}", example.log()));
    assert!(status.success() || status.code().is_none(), "{status:?}: {}", example.log());
}

#[test]
fn the_python_example_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("example.py"), example("python")).unwrap();
    let python = repo().join("target/py-venv/bin/python");
    assert!(python.exists(), "run scripts/sdk.sh first (scripts/test.sh does)");
    run_example(python.to_str().unwrap(), &["example.py".into()], dir.path());
}

#[test]
fn the_typescript_example_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    // The package as `npm install ./sdk/typescript` would place it.
    std::fs::create_dir_all(dir.path().join("node_modules")).unwrap();
    std::os::unix::fs::symlink(repo().join("sdk/typescript"), dir.path().join("node_modules/gnomon-worker")).unwrap();
    assert!(repo().join("sdk/typescript/dist/index.js").exists(), "run scripts/sdk.sh first (scripts/test.sh does)");
    // Plain JavaScript is TypeScript: the example runs as an ES module.
    std::fs::write(dir.path().join("example.mjs"), example("ts")).unwrap();
    run_example("node", &["example.mjs".into()], dir.path());
}
