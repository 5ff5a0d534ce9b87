//! What a shell job's process gets from its worker, and nothing more:
//! - a clean environment: only `PATH`, `HOME`, `LANG` and `TZ` pass from
//!   the worker, then the job's `env`, then the attempt's `GNOMON_*`;
//! - a fresh working directory per attempt (0700) under the worker's data
//!   dir, removed when the attempt ends unless the job keeps it;
//! - its own cgroup when the machine allows (see `cgroup`), and resource
//!   limits from the job's `limits` (by cgroup, or setrlimit);
//! - optionally another user (`--run-as`), when the worker runs as root.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use gnomon_core::spec::Limits;

/// Variables a job inherits from the worker.
pub const PASSED_ENV: [&str; 4] = ["PATH", "HOME", "LANG", "TZ"];

/// The umask jobs get: the one the process started with (the process
/// itself runs with 077, so its own files — database, spool — are private).
static JOB_UMASK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0o022);

/// Makes this process's files private (umask 077) and keeps the previous
/// umask for the jobs it starts.
pub fn private_files() {
    // SAFETY: umask has no preconditions.
    let old = unsafe { libc::umask(0o077) };
    JOB_UMASK.store(old as u32, std::sync::atomic::Ordering::SeqCst);
}

/// The `PATH` a job gets when the worker has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A user jobs run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

impl RunAs {
    /// Looks a user up by name (or numeric uid). Only root can switch
    /// users: anyone else gets an error naming the problem.
    pub fn lookup(user: &str) -> Result<RunAs, String> {
        let c = CString::new(user).map_err(|_| format!("--run-as {user:?}: not a user name"))?;
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: getpwnam_r/getpwuid_r write into our own buffers only.
        let rc = unsafe {
            match user.parse::<u32>() {
                Ok(uid) => libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut out),
                Err(_) => libc::getpwnam_r(c.as_ptr(), &mut pwd, buf.as_mut_ptr(), buf.len(), &mut out),
            }
        };
        if rc != 0 || out.is_null() {
            return Err(format!("--run-as {user:?}: no such user"));
        }
        // SAFETY: on success the pointers point into `buf`, NUL-terminated.
        let (name, home) = unsafe {
            (
                std::ffi::CStr::from_ptr(pwd.pw_name).to_string_lossy().into_owned(),
                std::ffi::CStr::from_ptr(pwd.pw_dir).to_string_lossy().into_owned(),
            )
        };
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 && pwd.pw_uid != unsafe { libc::geteuid() } {
            return Err(format!("--run-as {user:?}: only a worker running as root can run jobs as another user"));
        }
        Ok(RunAs { name, uid: pwd.pw_uid, gid: pwd.pw_gid, home: PathBuf::from(home) })
    }
}

/// How a worker isolates its shell jobs.
#[derive(Debug, Clone, Default)]
pub struct Isolation {
    /// Where per-attempt working directories go (`None`: the system temp dir).
    pub work_root: Option<PathBuf>,
    pub run_as: Option<RunAs>,
    /// Where attempts get their own cgroup (`None`: not on this machine).
    pub cgroups: Option<crate::cgroup::Cgroups>,
}

impl Isolation {
    /// The environment of a job: the passed variables, the job's own, then
    /// the attempt's (which win).
    pub fn environment<K: AsRef<str>>(
        &self,
        job_env: &std::collections::BTreeMap<String, String>,
        gnomon: &[(K, String)],
    ) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = Vec::new();
        for k in PASSED_ENV {
            let v = match (k, &self.run_as) {
                ("HOME", Some(u)) => Some(u.home.display().to_string()),
                _ => std::env::var(k).ok(),
            };
            match v {
                Some(v) => env.push((k.to_string(), v)),
                None if k == "PATH" => env.push((k.to_string(), DEFAULT_PATH.to_string())),
                None => {}
            }
        }
        if let Some(u) = &self.run_as {
            env.push(("USER".into(), u.name.clone()));
            env.push(("LOGNAME".into(), u.name.clone()));
        }
        for (k, v) in job_env {
            env.retain(|(e, _)| e != k);
            env.push((k.clone(), v.clone()));
        }
        for (k, v) in gnomon {
            env.push((format!("GNOMON_{}", k.as_ref()), v.clone()));
        }
        env
    }

    /// Creates the attempt's working directory (0700, owned by the job's
    /// user).
    pub fn make_workdir(&self, run_id: &str, attempt: u32) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let root = self.work_root.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("gnomon-work-{uid}")));
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&root)?;
        // Run ids are letters, digits and '-'; anything else is replaced so
        // the name can never leave the root.
        let safe: String = run_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        // A random suffix: never a directory another process made or left.
        let dir = root.join(format!("{safe}-a{attempt}-{:08x}", rand::random::<u32>()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        if let Some(u) = &self.run_as {
            std::os::unix::fs::chown(&dir, Some(u.uid), Some(u.gid))?;
            // The job's user must be able to reach its directory.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711))?;
        }
        Ok(dir)
    }

    /// Removes a working directory made by [`Isolation::make_workdir`].
    pub fn remove_workdir(dir: &Path) {
        if let Err(e) = std::fs::remove_dir_all(dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove an attempt's working directory");
            }
        }
    }
}

