//! The worker implementations the conformance cases run against, each
//! its conformance program (the standard handlers) started as a process.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::common::{Proc, BIN};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sdk {
    Rust,
    Python,
    TypeScript,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository")
}

/// Builds the Rust conformance worker once per test process.
static RUST_BUILT: Mutex<bool> = Mutex::new(false);

impl Sdk {
    /// The label its workers carry and its jobs are routed to.
    pub fn label(self) -> &'static str {
        match self {
            Sdk::Rust => "rust",
            Sdk::Python => "python",
            Sdk::TypeScript => "typescript",
        }
    }

    /// The program and its leading arguments.
    fn command(self) -> (PathBuf, Vec<String>) {
        let missing = |what: &Path| -> ! {
            panic!("{} is missing: run scripts/sdk.sh (scripts/test.sh runs it) to prepare the SDK workers", what.display())
        };
        match self {
            Sdk::Rust => {
                let bin = Path::new(BIN).parent().expect("target dir").join("examples/conformance");
                let mut built = RUST_BUILT.lock().unwrap_or_else(|p| p.into_inner());
                if !*built {
                    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
                    let status = Command::new(cargo)
                        .args(["build", "-q", "-p", "gnomon-worker", "--example", "conformance"])
                        .current_dir(repo())
                        .status()
                        .expect("cargo");
                    assert!(status.success(), "building the Rust conformance worker");
                    *built = true;
                }
                (bin, vec![])
            }
            Sdk::Python => {
                let python = repo().join("target/py-venv/bin/python");
                if !python.exists() {
                    missing(&python);
                }
                (python, vec!["-m".into(), "gnomon_worker.conformance".into()])
            }
            Sdk::TypeScript => {
                let script = repo().join("sdk/typescript/dist/conformance.js");
                if !script.exists() {
                    missing(&script);
                }
                ("node".into(), vec![script.display().to_string()])
            }
        }
    }

    /// Starts a conformance worker `id` for `servers`, labelled
    /// `sdk=<label>`, its output in `<dir>/<id>.log`.
    pub fn spawn(self, dir: &Path, id: &str, servers: &[String], env: &[(&str, String)]) -> Proc {
        self.spawn_with(dir, id, servers, env, &[])
    }

    /// As [`Sdk::spawn`], with more flags (`--token`).
    pub fn spawn_with(self, dir: &Path, id: &str, servers: &[String], env: &[(&str, String)], extra: &[String]) -> Proc {
        let (program, mut args) = self.command();
        args.extend(["--server".into(), servers.join(","), "--id".into(), id.into(), "--capacity".into(), "4".into()]);
        args.extend(["--label".into(), format!("sdk={}", self.label())]);
        args.extend(["--spool".into(), dir.join(format!("{id}-spool")).display().to_string()]);
        args.extend(extra.iter().cloned());
        let log = dir.join(format!("{id}.log"));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let child = Command::new(program)
            .args(&args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting the {self:?} conformance worker: {e}"));
        Proc { child, log }
    }
}
