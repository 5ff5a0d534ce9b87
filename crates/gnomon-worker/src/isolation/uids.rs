//! A uid of its own for each namespace's shell jobs (`--run-as-range
//! FIRST-LAST`).
//!
//! - A namespace gets the lowest uid of the range that no other namespace
//!   has, the first time one of its attempts runs here, and keeps it: the
//!   allocation is written to `uids.json` in the worker's data dir before
//!   the uid is used (a temporary file, fsynced, renamed over the old one,
//!   the directory fsynced), so it survives restarts. Never a hash: two
//!   namespaces never share a uid.
//! - The data dir's allocation is locked (`flock` on `uids.lock`) for as
//!   long as the worker runs; a second process on the same dir is refused.
//! - When every uid of the range is taken, a new namespace's attempts fail
//!   with a message saying so; nothing falls back to a shared uid.
//! - A file that cannot be read as an allocation within the range (another
//!   range, a uid twice, not JSON) is refused at start, never reset: its
//!   uids may still own a namespace's files.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::{flock, fstat, fsync, openat, renameat, unlinkat, AtFlags, FileType, FlockOperation, Mode, OFlags, CWD};
use rustix::io::Errno;

/// The allocation's file in the data dir.
pub const FILE: &str = "uids.json";
const TEMP: &str = "uids.json.tmp";
const LOCK: &str = "uids.lock";
/// The most a file may hold (a namespace name is short; this is many).
const MAX_FILE_BYTES: u64 = 16 << 20;

/// A range of uids, `FIRST-LAST`, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl UidRange {
    /// Reads `FIRST-LAST`: two uids, FIRST at most LAST, neither 0 (root)
    /// nor 4294967295 (no uid to the kernel).
    pub fn parse(text: &str) -> Result<UidRange, String> {
        let shape = || format!("{text:?} is not FIRST-LAST, two uids like 200000-200999");
        let (a, b) = text.split_once('-').ok_or_else(shape)?;
        let num = |s: &str| if !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()) { s.parse::<u32>().ok() } else { None };
        let (first, last) = match (num(a), num(b)) {
            (Some(f), Some(l)) => (f, l),
            _ => return Err(shape()),
        };
        if first == 0 {
            return Err("the range holds uid 0, which is root: jobs would run as root; start it above 0 (for example 200000-200999)".into());
        }
        if first > last {
            return Err(format!("FIRST ({first}) is above LAST ({last})"));
        }
        if last == u32::MAX {
            return Err(format!("{last} is not a uid (the kernel reads it as no uid)"));
        }
        Ok(UidRange { first, last })
    }

    pub fn contains(&self, uid: u32) -> bool {
        (self.first..=self.last).contains(&uid)
    }

    /// How many uids the range holds.
    pub fn len(&self) -> u64 {
        u64::from(self.last - self.first) + 1
    }

    /// Never empty ([`UidRange::parse`] makes FIRST at most LAST).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Refuses a range holding the uid or gid of a user of `passwd` or the
    /// gid of a group of `group` (the two files' text): a job would get that
    /// user's files, or that group's.
    pub fn check_unused(&self, passwd: &str, group: &str) -> Result<(), String> {
        let ids = |text: &str, fields: &[usize], file: &'static str, what: &'static str| {
            let mut found = Vec::new();
            for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
                let parts: Vec<&str> = line.split(':').collect();
                for &i in fields {
                    if let Some(id) = parts.get(i).and_then(|s| s.trim().parse::<u32>().ok()) {
                        found.push((id, parts[0].to_string(), file, if i == 2 { what } else { "primary group of user" }));
                    }
                }
            }
            found
        };
        let mut taken = ids(passwd, &[2, 3], "/etc/passwd", "user");
        taken.extend(ids(group, &[2], "/etc/group", "group"));
        match taken.into_iter().filter(|(id, ..)| self.contains(*id)).min_by_key(|(id, ..)| *id) {
            None => Ok(()),
            Some((id, name, file, what)) => Err(format!(
                "{id} is the id of the {what} {name:?} in {file}: the range must hold no id of an existing user or group \
                 (their files would be the jobs'); pick unused ids, for example above the largest in {file}"
            )),
        }
    }

    /// [`UidRange::check_unused`] against this host's `/etc/passwd` and
    /// `/etc/group` (a missing file holds nobody).
    pub fn check_host(&self) -> Result<(), String> {
        let read = |p: &str| match std::fs::read_to_string(p) {
            Ok(t) => Ok(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(format!("cannot read {p} to check the range: {e}")),
        };
        self.check_unused(&read("/etc/passwd")?, &read("/etc/group")?)
    }
}

/// What `uids.json` holds.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    version: u32,
    /// The range the worker had when it last wrote the file (information).
    range: String,
    namespaces: BTreeMap<String, u32>,
}

