//! Namespaces on one worker keep apart: with `--run-as-range` each
//! namespace's shell jobs run as a uid of their own, so a job cannot read
//! another namespace's params file, working directory or process
//! environment; the allocation survives a restart and a used-up range
//! fails the attempt. The attempts' directories are never made through a
//! link planted where they go.
//!
//! These tests switch users, which needs root: without it they fail.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// The uids the worker here may give out: two, for two namespaces.
const RANGE: (u32, u32) = (920_000, 920_001);

fn must_be_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these tests start jobs as other users, which needs root: run them as root");
}

/// A job of `namespace` that meets its peer (`other`) in `meet`: it says
/// who it runs as, publishes its pid, working directory and params file,
/// waits for the peer's, tries to read them and the peer's environment
/// while the peer still runs, then waits for the peer to be done.
const PROBE: &str = r#"
me=$1; other=$2; meet=$3
echo "ID=$(id -u):$(id -g):$(id -G)"
printf '%s\n%s\n%s\n' "$$" "$(pwd)" "$GNOMON_PARAMS_FILE" > "$meet/$me.tmp" && mv "$meet/$me.tmp" "$meet/$me.info"
if grep -q "$me-params-secret" "$GNOMON_PARAMS_FILE"; then echo "OWN_PARAMS:readable"; fi
if tr '\0' '\n' < /proc/$$/environ | grep -q "^TENANT_SECRET=$me-env-secret"; then echo "OWN_ENVIRON:readable"; fi
i=0; while [ ! -f "$meet/$other.info" ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done
{ read -r opid; read -r odir; read -r oparams; } < "$meet/$other.info"
echo "PEER=$opid $odir $oparams"
if [ -d "/proc/$opid" ]; then echo "PEER:alive"; fi
if cat "$oparams" > /dev/null 2>&1; then echo "PARAMS:readable"; else echo "PARAMS:denied"; fi
if ls "$odir" > /dev/null 2>&1; then echo "WORKDIR:listable"; else echo "WORKDIR:denied"; fi
if touch "$odir/intruder" 2> /dev/null; then echo "WRITE:done"; else echo "WRITE:denied"; fi
if tr '\0' '\n' < "/proc/$opid/environ" > /dev/null 2>&1; then echo "ENVIRON:readable"; else echo "ENVIRON:denied"; fi
if tr '\0' '\n' < "/proc/$opid/environ" 2> /dev/null | grep -q "$other-env-secret"; then echo "ENVIRON:leaked"; fi
touch "$meet/$me.done"
i=0; while [ ! -f "$meet/$other.done" ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done
echo END
"#;

fn post(addr: &str, path: &str, body: &Value) -> Value {
    let (status, v) = http(addr, "POST", path, Some(body.to_string().as_bytes())).unwrap();
    assert!(status == 201 || status == 200, "{path}: {status} {v}");
    v
}

/// Creates the shell job `name` in `namespace` running `sh -c script sh
/// args…`, with a params secret and an environment secret of the
/// namespace, and triggers it: the run's id.
fn start(addr: &str, namespace: &str, name: &str, script: &str, args: &[&str]) -> String {
    let mut argv = vec!["-c".to_string(), script.to_string(), "sh".to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let job = json!({
        "name": name, "namespace": namespace,
        "params": {"secret": {"default": format!("{namespace}-params-secret")}},
        "executor": {"shell": {"command": "sh", "args": argv, "env": {"TENANT_SECRET": format!("{namespace}-env-secret")}}},
        "timeout": "3m",
    });
    let (status, v) = http(addr, "PUT", &format!("/v1/jobs/{name}?namespace={namespace}"), Some(job.to_string().as_bytes())).unwrap();
    assert!(status == 200 || status == 201, "{status} {v}");
    let run = post(addr, &format!("/v1/jobs/{name}/trigger?namespace={namespace}"), &json!({}));
    run["id"].as_str().unwrap().to_string()
}

/// Waits for the run to end: its state and its first attempt's output.
fn finish(addr: &str, run: &str) -> (String, String) {
    let mut done = Value::Null;
    wait_until(&format!("run {run} to finish"), Duration::from_secs(240), || {
        done = http(addr, "GET", &format!("/v1/runs/{run}"), None).map(|(_, v)| v).unwrap_or(Value::Null);
        matches!(done["state"].as_str(), Some("succeeded" | "failed" | "timed_out"))
    });
    (done["state"].as_str().unwrap().to_string(), done["attempts"][0]["output"].as_str().unwrap_or_default().to_string())
}

fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key} in:\n{out}"))
}

fn ready(addr: &str) {
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == json!(true)).unwrap_or(false)
    });
}

