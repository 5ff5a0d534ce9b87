//! A cgroup v2 per shell attempt, when the worker may create them.
//!
//! Each attempt's processes start in their own cgroup under the worker's,
//! so that:
//! - ending the attempt kills everything it started, even a process that
//!   left the process group (`setsid`, a double fork) — `cgroup.kill`;
//! - `limits.memory` is `memory.max` for the whole tree (with swap off), not
//!   a per-process address-space cap that breaks JVMs and Go runtimes;
//! - `limits.processes` is `pids.max` for the attempt, not the per-user
//!   count that `RLIMIT_NPROC` gives.
//!
//! A limit whose controller the worker's cgroup does not offer falls back
//! to setrlimit, and the worker says so once at start. The worker needs a
//! cgroup it may write (root on the host, or a systemd unit with
//! `Delegate=yes`).

use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Whether the worker uses cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// When the machine allows it; otherwise a note at start.
    #[default]
    Auto,
    Off,
    /// Refuse to start without them.
    Required,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Mode::Auto),
            "off" => Ok(Mode::Off),
            "required" => Ok(Mode::Required),
            _ => Err(format!("unknown cgroup mode {s:?} (auto, off, required)")),
        }
    }
}

/// The worker's cgroup for its attempts.
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// Holds one child cgroup per running attempt; has no processes itself.
    pub base: PathBuf,
    pub memory: bool,
    pub pids: bool,
}

/// An attempt's cgroup: removed, with anything left in it killed, on drop.
#[derive(Debug)]
pub struct AttemptCgroup {
    dir: PathBuf,
    /// `cgroup.procs`, opened before the fork: the child writes `0` to it
    /// to move itself in before exec.
    procs: OwnedFd,
}

impl Cgroups {
    /// Finds a cgroup v2 tree this worker may use, or says why not.
    pub fn detect() -> Result<Cgroups, String> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let own = fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let (mount, root) = cgroup2_mount(&mountinfo).ok_or("no cgroup v2 hierarchy is mounted")?;
        let rel = own.lines().find_map(|l| l.strip_prefix("0::")).ok_or("this process is in no cgroup v2")?;
        let rel = rel.strip_prefix(root.as_str()).unwrap_or(rel).trim_start_matches('/');
        let own_dir = mount.join(rel);
        let offered = fs::read_to_string(own_dir.join("cgroup.controllers")).unwrap_or_default();
        let offered: Vec<&str> = offered.split_whitespace().collect();
        let is_root = rel.is_empty();
        // cgroup v2 gives controllers only to children of a cgroup without
        // processes (the root excepted): the worker moves itself into a leaf
        // beside `gnomon-jobs`, which holds one cgroup per worker process,
        // which holds one per attempt.
        let jobs = own_dir.join("gnomon-jobs");
        let base = jobs.join(format!("worker-{}", std::process::id()));
        let wanted: Vec<&str> = ["memory", "pids"].into_iter().filter(|c| offered.contains(c)).collect();
        let enable = |dir: &Path| -> Result<(), String> {
            if wanted.is_empty() {
                return Ok(());
            }
            let line = wanted.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ");
            fs::write(dir.join("cgroup.subtree_control"), line)
                .map_err(|e| format!("cannot enable {} for child cgroups of {}: {e}", wanted.join(", "), dir.display()))
        };
        if !is_root {
            let leaf = own_dir.join("gnomon-worker");
            mkdir(&leaf)?;
            fs::write(leaf.join("cgroup.procs"), std::process::id().to_string())
                .map_err(|e| format!("cannot move the worker into {}: {e}", leaf.display()))?;
        }
        enable(&own_dir)?;
        mkdir(&jobs)?;
        enable(&jobs)?;
        clean_stale_workers(&jobs);
        mkdir(&base)?;
        enable(&base)?;
        Ok(Cgroups { memory: wanted.contains(&"memory"), pids: wanted.contains(&"pids"), base })
    }

    /// Detects once per process (several workers in one process share it).
    pub fn shared(mode: Mode) -> Result<Option<Cgroups>, String> {
        static DETECTED: std::sync::OnceLock<Result<Cgroups, String>> = std::sync::OnceLock::new();
        if mode == Mode::Off {
            return Ok(None);
        }
        static NOTED: std::sync::Once = std::sync::Once::new();
        match DETECTED.get_or_init(Cgroups::detect) {
            Ok(c) => {
                NOTED.call_once(|| tracing::info!("{}", c.describe()));
                Ok(Some(c.clone()))
            }
            Err(e) if mode == Mode::Required => Err(format!("cgroups are required but unusable: {e}")),
            Err(e) => {
                NOTED.call_once(|| {
                    tracing::warn!(
                        reason = %e,
                        "shell attempts run without their own cgroup: limits use setrlimit only (memory is per-process address space, \
                         processes the per-user count) and a process that leaves the attempt's process group survives its end"
                    )
                });
                Ok(None)
            }
        }
    }

    /// What a start-up note says: which limits fall back to setrlimit.
    pub fn describe(&self) -> String {
        let missing: Vec<&str> = [("memory", self.memory), ("pids", self.pids)].into_iter().filter(|(_, on)| !on).map(|(c, _)| c).collect();
        if missing.is_empty() {
            format!("shell attempts run in their own cgroup under {} (memory and processes limits by cgroup)", self.base.display())
        } else {
            format!(
                "shell attempts run in their own cgroup under {}; the {} {} not offered here, so {} setrlimit (per-process address space, per-user process count)",
                self.base.display(),
                missing.join(" and "),
                if missing.len() == 2 { "controllers are" } else { "controller is" },
                if missing.len() == 2 { "memory and processes limits use" } else if self.memory { "processes limits use" } else { "memory limits use" },
            )
        }
    }

    /// Creates the cgroup of one attempt with its limits.
    pub fn attempt(&self, name: &str, memory: Option<u64>, processes: Option<u64>) -> std::io::Result<AttemptCgroup> {
        let dir = self.base.join(name);
        fs::create_dir(&dir)?;
        let made = AttemptCgroup::open(dir.clone());
        let cg = match made {
            Ok(cg) => cg,
            Err(e) => {
                let _ = fs::remove_dir(&dir);
                return Err(e);
            }
        };
        if let (true, Some(m)) = (self.memory, memory) {
            fs::write(dir.join("memory.max"), m.to_string())?;
            // Swap would let a job past its memory limit.
            let _ = fs::write(dir.join("memory.swap.max"), "0");
        }
        if let (true, Some(n)) = (self.pids, processes) {
            fs::write(dir.join("pids.max"), n.to_string())?;
        }
        Ok(cg)
    }
}

