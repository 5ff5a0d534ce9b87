//! The `shell` executor: argv in its own process group (and cgroup when
//! offered), as the job's user, output tailed and bounded, the whole group
//! ended on timeout or cancel.

use std::process::Stdio;

use tokio::io::AsyncReadExt;

use super::*;
use crate::isolation::{rlimits, ChildNote, FailedStep, InChild, JobUser, Owner, PrivateDir};
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
    let user = match iso.user_for(&req.namespace) {
        Ok(u) => u,
        Err(e) => return ExecOutcome::failed(format!("cannot choose the user of the attempt: {e}")),
    };
    // A fresh private directory per attempt, unless the job names one; then
    // one beside it for the attempt's files (its params as JSON, its
    // payload) and for the home of a namespace's uid, when there are any.
    let has_files = req.params.is_some() || req.payload.is_some();
    let needs_home = user.as_ref().is_some_and(|u| u.home.is_none());
    let private = match (&spec.cwd, has_files || needs_home) {
        (None, _) => {
            Some(iso.make_workdir(&req.run_id, req.attempt).map_err(|e| format!("cannot create the attempt's working directory: {e}")))
        }
        (Some(_), true) => Some(
            iso.make_workdir(&format!("{}-files", req.run_id), req.attempt)
                .map_err(|e| format!("cannot create the attempt's file directory: {e}")),
        ),
        (Some(_), false) => None,
    }
    .transpose();
    let private = match private {
        Ok(p) => p,
        Err(e) => return ExecOutcome::failed(e),
    };
    let is_workdir = spec.cwd.is_none();
    let owner = user.as_ref().map(|u| (u.uid, u.gid));
    let mut extra: Vec<(String, String)> = Vec::new();
    let prepared = match &private {
        Some(dir) => prepare(dir, req, owner, &mut extra),
        None => Ok(()),
    };
    let outcome = match prepared {
        Ok(()) => spawn_shell(req, spec, (user.as_ref(), private.as_ref().filter(|_| is_workdir), private.as_ref()), &extra, cancel).await,
        Err(e) => ExecOutcome::failed(e),
    };
    if let Some(d) = private {
        if !(is_workdir && spec.keep_workdir) {
            d.remove();
        }
    }
    outcome
}

/// Writes the attempt's files into its directory, then gives the directory
/// to the job's user (`owner`).
fn prepare(dir: &PrivateDir, req: &ExecRequest, owner: Option<Owner>, extra: &mut Vec<(String, String)>) -> Result<(), String> {
    if let Some(params) = &req.params {
        let path = dir
            .write_file("gnomon-params.json", &serde_json::to_vec(params).unwrap_or_default(), owner)
            .map_err(|e| format!("cannot write the run's params file: {e}"))?;
        extra.push(("PARAMS_FILE".into(), path.display().to_string()));
    }
    if let Some(payload) = &req.payload {
        let path =
            dir.write_file("gnomon-payload", payload.as_bytes(), owner).map_err(|e| format!("cannot write the run's payload file: {e}"))?;
        extra.push(("PAYLOAD_FILE".into(), path.display().to_string()));
    }
    dir.hand_over(owner).map_err(|e| format!("cannot give the attempt's directory to its user: {e}"))
}

/// The attempt's user, its working directory (when gnomon made it) and its
/// own directory (the working one, or the one beside a job's `cwd`).
type Where<'a> = (Option<&'a JobUser>, Option<&'a PrivateDir>, Option<&'a PrivateDir>);

async fn spawn_shell(
    req: &ExecRequest,
    spec: &ShellSpec,
    (user, workdir, private): Where<'_>,
    files: &[(String, String)],
    cancel: watch::Receiver<bool>,
) -> ExecOutcome {
    let iso = &req.isolation;
    let mut cmd = tokio::process::Command::new(&spec.command);
    let mut vars: Vec<(String, String)> = req.gnomon_vars().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    vars.extend(files.iter().cloned());
    let mut env = iso.environment(user, private.map(PrivateDir::path), &spec.env, &vars);
    env.extend(req.param_vars());
    cmd.args(&spec.args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // A job's own `cwd` is a path, entered in the child after the switch
    // to the job's user (never with `current_dir`, which std enters before
    // `pre_exec`, as the worker); the directory gnomon made is entered by
    // its open descriptor (`InChild`).
    let cwd = match spec.cwd.as_deref().map(std::ffi::CString::new).transpose() {
        Ok(c) => c,
        Err(_) => {
            return ExecOutcome::failed(format!("the job's working directory {:?} holds a NUL byte", spec.cwd.as_deref().unwrap_or("")))
        }
    };
    let note = match ChildNote::new() {
        Ok(n) => Arc::new(n),
        Err(e) => return ExecOutcome::failed(format!("cannot prepare the attempt's process: {e}")),
    };
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
    let cgroup_fd = cgroup.as_ref().map(|c| c.procs_fd());
    let run_as = user.map(|u| (u.uid, u.gid));
    let in_child = InChild {
        limits: rlimits(spec.limits.as_ref(), by_cgroup),
        workdir: workdir.map(PrivateDir::raw_fd),
        run_as,
        cwd,
        note: note.clone(),
    };
    // Limits, then the user switch, then the job's `cwd`, then: if the
    // worker dies (SIGKILL, OOM), its job's top process dies with it
    // instead of running on beside the retry the leader will dispatch (set
    // last: a credential change clears it).
    // SAFETY: setrlimit, fchdir, setgroups, setgid, setuid, chdir, a store
    // to a shared page and prctl are async-signal-safe; nothing else runs
    // between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = cgroup_fd {
                crate::cgroup::enter_in_child(fd)?;
            }
            in_child.apply()?;
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
            return ExecOutcome::failed(match note.failed_step() {
                FailedStep::Cwd => {
                    let who = run_as.map(|(uid, _)| format!(" as uid {uid}")).unwrap_or_default();
                    format!("cannot enter the job's working directory {:?}{who}: {e}; nothing ran", spec.cwd.as_deref().unwrap_or(""))
                }
                FailedStep::Other => format!("cannot start {:?}: {e}", spec.command),
            });
        }
    };
    let pgid = child.id().and_then(|id| i32::try_from(id).ok()).unwrap_or(0);
    let tail = Arc::new(std::sync::Mutex::new(OutputTail::default()));
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(tokio::spawn(pump(out, tail.clone(), req.live.clone())));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(tokio::spawn(pump(err, tail.clone(), req.live.clone())));
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
    let kept = text.len();
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
    // The notes end the live stream too.
    if let Some(live) = &req.live {
        live.push(&text.as_bytes()[kept..]);
    }
    ExecOutcome { state, exit_code, output: text, retry: Default::default() }
}

fn signal_code(status: &std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal().map(|s| 128 + s)
}

async fn pump(mut reader: impl tokio::io::AsyncRead + Unpin, tail: Arc<std::sync::Mutex<OutputTail>>, live: Option<crate::live::LiveSink>) {
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                tail.lock().unwrap_or_else(|p| p.into_inner()).push(&buf[..n]);
                if let Some(live) = &live {
                    live.push(&buf[..n]);
                }
            }
        }
    }
}