/// The namespaces' uids of one data dir, locked while this is alive.
#[derive(Debug)]
pub struct UidAllocator {
    range: UidRange,
    dir: OwnedFd,
    file: PathBuf,
    _lock: OwnedFd,
    namespaces: Mutex<BTreeMap<String, u32>>,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

impl UidAllocator {
    /// Opens (and locks) the allocation in `data_dir`, which must be this
    /// process's and writable by no one else.
    pub fn open(data_dir: &Path, range: UidRange) -> Result<UidAllocator, String> {
        let dir = openat(CWD, data_dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| io_err(data_dir, std::io::Error::from(e)))?;
        let st = fstat(&dir).map_err(|e| io_err(data_dir, std::io::Error::from(e)))?;
        let me = rustix::process::geteuid().as_raw();
        if st.st_uid != me || st.st_mode & 0o022 != 0 {
            return Err(format!(
                "{}: the data dir must be this process's (uid {me}) and writable by no one else to hold the uid allocation \
                 (it is uid {}'s, mode {:04o})",
                data_dir.display(),
                st.st_uid,
                st.st_mode & 0o7777
            ));
        }
        let lock_path = data_dir.join(LOCK);
        let lock = openat(&dir, LOCK, OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::from_raw_mode(0o600))
            .map_err(|e| io_err(&lock_path, std::io::Error::from(e)))?;
        match flock(&lock, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                return Err(format!(
                    "the uid allocation in {} is in use by another gnomon process (each process needs a data dir of its own)",
                    data_dir.display()
                ))
            }
            Err(e) => return Err(io_err(&lock_path, std::io::Error::from(e))),
        }
        let file = data_dir.join(FILE);
        let namespaces = Self::load(&dir, &file, range)?;
        Ok(UidAllocator { range, dir, file, _lock: lock, namespaces: Mutex::new(namespaces) })
    }

    fn load(dir: &OwnedFd, file: &Path, range: UidRange) -> Result<BTreeMap<String, u32>, String> {
        let fd = match openat(dir, FILE, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(BTreeMap::new()),
            Err(Errno::LOOP) => return Err(io_err(file, "is a symbolic link; refusing to follow it")),
            Err(e) => return Err(io_err(file, std::io::Error::from(e))),
        };
        let st = fstat(&fd).map_err(|e| io_err(file, std::io::Error::from(e)))?;
        let me = rustix::process::geteuid().as_raw();
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_uid != me || st.st_mode & 0o022 != 0 {
            return Err(io_err(file, format!("must be a regular file of uid {me} writable by no one else")));
        }
        let mut text = String::new();
        std::fs::File::from(fd).take(MAX_FILE_BYTES).read_to_string(&mut text).map_err(|e| io_err(file, e))?;
        let stored: Stored = serde_json::from_str(&text).map_err(|e| io_err(file, format!("not a uid allocation: {e}")))?;
        if stored.version != 1 {
            return Err(io_err(file, format!("version {} is not one this gnomon reads", stored.version)));
        }
        let mut seen = BTreeSet::new();
        for (ns, uid) in &stored.namespaces {
            if !range.contains(*uid) {
                return Err(io_err(
                    file,
                    format!(
                        "namespace {ns:?} has uid {uid}, outside --run-as-range {range} (the file was written with {}); \
                         give a range that holds every uid of the file, or move the file away once no file of those uids matters",
                        stored.range
                    ),
                ));
            }
            if !seen.insert(*uid) {
                return Err(io_err(file, format!("uid {uid} is given to two namespaces")));
            }
        }
        Ok(stored.namespaces)
    }

    pub fn range(&self) -> UidRange {
        self.range
    }

    /// Where the allocation is kept.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The namespaces' uids so far.
    pub fn allocations(&self) -> BTreeMap<String, u32> {
        self.namespaces.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The uid of `namespace`: the one it has, or the lowest free one of
    /// the range, recorded on disk before it is returned. Fails, changing
    /// nothing, when the range is used up or the record cannot be written.
    pub fn uid_for(&self, namespace: &str) -> Result<u32, String> {
        let mut map = self.namespaces.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(uid) = map.get(namespace) {
            return Ok(*uid);
        }
        let used: BTreeSet<u32> = map.values().copied().collect();
        let Some(uid) = (self.range.first..=self.range.last).find(|u| !used.contains(u)) else {
            return Err(format!(
                "no uid left for namespace {namespace:?}: all {} uids of --run-as-range {} belong to other namespaces \
                 (recorded in {}); give the worker a wider range",
                self.range.len(),
                self.range,
                self.file.display()
            ));
        };
        let mut next = map.clone();
        next.insert(namespace.to_string(), uid);
        self.write(&next).map_err(|e| format!("cannot record the uid of namespace {namespace:?} in {}: {e}", self.file.display()))?;
        *map = next;
        tracing::info!(namespace, uid, file = %self.file.display(), "a namespace gets a uid of its own for its shell jobs");
        Ok(uid)
    }

    /// Replaces the file with `map`: a new temporary file, fsynced, renamed
    /// over it, then the directory fsynced.
    fn write(&self, map: &BTreeMap<String, u32>) -> std::io::Result<()> {
        let stored = Stored { version: 1, range: self.range.to_string(), namespaces: map.clone() };
        let mut bytes = serde_json::to_vec_pretty(&stored).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        // Under the lock only this process writes here: a temporary file
        // left by a crash (or anything else at its name) is removed, not
        // followed.
        match unlinkat(&self.dir, TEMP, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = openat(
            &self.dir,
            TEMP,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let mut f = std::fs::File::from(fd);
        let written = f.write_all(&bytes).and_then(|()| fsync(&f).map_err(Into::into));
        if let Err(e) = written.and_then(|()| renameat(&self.dir, TEMP, &self.dir, FILE).map_err(Into::into)) {
            let _ = unlinkat(&self.dir, TEMP, AtFlags::empty());
            return Err(e);
        }
        fsync(&self.dir)?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "uids_tests.rs"]
mod tests;