/// The rlimits to set, as `(resource, value)`: memory and processes only
/// when no cgroup enforces them (`by_cgroup`: memory, processes).
pub fn rlimits(limits: Option<&Limits>, by_cgroup: (bool, bool)) -> Vec<(libc::__rlimit_resource_t, u64)> {
    let Some(l) = limits else { return Vec::new() };
    let mut v = Vec::new();
    if let Some(n) = l.cpu_seconds {
        v.push((libc::RLIMIT_CPU, n));
    }
    if let Some(m) = l.memory.as_deref().and_then(|m| gnomon_core::spec::parse_bytes(m).ok()).filter(|_| !by_cgroup.0) {
        v.push((libc::RLIMIT_AS, m));
    }
    if let Some(n) = l.open_files {
        v.push((libc::RLIMIT_NOFILE, n));
    }
    if let Some(n) = l.processes.filter(|_| !by_cgroup.1) {
        v.push((libc::RLIMIT_NPROC, n));
    }
    v
}

/// In the forked child, before exec: limits, then the user switch. Only
/// async-signal-safe calls.
pub fn apply_in_child(limits: &[(libc::__rlimit_resource_t, u64)], run_as: Option<(u32, u32)>) -> std::io::Result<()> {
    // SAFETY: umask is async-signal-safe; the atomic load is a plain read.
    unsafe {
        libc::umask(JOB_UMASK.load(std::sync::atomic::Ordering::Relaxed) as libc::mode_t);
    }
    for (resource, value) in limits {
        let lim = libc::rlimit { rlim_cur: *value as libc::rlim_t, rlim_max: *value as libc::rlim_t };
        // SAFETY: setrlimit with a valid struct; async-signal-safe.
        if unsafe { libc::setrlimit(*resource, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    if let Some((uid, gid)) = run_as {
        // SAFETY: setgroups/setgid/setuid are async-signal-safe; the order
        // (groups, group, then user) is the one that can drop root.
        unsafe {
            let groups = [gid as libc::gid_t];
            if libc::setgroups(1, groups.as_ptr()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_an_allow_list() {
        std::env::set_var("GNOMON_TOKEN", "secret-of-the-worker");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "nope");
        let iso = Isolation::default();
        let mut job = std::collections::BTreeMap::new();
        job.insert("MY_VAR".to_string(), "1".to_string());
        job.insert("PATH".to_string(), "/opt/bin".to_string());
        let env = iso.environment(&job, &[("RUN_ID", "r-1".into())]);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert!(!names.contains(&"GNOMON_TOKEN") && !names.contains(&"AWS_SECRET_ACCESS_KEY"), "{names:?}");
        assert!(names.contains(&"MY_VAR") && names.contains(&"GNOMON_RUN_ID"));
        assert_eq!(env.iter().filter(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).collect::<Vec<_>>(), vec!["/opt/bin"]);
    }

    #[test]
    fn workdirs_are_private_and_stay_under_the_root() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let iso = Isolation { work_root: Some(root.path().to_path_buf()), run_as: None, cgroups: None };
        let d = iso.make_workdir("../../etc/x", 2).unwrap();
        assert!(d.starts_with(root.path()), "{}", d.display());
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
        Isolation::remove_workdir(&d);
        assert!(!d.exists());
    }

    #[test]
    fn limits_map_to_rlimits() {
        let l = Limits { cpu_seconds: Some(5), memory: Some("64MiB".into()), open_files: Some(64), processes: None };
        assert_eq!(rlimits(Some(&l), (false, false)), vec![(libc::RLIMIT_CPU, 5), (libc::RLIMIT_AS, 64 << 20), (libc::RLIMIT_NOFILE, 64)]);
        assert_eq!(rlimits(Some(&l), (true, true)), vec![(libc::RLIMIT_CPU, 5), (libc::RLIMIT_NOFILE, 64)]);
        assert!(rlimits(None, (false, false)).is_empty());
    }
}