fn worker_up(addr: &str, id: &str) {
    wait_until(&format!("worker {id}"), Duration::from_secs(60), || {
        http(addr, "GET", "/v1/workers", None)
            .map(|(_, v)| v["workers"].as_array().is_some_and(|a| a.iter().any(|w| w["id"] == id && w["state"] == "live")))
            .unwrap_or(false)
    });
}

fn worker(dir: &Path, name: &str, addr: &str, data: &Path) -> Proc {
    let range = format!("{}-{}", RANGE.0, RANGE.1);
    let args: Vec<String> = [
        "--server",
        addr,
        "worker",
        "--id",
        "w-tenants",
        "--capacity",
        "4",
        "--data-dir",
        data.to_str().unwrap(),
        "--run-as-range",
        &range,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Proc::spawn_with(dir, name, &args, &[], |c| {
        c.env_remove("GNOMON_ALLOW_ROOT_JOBS");
    })
}

#[test]
fn two_namespaces_on_one_worker_cannot_read_each_others_files_or_environment() {
    must_be_root();
    let dir = tempfile::tempdir().unwrap();
    // The jobs reach their own files by path, and meet in a sticky directory.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let meet = dir.path().join("meet");
    std::fs::create_dir(&meet).unwrap();
    std::fs::set_permissions(&meet, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let store = format!("sqlite://{}", dir.path().join("srv").join("g.db").display());
    let args: Vec<String> = ["server", "--listen", &addr, "--store", &store].iter().map(|s| s.to_string()).collect();
    let _server = Proc::spawn(dir.path(), "server", &args);
    ready(&addr);
    let data = dir.path().join("w");
    let mut w = worker(dir.path(), "worker", &addr, &data);
    worker_up(&addr, "w-tenants");
    assert!(w.log().contains("each namespace's shell jobs run as a uid of its own"), "{}", w.log());

    let meet_s = meet.to_str().unwrap();
    let a = start(&addr, "alpha", "probe", PROBE, &["alpha", "beta", meet_s]);
    let b = start(&addr, "beta", "probe", PROBE, &["beta", "alpha", meet_s]);
    let (sa, out_a) = finish(&addr, &a);
    let (sb, out_b) = finish(&addr, &b);
    assert_eq!((sa.as_str(), sb.as_str()), ("succeeded", "succeeded"), "alpha:\n{out_a}\nbeta:\n{out_b}\nworker:\n{}", w.log());
    let mut uids = Vec::new();
    for (ns, out) in [("alpha", &out_a), ("beta", &out_b)] {
        let id = field(out, "ID=");
        let uid: u32 = id.split(':').next().unwrap().parse().unwrap();
        assert!((RANGE.0..=RANGE.1).contains(&uid), "{ns} runs as a uid of the range: {out}");
        assert_eq!(id, format!("{uid}:{uid}:{uid}"), "{ns}: its group is the same id, and it has no other: {out}");
        uids.push(uid);
        assert!(out.contains("OWN_PARAMS:readable") && out.contains("OWN_ENVIRON:readable"), "{ns} reads its own: {out}");
        assert!(out.contains("PEER:alive"), "{ns} probed while its peer ran: {out}");
        for denied in ["PARAMS:denied", "WORKDIR:denied", "WRITE:denied", "ENVIRON:denied"] {
            assert!(out.contains(denied), "{ns}: {denied}:\n{out}");
        }
        assert!(!out.contains("ENVIRON:leaked") && !out.contains("-params-secret"), "{ns}: {out}");
        assert!(out.contains("END"), "{out}");
    }
    assert_ne!(uids[0], uids[1], "each namespace has its own uid");
    // The allocation on disk says the same, privately.
    let file = data.join("uids.json");
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(stored["namespaces"], json!({"alpha": uids[0], "beta": uids[1]}), "{stored}");
    let m = std::fs::metadata(&file).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600));
    // Nothing was left in the peers' directories (removed after the runs).
    let intruders: Vec<_> = walk(&data.join("work")).into_iter().filter(|p| p.ends_with("intruder")).collect();
    assert!(intruders.is_empty(), "{intruders:?}");

    // The range is used up: a third namespace's attempt fails, saying why,
    // and runs nothing as anyone.
    let c = start(&addr, "gamma", "probe", "id -u; echo RAN", &[]);
    let (sc, out_c) = finish(&addr, &c);
    assert_eq!(sc, "failed", "{out_c}");
    assert!(out_c.contains("no uid left for namespace \"gamma\"") && !out_c.contains("RAN"), "{out_c}");

    // A second process on the same data dir is refused; a restart keeps
    // every namespace's uid.
    let mut second = worker(dir.path(), "worker-2", &addr, &data);
    assert!(second.wait_exit(Duration::from_secs(30)).is_some_and(|s| !s.success()), "{}", second.log());
    assert!(second.log().contains("in use by another gnomon process"), "{}", second.log());
    w.signal(SIGTERM);
    assert!(w.wait_exit(Duration::from_secs(60)).is_some(), "the worker stops on SIGTERM");
    let _w = worker(dir.path(), "worker-3", &addr, &data);
    worker_up(&addr, "w-tenants");
    for (i, ns) in ["alpha", "beta"].into_iter().enumerate() {
        let run = start(&addr, ns, "again", "id -u", &[]);
        let (state, out) = finish(&addr, &run);
        assert_eq!((state.as_str(), out.trim()), ("succeeded", uids[i].to_string().as_str()), "{ns} keeps its uid");
    }
}

