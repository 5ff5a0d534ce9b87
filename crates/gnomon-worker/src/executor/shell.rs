//! The `shell` executor: argv in its own process group (and cgroup when
//! offered), as the job's user, output tailed and bounded, the whole group
//! ended on timeout or cancel.

use std::process::Stdio;

use tokio::io::AsyncReadExt;

use super::*;
use crate::isolation::{apply_in_child, rlimits};
use crate::tail::OutputTail;

/// Kills what is left in an attempt's cgroup and removes it (it waits for
/// the kernel, so off the async threads).
async fn end_cgroup(cg: Option<crate::cgroup::AttemptCgroup>) {
    if let Some(cg) = cg {
        let _ = tokio::task::spawn_blocking(move || cg.end()).await;
    }
}

/// A cgroup name from a run id: letters, digits, `-`, `_`, `.` only.
fn sanitize(s: &str) -> String {
    s.chars().take(100).map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' }).collect()
}

fn next_cgroup_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn kill_group(pgid: i32) {
    if pgid > 0 {
        // SAFETY: killpg only sends a signal to a process group we created.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
}

pub(super) async fn run_shell(req: &ExecRequest, spec: &ShellSpec, cancel: watch::Receiver<bool>) -> ExecOutcome {
    let iso = &req.isolation;
    // A fresh private directory per attempt, unless the job names one.
    let workdir = match &spec.cwd {
        Some(_) => None,
        None => match iso.make_workdir(&req.run_id, req.attempt) {
            Ok(d) => Some(d),
            Err(e) => return ExecOutcome::failed(format!("cannot create the attempt's working directory: {e}")),
        },
    };
    // The attempt's files (its params as JSON, its payload): in its working
    // directory, or in a private directory of their own beside a job's
    // `cwd`.
    let has_files = req.params.is_some() || req.payload.is_some();
    let files = match (has_files, &workdir) {
        (false, _) => None,
        (true, Some(d)) => Some((d.clone(), false)),
        (true, None) => match iso.make_workdir(&format!("{}-files", req.run_id), req.attempt) {
            Ok(d) => Some((d, true)),
            Err(e) => return ExecOutcome::failed(format!("cannot create the attempt's file directory: {e}")),
        },
    };
    let mut extra: Vec<(String, String)> = Vec::new();
    if let (Some(params), Some((dir, _))) = (&req.params, &files) {
        match write_private(iso, &dir.join("gnomon-params.json"), &serde_json::to_vec(params).unwrap_or_default()) {
            Ok(path) => extra.push(("PARAMS_FILE".into(), path)),
            Err(e) => return ExecOutcome::failed(format!("cannot write the run's params file: {e}")),
        }
    }
    if let (Some(payload), Some((dir, _))) = (&req.payload, &files) {
        match write_private(iso, &dir.join("gnomon-payload"), payload.as_bytes()) {
            Ok(path) => extra.push(("PAYLOAD_FILE".into(), path)),
            Err(e) => return ExecOutcome::failed(format!("cannot write the run's payload file: {e}")),
        }
    }
    let outcome = spawn_shell(req, spec, workdir.as_deref(), &extra, cancel).await;
    if let Some(d) = &workdir {
        if !spec.keep_workdir {
            Isolation::remove_workdir(d);
        }
    }
    if let Some((d, true)) = &files {
        Isolation::remove_workdir(d);
    }
    outcome
}

/// Writes `bytes` to `path`, readable only by the job's user; its path.
fn write_private(iso: &Isolation, path: &std::path::Path, bytes: &[u8]) -> std::io::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(bytes)?;
    if let Some(u) = &iso.run_as {
        std::os::unix::fs::chown(path, Some(u.uid), Some(u.gid))?;
    }
    Ok(path.display().to_string())
}

