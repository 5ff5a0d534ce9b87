//! The deployment files under `deploy/` stay true to the binary: every
//! `--flag` they pass to `gnomon server` or `gnomon worker` exists, every
//! `GNOMON_…` variable they set is one the binary reads, the YAML parses,
//! and the systemd units pass `systemd-analyze verify` where it is
//! installed.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::BIN;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn help(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).arg("--help").output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The `--long-flags` and `GNOMON_…` names in `text`.
fn names(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find(prefix) {
        let start = i + at;
        let mut end = start + prefix.len();
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'-' || bytes[end] == b'_') {
            end += 1;
        }
        let before_ok = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'-');
        let first_ok = bytes.get(start + prefix.len()).is_some_and(|b| b.is_ascii_alphanumeric());
        if before_ok && first_ok && end > start + prefix.len() {
            found.insert(text[start..end].to_string());
        }
        i = end;
    }
    found
}

#[test]
fn deployment_files_name_only_real_flags_and_variables() {
    let mut all = Vec::new();
    files(&deploy_dir(), &mut all);
    assert!(all.len() >= 8, "the deploy folder has its files: {all:?}");
    let known_flags: BTreeSet<String> = [help(&["server"]), help(&["worker"])].iter().flat_map(|h| names(h, "--")).collect();
    let known_env: BTreeSet<String> = [help(&["server"]), help(&["worker"])]
        .iter()
        .flat_map(|h| names(h, "GNOMON_"))
        // Set for the process itself (the log filter) rather than a flag.
        .chain(["GNOMON_LOG".to_string()])
        .collect();
    for file in &all {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        if name == "Dockerfile" {
            assert!(text.matches("FROM ").count() >= 2, "the Dockerfile is multi-stage");
        }
        // The lines that run gnomon: the image's command, the units'
        // ExecStart, and everything in the manifests and the compose file
        // (argument lists and the raft members' start script).
        let runs_gnomon = |line: &str| {
            let l = line.trim_start();
            if l.starts_with('#') {
                return false;
            }
            match name.as_str() {
                "Dockerfile" => l.starts_with("CMD"),
                n if n.ends_with(".service") => l.starts_with("ExecStart"),
                n => n.ends_with(".yaml") || n.ends_with(".yml"),
            }
        };
        for line in text.lines().filter(|l| runs_gnomon(l)) {
            for flag in names(line, "--") {
                assert!(known_flags.contains(&flag), "{}: {flag} is not a flag of gnomon server or worker", file.display());
            }
        }
        for var in names(&text, "GNOMON_") {
            assert!(known_env.contains(&var), "{}: {var} is not a variable gnomon reads", file.display());
        }
        if name.ends_with(".yaml") || name.ends_with(".yml") {
            for doc in text.split("\n---") {
                let parsed: Result<serde_json::Value, _> = serde_yaml_ng::from_str(doc);
                assert!(parsed.is_ok(), "{}: not YAML: {:?}", file.display(), parsed.err());
            }
        }
    }
    let analyze = Command::new("systemd-analyze").arg("--version").output();
    if analyze.is_ok_and(|o| o.status.success()) {
        for unit in all.iter().filter(|f| f.extension().is_some_and(|e| e == "service")) {
            let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(unit).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            // A unit is verified as it would run: the binary and the user
            // exist on a real host, not necessarily here.
            let real: Vec<&str> = err
                .lines()
                .filter(|l| {
                    !l.contains("/usr/local/bin/gnomon") && !l.contains("User=") && !l.contains("Group=") && !l.contains("EnvironmentFile")
                })
                .filter(|l| !l.trim().is_empty())
                .collect();
            assert!(real.is_empty(), "{}: systemd-analyze verify: {}", unit.display(), real.join("\n"));
        }
    } else {
        eprintln!("systemd-analyze is not installed here; the units' syntax is not verified");
    }
}

#[test]
fn completions_and_the_manual_page_are_generated() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(BIN).args(["completions", shell]).output().unwrap();
        assert!(out.status.success());
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("gnomon") && script.contains("trigger"), "{shell} completions name the commands");
    }
    let out = Command::new(BIN).args(["completions", "tcsh"]).output().unwrap();
    assert!(!out.status.success(), "an unknown shell is refused");
    let out = Command::new(BIN).arg("man").output().unwrap();
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && page.contains(".TH gnomon 1") && page.contains("completions"));
}
