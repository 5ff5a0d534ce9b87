//! What a shell job can reach of the process that runs it. A worker, a
//! server and `gnomon dev` are non-dumpable and take their secrets out of
//! their environment at start, so a job running as the same user cannot
//! read their `/proc/PID/environ`, `maps` or `mem`; as root without
//! `--run-as` they refuse to start unless `--allow-root-jobs`; with
//! `--run-as` a job cannot reach their data dir.
//!
//! The tests run as root, and root reads every process's `/proc` files, so
//! the processes whose secrets are at stake run here as an unprivileged
//! user (`nobody`), with their jobs as that same user.

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// The two halves of the token: a job searches for them joined, and only
/// the process under test ever holds them joined.
const HALVES: (&str, &str) = ("leakme-", "0123456789abcdef");
const NOTIFY_HALVES: (&str, &str) = ("notify-", "s3cret-of-the-team");

/// What a job reports of its parent (the process that started it): can it
/// read its environment, its memory map, its memory, and how often the
/// needle `$1$2` appears in them; and whether it can read its own (it is
/// dumpable: `execve` resets what its parent set).
const PEEK: &str = r#"
needle="$1$2"
echo "UID=$(id -u) PPID=$PPID"
if env_out=$(tr '\0' '\n' 2>/dev/null < /proc/$PPID/environ); then
  echo "ENVIRON:readable"
  echo "ENVHITS:$(printf '%s\n' "$env_out" | grep -c -- "$needle")"
else
  echo "ENVIRON:denied"
fi
if maps=$(cat /proc/$PPID/maps 2>/dev/null); then echo "MAPS:readable"; else echo "MAPS:denied"; fi
if (exec 3< /proc/$PPID/mem) 2>/dev/null; then echo "MEM:open"; else echo "MEM:denied"; fi
hits=$(printf '%s\n' "$maps" | while read -r range perms rest; do
  case "$perms" in rw*) ;; *) continue ;; esac
  s=$((0x${range%-*})); e=$((0x${range#*-}))
  [ $((e - s)) -gt 268435456 ] && continue
  dd if=/proc/$PPID/mem bs=65536 iflag=skip_bytes,count_bytes skip=$s count=$((e - s)) 2>/dev/null
done | grep -a -c -- "$needle")
echo "MEMHITS:${hits:-0}"
if cat /proc/self/environ >/dev/null 2>&1 && (exec 3< /proc/self/mem) 2>/dev/null; then echo "SELF:readable"; else echo "SELF:denied"; fi
"#;

/// An unprivileged user's uid and gid (`nobody`), or `None` with the reason
/// printed.
fn unprivileged() -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, "nobody"]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok().filter(|_| out.status.success())
    };
    // These tests start processes as another user: without root they
    // cannot run, and fail (CI runs as root).
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these tests start processes as another user, which needs root");
    match (id("-u"), id("-g")) {
        (Some(u), Some(g)) if u != 0 => Some((u, g)),
        _ => panic!("these tests need an unprivileged user 'nobody' on this machine"),
    }
}

/// A directory the user `uid` owns (0700).
fn owned_dir(parent: &Path, name: &str, (uid, gid): (u32, u32)) -> std::path::PathBuf {
    let d = parent.join(name);
    std::fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(uid), Some(gid)).unwrap();
    d
}

/// Creates a manual shell job that runs `sh -c script sh args…`, triggers
/// it and returns its finished attempt's output.
fn run_job(token: Option<&str>, addr: &str, name: &str, script: &str, args: &[&str]) -> String {
    let mut argv = vec!["-c".to_string(), script.to_string(), "sh".to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let job = json!({"name": name, "executor": {"shell": {"command": "sh", "args": argv}}});
    let (status, v) = http_as(token, addr, "POST", "/v1/jobs", Some(job.to_string().as_bytes())).unwrap();
    assert_eq!(status, 201, "{v}");
    let (status, v) = http_as(token, addr, "POST", &format!("/v1/jobs/{name}/trigger"), None).unwrap();
    assert_eq!(status, 201, "{v}");
    let run = v["id"].as_str().unwrap().to_string();
    let mut done = Value::Null;
    wait_until(&format!("run {run} to finish"), Duration::from_secs(120), || {
        done = http_as(token, addr, "GET", &format!("/v1/runs/{run}"), None).map(|(_, v)| v).unwrap_or(Value::Null);
        matches!(done["state"].as_str(), Some("succeeded" | "failed"))
    });
    done["attempts"][0]["output"].as_str().unwrap_or_default().to_string()
}

/// The value after `KEY:` in a [`PEEK`] report.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines().find_map(|l| l.strip_prefix(&format!("{key}:"))).unwrap_or_else(|| panic!("no {key} in:\n{out}"))
}

