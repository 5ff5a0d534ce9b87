//! The configuration model: a file, then environment variables, then flags,
//! each overriding the one before; `config show` says where each value
//! comes from and hides secrets; a bad file is refused before anything
//! starts, naming the setting.

mod common;

use std::path::Path;
use std::process::Command;

use common::BIN;
use serde_json::Value;

fn show(file: &Path, env: &[(&str, &str)], flags: &[&str]) -> Value {
    let mut c = Command::new(BIN);
    c.env_remove("GNOMON_TOKEN").env_remove("GNOMON_STORE").env_remove("GNOMON_RETAIN_FOR").env_remove("GNOMON_RETAIN_RUNS");
    c.args(["--config", file.to_str().unwrap(), "-o", "json", "config", "show", "server", "--"]).args(flags).envs(env.iter().copied());
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn setting<'a>(v: &'a Value, name: &str) -> (&'a str, &'a str) {
    let s = v["settings"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no {name} in {v}"));
    (s["value"].as_str().unwrap(), s["source"].as_str().unwrap())
}

#[test]
fn file_then_environment_then_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("g.toml");
    std::fs::write(
        &file,
        "token = \"file-token-0123456789abcdef\"\n[server]\nstore = \"postgres://gnomon:hunter2@db:5432/g\"\nretain-for = \"2d\"\nretain_runs = 50\n[worker]\ncapacity = 3\n",
    )
    .unwrap();
    let v = show(&file, &[], &[]);
    assert_eq!(setting(&v, "retain-for"), ("2d", "file"));
    assert_eq!(setting(&v, "retain-runs"), ("50", "file"));
    assert_eq!(setting(&v, "misfire-grace"), ("1s", "default"));
    assert_eq!(setting(&v, "capacity"), ("0", "default"), "[worker] does not apply to server");
    assert_eq!(setting(&v, "token"), ("(set, hidden)", "file"));
    assert_eq!(setting(&v, "store"), ("postgres://gnomon:***@db:5432/g", "file"));
    assert!(!v.to_string().contains("hunter2") && !v.to_string().contains("file-token"), "secrets are hidden: {v}");
    let v = show(&file, &[("GNOMON_RETAIN_FOR", "3d")], &[]);
    assert_eq!(setting(&v, "retain-for"), ("3d", "env"));
    let v = show(&file, &[("GNOMON_RETAIN_FOR", "3d")], &["--retain-for", "4d"]);
    assert_eq!(setting(&v, "retain-for"), ("4d", "flag"));
    // The example file in the repository is valid.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/gnomon.toml");
    let v = show(&example, &[], &[]);
    assert_eq!(setting(&v, "retain-for"), ("7d", "file"));
}

#[test]
fn a_bad_file_is_refused_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[server]\nretain-four = \"1d\"\n", "unknown setting \"retain-four\""),
        ("[server]\nretain-for = \"1 fortnight\"\n", "--retain-for"),
        ("[server]\nelection = \"zookeeper\"\n", "possible values"),
        ("[sever]\nstore = \"x\"\n", "unknown table [sever]"),
        ("[server]\nlisten = [1, 2]\n", "takes one value"),
        ("this is = not toml =\n", "not TOML"),
    ];
    for (text, says) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text).unwrap();
        let store = dir.path().join("s.db");
        let url = format!("sqlite://{}", store.display());
        let out = Command::new(BIN)
            .env_remove("GNOMON_STORE")
            .args(["--config", file.to_str().unwrap(), "server", "--listen", "127.0.0.1:1", "--store", &url])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{text:?} should say {says:?}: {err}");
        assert!(!store.exists(), "{text:?}: nothing is created");
    }
    let out = Command::new(BIN).args(["--config", "/nonexistent/g.toml", "server"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("/nonexistent/g.toml"));
}