async fn spawn_shell(
    req: &ExecRequest,
    spec: &ShellSpec,
    workdir: Option<&std::path::Path>,
    files: &[(String, String)],
    cancel: watch::Receiver<bool>,
) -> ExecOutcome {
    let iso = &req.isolation;
    let mut cmd = tokio::process::Command::new(&spec.command);
    let mut vars: Vec<(String, String)> = req.gnomon_vars().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    vars.extend(files.iter().cloned());
    let mut env = iso.environment(&spec.env, &vars);
    env.extend(req.param_vars());
    cmd.args(&spec.args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    match (&spec.cwd, workdir) {
        (Some(cwd), _) => {
            cmd.current_dir(cwd);
        }
        (None, Some(d)) => {
            cmd.current_dir(d);
        }
        (None, None) => {}
    }
    // The attempt's own cgroup, when the worker has them: made before the
    // fork, entered by the child before exec.
    let cgroup = match &iso.cgroups {
        None => None,
        Some(cgs) => {
            let l = spec.limits.as_ref();
            let memory = l.and_then(|l| l.memory.as_deref()).and_then(|m| gnomon_core::spec::parse_bytes(m).ok());
            let name = format!("{}-{}-{}", sanitize(&req.run_id), req.attempt, next_cgroup_id());
            match cgs.attempt(&name, memory, l.and_then(|l| l.processes)) {
                Ok(cg) => Some(cg),
                Err(e) => return ExecOutcome::failed(format!("cannot create the attempt's cgroup under {}: {e}", cgs.base.display())),
            }
        }
    };
    let by_cgroup = iso.cgroups.as_ref().map_or((false, false), |c| (c.memory, c.pids));
    let limits = rlimits(spec.limits.as_ref(), by_cgroup);
    let cgroup_fd = cgroup.as_ref().map(|c| c.procs_fd());
    let run_as = iso.run_as.as_ref().map(|u| (u.uid, u.gid));
    // Limits, then the user switch, then: if the worker dies (SIGKILL,
    // OOM), its job's top process dies with it instead of running on beside
    // the retry the leader will dispatch (set last: a credential change
    // clears it).
    // SAFETY: setrlimit, setgroups, setgid, setuid and prctl are
    // async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = cgroup_fd {
                crate::cgroup::enter_in_child(fd)?;
            }
            apply_in_child(&limits, run_as)?;
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            end_cgroup(cgroup).await;
            return ExecOutcome { state: AttemptState::Failed, exit_code: None, output: format!("cannot start {:?}: {e}", spec.command) };
        }
    };
    let pgid = child.id().and_then(|id| i32::try_from(id).ok()).unwrap_or(0);
    let tail = Arc::new(std::sync::Mutex::new(OutputTail::default()));
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(tokio::spawn(pump(out, tail.clone())));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(tokio::spawn(pump(err, tail.clone())));
    }
    let (state, exit_code) = tokio::select! {
        status = child.wait() => match status {
            Ok(s) => {
                let code = s.code();
                (if s.success() { AttemptState::Succeeded } else { AttemptState::Failed }, code.or_else(|| signal_code(&s)))
            }
            Err(e) => {
                tail.lock().unwrap_or_else(|p| p.into_inner()).push(format!("[gnomon: wait failed: {e}]").as_bytes());
                (AttemptState::Failed, None)
            }
        },
        _ = sleep_opt(req.timeout) => (AttemptState::TimedOut, None),
        _ = wait_cancel(cancel) => (AttemptState::Cancelled, None),
    };
    // Whatever ended the attempt, nothing of its process group — nor of its
    // cgroup, which also holds what left the group — outlives it.
    kill_group(pgid);
    let _ = child.wait().await;
    let oom = cgroup.as_ref().is_some_and(|c| c.oom_killed());
    end_cgroup(cgroup).await;
    for r in readers {
        let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
    }
    let mut text = std::mem::take(&mut *tail.lock().unwrap_or_else(|p| p.into_inner())).into_string();
    match state {
        AttemptState::TimedOut => text.push_str(&format!(
            "\n[gnomon: timed out after {}; process group killed]",
            gnomon_core::duration::format_duration(req.timeout.unwrap_or_default())
        )),
        AttemptState::Cancelled => text.push_str("\n[gnomon: cancelled; process group killed]"),
        _ => {}
    }
    if oom {
        text.push_str("\n[gnomon: the attempt reached its memory limit; the kernel killed a process]");
    }
    ExecOutcome { state, exit_code, output: text }
}

fn signal_code(status: &std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal().map(|s| 128 + s)
}

async fn pump(mut reader: impl tokio::io::AsyncRead + Unpin, tail: Arc<std::sync::Mutex<OutputTail>>) {
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => tail.lock().unwrap_or_else(|p| p.into_inner()).push(&buf[..n]),
        }
    }
}