/// Every path under `dir` (as root).
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// A link planted where the embedded worker's working directories go
/// stops `gnomon dev` at start; what it points to is left as it was.
#[test]
fn a_link_planted_at_the_work_directory_is_refused_and_its_target_untouched() {
    must_be_root();
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(victim.join("secret"), "theirs").unwrap();
    let range = format!("{}-{}", RANGE.0, RANGE.1);
    for (i, users) in [vec!["--run-as", "nobody"], vec!["--run-as-range", &range]].into_iter().enumerate() {
        let data = dir.path().join(format!("d{i}"));
        std::fs::create_dir(&data).unwrap();
        std::os::unix::fs::symlink(&victim, data.join("worker-work")).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let mut args: Vec<String> =
            ["dev", "--listen", &addr, "--data-dir", data.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
        args.extend(users.iter().map(|s| s.to_string()));
        let mut dev = Proc::spawn_with(dir.path(), &format!("dev-{i}"), &args, &[], |c| {
            c.env_remove("GNOMON_ALLOW_ROOT_JOBS");
        });
        let status = dev.wait_exit(Duration::from_secs(30));
        assert!(status.is_some_and(|s| !s.success()), "{users:?}: {}", dev.log());
        assert!(dev.log().contains("symbolic link"), "{users:?}: {}", dev.log());
        let m = std::fs::metadata(&victim).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o700), "{users:?}: the link's target keeps its owner and mode");
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 1, "nothing was made in it");
    }
}

/// `--run-as-range` is checked where it is parsed: a bad range, one holding
/// root or a user of this host, or one given with `--run-as`, is refused
/// before anything is created.
#[test]
fn a_bad_run_as_range_is_refused_with_a_message() {
    must_be_root();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = data.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["worker", "--data-dir", d, "--run-as-range", "0-100"], "uid 0, which is root"),
        (&["worker", "--data-dir", d, "--run-as-range", "500-400"], "FIRST (500) is above LAST (400)"),
        (&["worker", "--data-dir", d, "--run-as-range", "lots"], "not FIRST-LAST"),
        (&["worker", "--data-dir", d, "--run-as-range", "65534-65534"], "/etc/passwd"),
        (&["worker", "--data-dir", d, "--run-as-range", "920000-920001", "--run-as", "nobody"], "cannot be used with"),
        (&["dev", "--data-dir", d, "--run-as-range", "920000-920001", "--run-as", "nobody"], "cannot be used with"),
    ];
    for (args, want) in cases {
        let out = Command::new(BIN).args(["--server", "127.0.0.1:1"]).args(args).env_remove("GNOMON_ALLOW_ROOT_JOBS").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
        assert!(!data.exists(), "{args:?} created {}", data.display());
    }
    // On a server, the range goes with --capacity and a data dir for it.
    let store = format!("sqlite://{}", data.join("g.db").display());
    for (extra, want) in [
        (vec!["--run-as-range", "920000-920001"], "give --capacity N too"),
        (vec!["--capacity", "1", "--run-as-range", "920000-920001"], "give --worker-data-dir DIR"),
    ] {
        let out = Command::new(BIN)
            .args(["server", "--listen", "127.0.0.1:1", "--store", &store])
            .args(&extra)
            .env_remove("GNOMON_ALLOW_ROOT_JOBS")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{extra:?}: {err}");
        assert!(!data.exists(), "{extra:?} created {}", data.display());
    }
}

