//! What a shell job's process gets from its worker, and nothing more:
//! - a clean environment: only `PATH`, `HOME`, `LANG` and `TZ` pass from
//!   the worker, then the job's `env`, then the attempt's `GNOMON_*`;
//! - a fresh working directory per attempt (0700, the job user's) in the
//!   worker's work root, removed when the attempt ends unless the job keeps
//!   it; it and the attempt's files (params, payload: 0600) are made
//!   without following links (see `private_fs`);
//! - its own cgroup when the machine allows (see `cgroup`), and resource
//!   limits from the job's `limits` (by cgroup, or setrlimit);
//! - optionally another user, when the worker runs as root: one for every
//!   job (`--run-as`), or a uid of its own per namespace (`--run-as-range`,
//!   see `uids`); either way with no supplementary groups, and a job's own
//!   `cwd` entered only after the switch, with that user's rights.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gnomon_core::spec::Limits;

mod private_fs;
mod uids;

pub use private_fs::{Owner, PrivateDir, WorkRoot};
pub use uids::{UidAllocator, UidRange};

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

/// Which users a worker's shell jobs run as.
#[derive(Debug, Clone, Default)]
pub enum JobUsers {
    /// The worker's own user.
    #[default]
    Own,
    /// Every job as this user (`--run-as`).
    One(RunAs),
    /// Each namespace's jobs as a uid of its own (`--run-as-range`): the
    /// uid is also the primary group, and there are no other groups.
    PerNamespace(Arc<UidAllocator>),
}

impl JobUsers {
    /// Whether jobs run as another user than this process.
    pub fn switches(&self) -> bool {
        match self {
            JobUsers::Own => false,
            JobUsers::One(u) => u.uid != rustix::process::geteuid().as_raw(),
            JobUsers::PerNamespace(_) => true,
        }
    }
}

/// The user one attempt runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobUser {
    pub uid: u32,
    pub gid: u32,
    /// `USER` and `LOGNAME`: the user's name, or the uid of a namespace's.
    pub name: String,
    /// `HOME`: the user's; `None` for a namespace's uid, whose home (and
    /// `TMPDIR`) is the attempt's own directory.
    pub home: Option<PathBuf>,
}

/// How a worker isolates its shell jobs.
#[derive(Debug, Default)]
pub struct Isolation {
    /// Where per-attempt working directories go (`None`: a fresh private
    /// directory of a random name in the system temp dir).
    pub work_root: Option<PathBuf>,
    pub users: JobUsers,
    /// Where attempts get their own cgroup (`None`: not on this machine).
    pub cgroups: Option<crate::cgroup::Cgroups>,
    /// The work root, opened once (at [`Isolation::new`] or first use).
    root: std::sync::OnceLock<Result<WorkRoot, String>>,
}

impl Isolation {
    /// An isolation whose work root, when given, is opened now, so that one
    /// refused (a link, another owner, too open) stops the worker at start;
    /// a fresh one is made at the first attempt that needs it.
    pub fn new(work_root: Option<PathBuf>, users: JobUsers, cgroups: Option<crate::cgroup::Cgroups>) -> Result<Isolation, String> {
        let iso = Isolation { work_root, users, cgroups, root: Default::default() };
        if iso.work_root.is_some() {
            iso.root()?;
        }
        Ok(iso)
    }

    /// The work root, opened (or made) at first use.
    pub fn root(&self) -> Result<&WorkRoot, String> {
        let shared = self.users.switches();
        let opened = self.root.get_or_init(|| {
            match &self.work_root {
                Some(p) => WorkRoot::open(p, shared),
                None => WorkRoot::fresh(&std::env::temp_dir(), shared),
            }
            .map_err(|e| format!("the attempts' working directory root: {e}"))
        });
        opened.as_ref().map_err(Clone::clone)
    }

    /// The user an attempt of `namespace` runs as (`None`: this process's).
    pub fn user_for(&self, namespace: &str) -> Result<Option<JobUser>, String> {
        Ok(match &self.users {
            JobUsers::Own => None,
            JobUsers::One(u) => Some(JobUser { uid: u.uid, gid: u.gid, name: u.name.clone(), home: Some(u.home.clone()) }),
            JobUsers::PerNamespace(a) => {
                let uid = a.uid_for(namespace)?;
                Some(JobUser { uid, gid: uid, name: uid.to_string(), home: None })
            }
        })
    }