impl AttemptCgroup {
    fn open(dir: PathBuf) -> std::io::Result<AttemptCgroup> {
        let f = fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?;
        Ok(AttemptCgroup { dir, procs: f.into() })
    }

    /// The descriptor the forked child writes `0` to (async-signal-safe).
    pub fn procs_fd(&self) -> i32 {
        self.procs.as_raw_fd()
    }

    /// Whether the kernel killed a process of the attempt at its memory limit.
    pub fn oom_killed(&self) -> bool {
        fs::read_to_string(self.dir.join("memory.events"))
            .ok()
            .and_then(|t| t.lines().find_map(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse::<u64>().ok())))
            .is_some_and(|n| n > 0)
    }

    /// Kills everything still in the attempt's cgroup and removes it.
    pub fn end(self) {
        kill_and_remove(&self.dir);
    }
}

/// In the forked child: moves the calling process into the cgroup whose
/// `cgroup.procs` is open as `fd`. Async-signal-safe.
pub fn enter_in_child(fd: i32) -> std::io::Result<()> {
    // SAFETY: write(2) on a descriptor opened before the fork.
    if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn mkdir(dir: &Path) -> Result<(), String> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("cannot create cgroup {}: {e}", dir.display())),
    }
}

/// Kills what is in `dir` (`cgroup.kill`, or SIGKILL to each listed process
/// on kernels before 5.14), waits until it is empty and removes it.
fn kill_and_remove(dir: &Path) {
    if fs::OpenOptions::new().write(true).open(dir.join("cgroup.kill")).and_then(|mut f| f.write_all(b"1")).is_err() {
        for pid in fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default().lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2) only signals the processes of this attempt.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if Instant::now() >= deadline => {
                tracing::warn!(cgroup = %dir.display(), error = %e, "an attempt's cgroup could not be removed");
                return;
            }
            // Busy until the killed processes are reaped.
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Cgroups of worker processes that are gone (killed), with what they left.
fn clean_stale_workers(jobs: &Path) {
    for e in fs::read_dir(jobs).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name.strip_prefix("worker-").and_then(|p| p.parse::<i32>().ok()) else { continue };
        // SAFETY: signal 0 only checks that the process exists.
        if pid as u32 != std::process::id() && unsafe { libc::kill(pid, 0) } != 0 {
            for a in fs::read_dir(e.path()).into_iter().flatten().flatten() {
                if a.path().is_dir() {
                    kill_and_remove(&a.path());
                }
            }
            kill_and_remove(&e.path());
        }
    }
}

/// The cgroup2 mount point and the cgroup path it shows as its root.
fn cgroup2_mount(mountinfo: &str) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|l| {
        let (fields, rest) = l.split_once(" - ")?;
        if rest.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let f: Vec<&str> = fields.split_whitespace().collect();
        Some((PathBuf::from(f.get(4)?), f.get(3)?.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_in_mountinfo() {
        let info = "24 31 0:22 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(info), Some((PathBuf::from("/sys/fs/cgroup/unified"), "/".to_string())));
        assert_eq!(cgroup2_mount("24 31 0:22 / /sys/fs/cgroup/memory rw - cgroup cgroup rw\n"), None);
    }

    #[test]
    fn modes_parse() {
        assert_eq!("auto".parse::<Mode>(), Ok(Mode::Auto));
        assert_eq!("required".parse::<Mode>(), Ok(Mode::Required));
        assert!("on".parse::<Mode>().unwrap_err().contains("auto, off, required"));
    }
}