/// `gnomon dev` and `gnomon server --capacity N --worker-data-dir DIR`
/// give their embedded worker's jobs a namespace's uid too, kept in their
/// data dir.
#[test]
fn embedded_workers_run_each_namespace_as_its_uid() {
    must_be_root();
    let dir = tempfile::tempdir().unwrap();
    let range = format!("{}-{}", RANGE.0, RANGE.1);
    let (dev_data, worker_data) = (dir.path().join("dev"), dir.path().join("embedded"));
    let store = format!("sqlite://{}", dir.path().join("srv").join("g.db").display());
    let cases: [(Vec<&str>, &Path); 2] = [
        (vec!["dev", "--data-dir", dev_data.to_str().unwrap()], &dev_data),
        (vec!["server", "--store", &store, "--capacity", "2", "--worker-data-dir", worker_data.to_str().unwrap()], &worker_data),
    ];
    for (i, (args, data)) in cases.into_iter().enumerate() {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        argv.extend(["--listen".to_string(), addr.clone(), "--run-as-range".to_string(), range.clone()]);
        let _p = Proc::spawn_with(dir.path(), &format!("embedded-{i}"), &argv, &[], |c| {
            c.env_remove("GNOMON_ALLOW_ROOT_JOBS");
        });
        ready(&addr);
        let mut seen = Vec::new();
        for ns in ["alpha", "beta"] {
            let run = start(&addr, ns, "who", "id -u; id -G", &[]);
            let (state, out) = finish(&addr, &run);
            assert_eq!(state, "succeeded", "{args:?} {ns}: {out}");
            let uid: u32 = out.lines().next().unwrap().parse().unwrap();
            assert!((RANGE.0..=RANGE.1).contains(&uid) && out.lines().nth(1) == Some(uid.to_string().as_str()), "{args:?} {ns}: {out}");
            seen.push(uid);
        }
        assert_ne!(seen[0], seen[1], "{args:?}");
        let stored: Value = serde_json::from_str(&std::fs::read_to_string(data.join("uids.json")).unwrap()).unwrap();
        assert_eq!(stored["namespaces"], json!({"alpha": seen[0], "beta": seen[1]}), "{args:?}");
    }
}

/// A job's own `cwd` is entered as the job's user, never with the
/// worker's (root's) rights: with `--run-as` and with `--run-as-range`, a
/// directory only root may enter fails the attempt, saying so, and its
/// command never runs; one the job's user may enter is its working
/// directory.
#[test]
fn a_jobs_cwd_is_entered_as_its_user() {
    must_be_root();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (closed, open, marks) = (base.join("closed"), base.join("open"), base.join("marks"));
    for (d, mode) in [(&closed, 0o700), (&open, 0o755), (&marks, 0o1777)] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let range = format!("{}-{}", RANGE.0, RANGE.1);
    for (i, users) in [vec!["--run-as", "nobody"], vec!["--run-as-range", &range]].into_iter().enumerate() {
        let data = base.join(format!("d{i}"));
        let addr = format!("127.0.0.1:{}", free_port());
        let mut args: Vec<String> =
            ["dev", "--listen", &addr, "--data-dir", data.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
        args.extend(users.iter().map(|s| s.to_string()));
        let _dev = Proc::spawn_with(base, &format!("dev-{i}"), &args, &[], |c| {
            c.env_remove("GNOMON_ALLOW_ROOT_JOBS");
        });
        ready(&addr);
        for (name, cwd) in [("closed", &closed), ("open", &open)] {
            let mark = marks.join(format!("{i}-{name}"));
            let script = format!("touch {}; echo UID=$(id -u) PWD=$(pwd)", mark.display());
            let job = json!({"name": name, "retry": {"max_attempts": 1},
                             "executor": {"shell": {"command": "sh", "args": ["-c", script], "cwd": cwd.display().to_string()}}});
            post(&addr, "/v1/jobs", &job);
            let run = post(&addr, &format!("/v1/jobs/{name}/trigger"), &json!({}));
            let (state, out) = finish(&addr, run["id"].as_str().unwrap());
            if name == "closed" {
                assert_eq!(state, "failed", "{users:?}: {out}");
                assert!(out.contains("cannot enter the job's working directory") && out.contains("Permission denied"), "{users:?}: {out}");
                assert!(!mark.exists(), "{users:?}: the command never ran: {out}");
            } else {
                assert_eq!(state, "succeeded", "{users:?}: {out}");
                assert!(mark.exists() && out.contains(&format!("PWD={}", open.display())), "{users:?}: {out}");
                assert!(!out.contains("UID=0 "), "{users:?}: {out}");
            }
        }
    }
}