    /// The environment of a job run as `user` with its own directory
    /// `private`: the passed variables, the job's own, then the attempt's
    /// (which win).
    pub fn environment<K: AsRef<str>>(
        &self,
        user: Option<&JobUser>,
        private: Option<&Path>,
        job_env: &std::collections::BTreeMap<String, String>,
        gnomon: &[(K, String)],
    ) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = Vec::new();
        for k in PASSED_ENV {
            let v = match (k, user) {
                ("HOME", Some(u)) => u.home.as_deref().or(private).map(|h| h.display().to_string()),
                _ => std::env::var(k).ok(),
            };
            match v {
                Some(v) => env.push((k.to_string(), v)),
                None if k == "PATH" => env.push((k.to_string(), DEFAULT_PATH.to_string())),
                None => {}
            }
        }
        if let Some(u) = user {
            env.push(("USER".into(), u.name.clone()));
            env.push(("LOGNAME".into(), u.name.clone()));
            // A namespace's uid keeps its temporary files in its own
            // directory too, not where other namespaces' jobs look.
            if let (None, Some(p)) = (&u.home, private) {
                env.push(("TMPDIR".into(), p.display().to_string()));
            }
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

    /// Makes a directory of the attempt's own in the work root (0700, this
    /// process's until [`PrivateDir::hand_over`]), named after the run, the
    /// attempt and a random suffix so it is never one already there.
    pub fn make_workdir(&self, run_id: &str, attempt: u32) -> std::io::Result<PrivateDir> {
        let root = self.root().map_err(std::io::Error::other)?;
        // Run ids are letters, digits and '-'; anything else is replaced so
        // the name can never leave the root.
        let safe: String = run_id.chars().take(200).map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        root.make_dir(&format!("{safe}-a{attempt}-{:08x}", rand::random::<u32>()))
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

/// What the forked child does before exec, in this order: limits, the
/// attempt's own directory (`workdir`, an open descriptor: never a path
/// that could have changed), the user switch with no supplementary groups,
/// and only then the job's own `cwd`, so that it is entered with the job
/// user's rights and never the worker's. (std's `Command::current_dir`
/// would enter it before `pre_exec`, so as the worker: it is never used
/// for a job's directory.)
pub struct InChild {
    pub limits: Vec<(libc::__rlimit_resource_t, u64)>,
    pub workdir: Option<std::os::fd::RawFd>,
    pub run_as: Option<(u32, u32)>,
    pub cwd: Option<CString>,
    /// Where the child says which step failed (see [`ChildNote`]).
    pub note: Arc<ChildNote>,
}

/// The step of [`InChild`] that failed, as its child noted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedStep {
    /// Anything before entering the job's `cwd`, or exec itself.
    Other,
    /// Entering the job's `cwd` as its user.
    Cwd,
}

/// One byte shared with a forked child (an anonymous shared mapping): std
/// hands back only the errno of a failed `pre_exec`, so the child writes
/// here which of its steps failed.
#[derive(Debug)]
pub struct ChildNote {
    addr: usize,
}

const NOTE_CWD: u8 = 1;

impl ChildNote {
    pub fn new() -> std::io::Result<ChildNote> {
        // SAFETY: a fresh anonymous mapping of one page, ours alone until
        // munmap in drop.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ChildNote { addr: p as usize })
    }

    /// In the child: a plain store to the shared page (async-signal-safe).
    fn set(&self, v: u8) {
        // SAFETY: the page is mapped and writable while `self` lives.
        unsafe { std::ptr::write_volatile(self.addr as *mut u8, v) }
    }

    /// In the parent, once spawn has returned: which step failed.
    pub fn failed_step(&self) -> FailedStep {
        // SAFETY: the page is mapped and readable while `self` lives.
        match unsafe { std::ptr::read_volatile(self.addr as *const u8) } {
            NOTE_CWD => FailedStep::Cwd,
            _ => FailedStep::Other,
        }
    }
}

impl Drop for ChildNote {
    fn drop(&mut self) {
        // SAFETY: unmaps the page mapped in `new`, used by no one after.
        unsafe {
            libc::munmap(self.addr as *mut libc::c_void, 4096);
        }
    }
}

impl InChild {
    /// In the forked child, before exec (see [`InChild`]). Only
    /// async-signal-safe calls.
    pub fn apply(&self) -> std::io::Result<()> {
        // SAFETY: umask is async-signal-safe; the atomic load is a plain read.
        unsafe {
            libc::umask(JOB_UMASK.load(std::sync::atomic::Ordering::Relaxed) as libc::mode_t);
        }
        for (resource, value) in &self.limits {
            let lim = libc::rlimit { rlim_cur: *value as libc::rlim_t, rlim_max: *value as libc::rlim_t };
            // SAFETY: setrlimit with a valid struct; async-signal-safe.
            if unsafe { libc::setrlimit(*resource, &lim) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if let Some(fd) = self.workdir {
            // SAFETY: fchdir on a descriptor the parent holds open; async-signal-safe.
            if unsafe { libc::fchdir(fd) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if let Some((uid, gid)) = self.run_as {
            // SAFETY: setgroups/setgid/setuid are async-signal-safe; the order
            // (groups, group, then user) is the one that can drop root.
            unsafe {
                if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        if let Some(cwd) = &self.cwd {
            // SAFETY: chdir on a NUL-terminated path made before the fork;
            // async-signal-safe. After the user switch: the job user's rights.
            if unsafe { libc::chdir(cwd.as_ptr()) } != 0 {
                let e = std::io::Error::last_os_error();
                self.note.set(NOTE_CWD);
                return Err(e);
            }
        }
        Ok(())
    }
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
        let env = iso.environment(None, None, &job, &[("RUN_ID", "r-1".into())]);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert!(!names.contains(&"GNOMON_TOKEN") && !names.contains(&"AWS_SECRET_ACCESS_KEY"), "{names:?}");
        assert!(names.contains(&"MY_VAR") && names.contains(&"GNOMON_RUN_ID"));
        assert_eq!(env.iter().filter(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).collect::<Vec<_>>(), vec!["/opt/bin"]);
    }

    #[test]
    fn workdirs_are_private_and_stay_under_the_root() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let iso = Isolation::new(Some(root.path().join("work")), JobUsers::Own, None).unwrap();
        let d = iso.make_workdir("../../etc/x", 2).unwrap();
        let path = d.path().to_path_buf();
        assert!(
            path.parent() == Some(root.path().join("work").as_path())
                && path.file_name().unwrap().to_str().unwrap().starts_with("______etc_x-a2-"),
            "{}",
            path.display()
        );
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o700);
        d.remove();
        assert!(!path.exists());
    }

    #[test]
    fn a_namespace_user_is_its_uid_with_its_own_group_and_home() {
        let data = tempfile::tempdir().unwrap();
        let alloc = UidAllocator::open(data.path(), UidRange::parse("900000-900009").unwrap()).unwrap();
        let iso = Isolation { users: JobUsers::PerNamespace(Arc::new(alloc)), ..Default::default() };
        let a = iso.user_for("a").unwrap().unwrap();
        assert_eq!(a, JobUser { uid: 900000, gid: 900000, name: "900000".into(), home: None });
        assert_eq!(iso.user_for("b").unwrap().unwrap().uid, 900001);
        let env = iso.environment::<&str>(Some(&a), Some(Path::new("/w/r-a1-x")), &Default::default(), &[]);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!((get("HOME"), get("USER"), get("LOGNAME")), (Some("/w/r-a1-x"), Some("900000"), Some("900000")));
        assert_eq!(get("TMPDIR"), Some("/w/r-a1-x"));
        assert!(JobUsers::PerNamespace(Arc::new(
            UidAllocator::open(tempfile::tempdir().unwrap().path(), UidRange::parse("1-2").unwrap()).unwrap()
        ))
        .switches());
        assert!(!JobUsers::Own.switches());
    }

    #[test]
    fn a_default_isolation_gets_a_fresh_private_root() {
        use std::os::unix::fs::PermissionsExt;
        let (a, b) = (Isolation::default(), Isolation::default());
        let (ra, rb) = (a.root().unwrap().path().to_path_buf(), b.root().unwrap().path().to_path_buf());
        assert_ne!(ra, rb, "never a predictable directory");
        assert!(ra.starts_with(std::env::temp_dir()) && ra.file_name().unwrap().to_str().unwrap().starts_with("gnomon-work-"));
        assert_eq!(std::fs::metadata(&ra).unwrap().permissions().mode() & 0o7777, 0o700);
        drop((a, b));
        assert!(!ra.exists() && !rb.exists(), "removed when empty");
    }

    #[test]
    fn limits_map_to_rlimits() {
        let l = Limits { cpu_seconds: Some(5), memory: Some("64MiB".into()), open_files: Some(64), processes: None };
        assert_eq!(rlimits(Some(&l), (false, false)), vec![(libc::RLIMIT_CPU, 5), (libc::RLIMIT_AS, 64 << 20), (libc::RLIMIT_NOFILE, 64)]);
        assert_eq!(rlimits(Some(&l), (true, true)), vec![(libc::RLIMIT_CPU, 5), (libc::RLIMIT_NOFILE, 64)]);
        assert!(rlimits(None, (false, false)).is_empty());
    }
}