fn wait_ready(token: Option<&str>, addr: &str) {
    wait_until("the server to lead", Duration::from_secs(60), || {
        http_as(token, addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == json!(true)).unwrap_or(false)
    });
}

fn wait_worker(token: &str, addr: &str, id: &str) {
    wait_until(&format!("worker {id}"), Duration::from_secs(60), || {
        http_as(Some(token), addr, "GET", "/v1/workers", None)
            .map(|(_, v)| v["workers"].as_array().is_some_and(|a| a.iter().any(|w| w["id"] == id)))
            .unwrap_or(false)
    });
}

/// What `/proc/PID/environ` holds, read as root (which non-dumpable does
/// not stop).
fn environ_of(pid: i32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).unwrap()).replace('\0', "\n")
}

/// A worker started as `nobody` with its token in its environment: its
/// job, also `nobody`, reads nothing of the worker's environment or memory.
#[test]
fn a_job_cannot_read_its_workers_token() {
    let Some(user) = unprivileged() else { return };
    let dir = tempfile::tempdir().unwrap();
    // The worker's credential (the secret at stake) and an admin's.
    let token = format!("{}{}", HALVES.0, HALVES.1);
    let (admin, admin_entry) = new_credential("admin", &["--role", "admin"]);
    let worker_entry = format!(
        "[[credential]]\nname = \"pool\"\nrole = \"worker\"\ntoken_sha256 = \"{}\"\n",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()))
    );
    let auth_file = dir.path().join("auth.toml");
    std::fs::write(&auth_file, format!("{admin_entry}\n\n{worker_entry}")).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let store = format!("sqlite://{}", dir.path().join("srv").join("g.db").display());
    let args: Vec<String> = ["server", "--listen", &addr, "--store", &store, "--auth-file", auth_file.to_str().unwrap()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let _server = Proc::spawn(dir.path(), "server", &args);
    wait_ready(Some(&admin), &addr);
    let home = owned_dir(dir.path(), "nobody", user);
    let wargs: Vec<String> = ["--server", &addr, "worker", "--id", "w-nobody", "--data-dir", home.join("w").to_str().unwrap()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let worker = Proc::spawn_with(dir.path(), "worker", &wargs, &[], |c| {
        c.env("GNOMON_TOKEN", &token).uid(user.0).gid(user.1);
    });
    wait_worker(&admin, &addr, "w-nobody");

    let out = run_job(Some(&admin), &addr, "peek", PEEK, &[HALVES.0, HALVES.1]);
    assert!(out.contains(&format!("UID={} PPID={}", user.0, worker.pid())), "the job runs as nobody under the worker: {out}");
    assert_eq!(field(&out, "ENVIRON"), "denied", "{out}");
    assert_eq!(field(&out, "MAPS"), "denied", "{out}");
    assert_eq!(field(&out, "MEM"), "denied", "{out}");
    assert_eq!(field(&out, "MEMHITS"), "0", "{out}");
    assert_eq!(field(&out, "SELF"), "readable", "the job itself is dumpable again (reset at execve): {out}");
    assert!(!out.contains(&token), "{out}");
    assert!(
        worker.log().contains("shell jobs run as this process's user") && worker.log().contains("--run-as USER"),
        "the worker warns at start: {}",
        worker.log()
    );
}

/// `gnomon dev` as `nobody`, its admin token in a configuration file and a
/// notify secret in its environment: the embedded worker's job reads
/// neither, in the environment or in memory.
#[test]
fn an_embedded_worker_job_cannot_read_its_servers_secrets() {
    let Some(user) = unprivileged() else { return };
    let dir = tempfile::tempdir().unwrap();
    let token = format!("{}{}", HALVES.0, HALVES.1);
    let notify = format!("{}{}", NOTIFY_HALVES.0, NOTIFY_HALVES.1);
    let home = owned_dir(dir.path(), "nobody", user);
    let config = home.join("gnomon.toml");
    std::fs::write(&config, format!("token = \"{token}\"\n")).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> =
        ["--config", config.to_str().unwrap(), "dev", "--listen", &addr, "--data-dir", home.join("d").to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let dev = Proc::spawn_with(dir.path(), "dev", &args, &[("GNOMON_NOTIFY_SECRET_default__OPS".into(), notify.clone())], |c| {
        c.uid(user.0).gid(user.1);
    });
    wait_ready(Some(&token), &addr);

    let out = run_job(Some(&token), &addr, "peek-token", PEEK, &[HALVES.0, HALVES.1]);
    assert!(out.contains(&format!("UID={} PPID={}", user.0, dev.pid())), "the job runs as nobody under the server: {out}");
    assert_eq!((field(&out, "ENVIRON"), field(&out, "MAPS"), field(&out, "MEM")), ("denied", "denied", "denied"), "{out}");
    assert_eq!(field(&out, "MEMHITS"), "0", "{out}");
    assert_eq!(field(&out, "SELF"), "readable", "{out}");
    let out = run_job(Some(&token), &addr, "peek-notify", PEEK, &[NOTIFY_HALVES.0, NOTIFY_HALVES.1]);
    assert_eq!(field(&out, "ENVIRON"), "denied", "{out}");
    assert_eq!(field(&out, "MEMHITS"), "0", "{out}");
    assert!(!out.contains(&notify) && !out.contains(&token), "{out}");
}

/// Once started, the process's environment holds none of its secrets: not
/// in `/proc/PID/environ` (the block it started with, read here as root)
/// and not for anything it starts.
#[test]
fn secrets_leave_the_environment_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let token = format!("{}{}", HALVES.0, HALVES.1);
    let notify = format!("{}{}", NOTIFY_HALVES.0, NOTIFY_HALVES.1);
    let addr = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> =
        ["dev", "--listen", &addr, "--data-dir", dir.path().join("d").to_str().unwrap()].iter().map(|s| s.to_string()).collect();
    let dev = Proc::spawn_with(dir.path(), "dev", &args, &[("GNOMON_NOTIFY_SECRET_OPS".into(), notify.clone())], |c| {
        c.env("GNOMON_TOKEN", &token);
    });
    wait_ready(Some(&token), &addr);
    let env = environ_of(dev.pid());
    assert!(env.contains("GNOMON_LOG="), "the environment is read: {env}");
    assert!(!env.contains(&token) && !env.contains("GNOMON_TOKEN="), "{env}");
    assert!(!env.contains(&notify) && !env.contains("GNOMON_NOTIFY_SECRET_"), "{env}");
    // What a job inherits besides its allow-list: nothing of them either.
    let out = run_job(Some(&token), &addr, "env", "env", &[]);
    assert!(out.contains("GNOMON_RUN_ID=") && !out.contains(&token) && !out.contains(&notify), "{out}");

    // A server (its store URL in GNOMON_STORE) and a worker.
    let store = format!("sqlite://{}", dir.path().join("srv").join("g.db").display());
    let addr2 = format!("127.0.0.1:{}", free_port());
    let server = Proc::spawn_with(dir.path(), "server", &["server".into(), "--listen".into(), addr2.clone()], &[], |c| {
        c.env("GNOMON_STORE", &store).env("GNOMON_TOKEN", &token);
    });
    wait_ready(Some(&token), &addr2);
    let wargs: Vec<String> =
        ["--server", &addr2, "worker", "--data-dir", dir.path().join("w").to_str().unwrap()].iter().map(|s| s.to_string()).collect();
    let worker = Proc::spawn_with(dir.path(), "worker", &wargs, &[], |c| {
        c.env("GNOMON_TOKEN", &token);
    });
    wait_until("the worker to start", Duration::from_secs(30), || worker.log().contains("gnomon worker starting"));
    for (what, pid) in [("server", server.pid()), ("worker", worker.pid())] {
        let env = environ_of(pid);
        assert!(env.contains("GNOMON_LOG="), "{what}: {env}");
        assert!(!env.contains(&token) && !env.contains("GNOMON_TOKEN=") && !env.contains("GNOMON_STORE="), "{what}: {env}");
    }
}

/// As root, a worker, a server with an embedded worker and `gnomon dev`
/// refuse to run shell jobs without `--run-as` or `--allow-root-jobs`, and
/// create nothing; an HTTP-only worker starts.
#[test]
fn root_without_run_as_is_refused() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test checks what root may do: it needs root");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let listen = format!("127.0.0.1:{}", free_port());
    let store = format!("sqlite://{}", data.join("g.db").display());
    let cases: [&[&str]; 4] = [
        &["dev", "--listen", &listen, "--data-dir", data.to_str().unwrap()],
        &["server", "--listen", &listen, "--store", &store, "--capacity", "1"],
        &["--server", &listen, "worker", "--data-dir", data.to_str().unwrap()],
        &["--server", &listen, "worker", "--executors", "shell,http", "--data-dir", data.to_str().unwrap()],
    ];
    for (i, args) in cases.into_iter().enumerate() {
        let argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut p = Proc::spawn_with(dir.path(), &format!("refused-{i}"), &argv, &[], |c| {
            c.env_remove("GNOMON_ALLOW_ROOT_JOBS").env_remove("GNOMON_RUN_AS");
        });
        let status = p.wait_exit(Duration::from_secs(30));
        let err = p.log();
        assert!(status.is_some_and(|s| !s.success()), "{args:?} started: {err}");
        assert!(
            err.contains("refusing to run shell jobs as root") && err.contains("--run-as USER") && err.contains("--allow-root-jobs"),
            "{args:?}: {err}"
        );
        assert!(!data.exists(), "{args:?} created {}", data.display());
    }
    let out = Command::new(BIN).args(["--server", &listen, "worker", "--run-as", "no-such-user-here"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no such user"));
    // A worker that runs no command is not refused.
    let args: Vec<String> = ["--server", &listen, "worker", "--executors", "http,handler", "--data-dir", data.to_str().unwrap()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut w = Proc::spawn_with(dir.path(), "http-worker", &args, &[], |c| {
        c.env_remove("GNOMON_ALLOW_ROOT_JOBS");
    });
    wait_until("the HTTP-only worker to start", Duration::from_secs(30), || w.log().contains("gnomon worker starting"));
    assert!(w.wait_exit(Duration::from_millis(500)).is_none(), "{}", w.log());
}

/// `gnomon dev --run-as nobody` as root: jobs run as nobody, and the data
/// dir (the store, the worker's spool) and the server's `/proc` files are
/// out of their reach.
#[test]
fn run_as_keeps_the_data_dir_out_of_a_jobs_reach() {
    let Some(user) = unprivileged() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let addr = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> =
        ["dev", "--listen", &addr, "--data-dir", data.to_str().unwrap(), "--run-as", "nobody"].iter().map(|s| s.to_string()).collect();
    let dev = Proc::spawn_with(dir.path(), "dev", &args, &[], |c| {
        c.env_remove("GNOMON_ALLOW_ROOT_JOBS");
    });
    wait_ready(None, &addr);
    let d = data.display().to_string();
    let script = format!(
        "echo UID=$(id -u); ls {d} || echo LS:denied; head -c 15 {d}/gnomon.db || echo DB:denied; \
         ls {d}/worker-spool || echo SPOOL:denied; cat /proc/$PPID/environ >/dev/null || echo ENV:denied; \
         echo written > {d}/intruder || echo WRITE:denied; pwd; echo ok > ./mine && cat ./mine"
    );
    let out = run_job(None, &addr, "snoop", &script, &[]);
    assert!(out.contains(&format!("UID={}", user.0)), "{out}");
    for denied in ["LS:denied", "DB:denied", "SPOOL:denied", "ENV:denied", "WRITE:denied"] {
        assert!(out.contains(denied), "{denied}: {out}");
    }
    assert!(!out.contains("SQLite format"), "{out}");
    assert!(out.contains("\nok"), "the job has its own working directory: {out}");
    assert!(!data.join("intruder").exists());
    assert!(dev.log().contains("shell jobs run as nobody"), "{}", dev.log());
}
