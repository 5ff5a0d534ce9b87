//! Directories and files made for attempts without ever following a link:
//! each is created relative to an open directory (`mkdirat`, `openat` with
//! `O_NOFOLLOW`, `O_EXCL` for files), then its owner and mode are checked
//! and set on the open descriptor (`fstat`, `fchown`, `fchmod`), never by
//! path. A link or anything else planted where gnomon creates something
//! makes the creation fail; what the link points to is never touched.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use rustix::fs::{fchmod, fchown, fstat, mkdirat, openat, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

/// The owner and group given to what an attempt gets.
pub type Owner = (u32, u32);

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn err(path: &Path, what: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{}: {what}", path.display()))
}

/// An `openat` error, with a link (or non-directory) where a directory was
/// expected said as such.
fn open_err(path: &Path, e: Errno) -> std::io::Error {
    match e {
        Errno::LOOP | Errno::NOTDIR => err(path, "is a symbolic link or not a directory; refusing to follow it"),
        Errno::EXIST => err(path, "already exists; refusing to use something gnomon did not just create"),
        e => err(path, std::io::Error::from(e)),
    }
}

fn uid_gid(owner: Owner) -> (Option<rustix::fs::Uid>, Option<rustix::fs::Gid>) {
    (Some(rustix::fs::Uid::from_raw_unchecked(owner.0)), Some(rustix::fs::Gid::from_raw_unchecked(owner.1)))
}

/// Checks, on the open descriptor, that `fd` is a `kind` owned by `uid`
/// whose permission bits are within `allowed`.
fn check(fd: impl AsFd, path: &Path, kind: FileType, uid: u32, allowed: u32) -> std::io::Result<()> {
    let st = fstat(fd).map_err(|e| err(path, std::io::Error::from(e)))?;
    if FileType::from_raw_mode(st.st_mode) != kind {
        return Err(err(path, format!("is not a {}", if kind == FileType::Directory { "directory" } else { "regular file" })));
    }
    if st.st_uid != uid {
        return Err(err(path, format!("is owned by uid {}, not {uid}; refusing to use it", st.st_uid)));
    }
    let mode = st.st_mode & 0o7777;
    if mode & !allowed != 0 {
        return Err(err(path, format!("has mode {mode:04o}, more open than {allowed:04o}; refusing to use it")));
    }
    Ok(())
}

/// Where attempts get their directories: a directory this process owns,
/// held open, so what it creates goes there whatever later happens to the
/// path.
#[derive(Debug)]
pub struct WorkRoot {
    path: PathBuf,
    fd: OwnedFd,
    /// Made by [`WorkRoot::fresh`]: removed (when empty) on drop.
    fresh: bool,
}

impl WorkRoot {
    /// The mode of the root: others may pass through it to an attempt's
    /// directory they own (`shared`: jobs run as other users), never list it.
    fn mode(shared: bool) -> u32 {
        if shared {
            0o711
        } else {
            0o700
        }
    }

    /// Opens the directory `path`, making it (0700) if it does not exist.
    /// Its parent (a data dir) is the operator's; when `shared`, this
    /// process's own parent is made passable (`o+x`) so that jobs reach
    /// their files by path. Refused: a link at `path`, a directory another
    /// user owns, or one more open than 0711.
    pub fn open(path: &Path, shared: bool) -> std::io::Result<WorkRoot> {
        let name = path.file_name().ok_or_else(|| err(path, "names no directory"))?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let parent_fd = openat(CWD, parent, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| err(parent, std::io::Error::from(e)))?;
        Self::parent_fit(&parent_fd, parent, shared)?;
        match mkdirat(&parent_fd, name, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(err(path, std::io::Error::from(e))),
        }
        let fd = openat(&parent_fd, name, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| open_err(path, e))?;
        check(&fd, path, FileType::Directory, euid(), 0o711)?;
        fchmod(&fd, Mode::from_raw_mode(Self::mode(shared))).map_err(|e| err(path, std::io::Error::from(e)))?;
        Ok(WorkRoot { path: path.to_path_buf(), fd, fresh: false })
    }

    /// A new directory of a random name in `parent` (the system's temp
    /// dir), created here, so never one another user made or left.
    pub fn fresh(parent: &Path, shared: bool) -> std::io::Result<WorkRoot> {
        let parent_fd = openat(CWD, parent, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| err(parent, std::io::Error::from(e)))?;
        Self::parent_fit(&parent_fd, parent, shared)?;
        for _ in 0..16 {
            let name = format!("gnomon-work-{:016x}", rand::random::<u64>());
            let path = parent.join(&name);
            match mkdirat(&parent_fd, name.as_str(), Mode::from_raw_mode(0o700)) {
                Ok(()) => {}
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(err(&path, std::io::Error::from(e))),
            }
            let fd =
                openat(&parent_fd, name.as_str(), OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
                    .map_err(|e| open_err(&path, e))?;
            check(&fd, &path, FileType::Directory, euid(), 0o700)?;
            fchmod(&fd, Mode::from_raw_mode(Self::mode(shared))).map_err(|e| err(&path, std::io::Error::from(e)))?;
            return Ok(WorkRoot { path, fd, fresh: true });
        }
        Err(err(parent, "no free name for a working directory"))
    }

    /// The parent of a root: nobody but its owner may rename what is in it
    /// (not writable by others, or sticky like `/tmp`); when `shared` and
    /// it is this process's, others may pass through it.
    fn parent_fit(fd: &OwnedFd, path: &Path, shared: bool) -> std::io::Result<()> {
        let st = fstat(fd).map_err(|e| err(path, std::io::Error::from(e)))?;
        let mode = st.st_mode & 0o7777;
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(err(path, format!("has mode {mode:04o}: others could replace what gnomon makes in it")));
        }
        if shared && st.st_uid == euid() && mode & 0o001 == 0 {
            fchmod(fd, Mode::from_raw_mode(mode | 0o011)).map_err(|e| err(path, std::io::Error::from(e)))?;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the directory `name` (one path component) in the root, 0700
    /// and owned by this process until [`PrivateDir::hand_over`]. Anything
    /// already there, a link included, is refused.
    pub fn make_dir(&self, name: &str) -> std::io::Result<PrivateDir> {
        let path = self.path.join(name);
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(err(&path, "is not a plain name"));
        }
        mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)).map_err(|e| open_err(&path, e))?;
        let fd = openat(&self.fd, name, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| open_err(&path, e))?;
        check(&fd, &path, FileType::Directory, euid(), 0o700)?;
        fchmod(&fd, Mode::from_raw_mode(0o700)).map_err(|e| err(&path, std::io::Error::from(e)))?;
        Ok(PrivateDir { path, fd })
    }
}

impl Drop for WorkRoot {
    fn drop(&mut self) {
        if self.fresh {
            // Only when empty: a kept attempt directory stays.
            let _ = std::fs::remove_dir(&self.path);
        }
    }
}

/// A directory made for one attempt, held open.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
    fd: OwnedFd,
}

impl PrivateDir {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open directory, for `fchdir` in the job's process before exec.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Writes a new file `name` (0600, owned by `owner` or by this
    /// process) with `bytes`; its path. Anything already at `name`, a link
    /// included, is refused.
    pub fn write_file(&self, name: &str, bytes: &[u8], owner: Option<Owner>) -> std::io::Result<PathBuf> {
        let path = self.path.join(name);
        let fd = openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| open_err(&path, e))?;
        fchmod(&fd, Mode::from_raw_mode(0o600)).map_err(|e| err(&path, std::io::Error::from(e)))?;
        if let Some(o) = owner {
            let (u, g) = uid_gid(o);
            fchown(&fd, u, g).map_err(|e| err(&path, std::io::Error::from(e)))?;
        }
        check(&fd, &path, FileType::RegularFile, owner.map_or_else(euid, |o| o.0), 0o600)?;
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes).map_err(|e| err(&path, e))?;
        Ok(path)
    }

    /// Gives the directory to the job's user (`owner`), mode 0700, checked
    /// on the open descriptor. Done after its files are written.
    pub fn hand_over(&self, owner: Option<Owner>) -> std::io::Result<()> {
        if let Some(o) = owner {
            let (u, g) = uid_gid(o);
            fchown(&self.fd, u, g).map_err(|e| err(&self.path, std::io::Error::from(e)))?;
        }
        fchmod(&self.fd, Mode::from_raw_mode(0o700)).map_err(|e| err(&self.path, std::io::Error::from(e)))?;
        check(&self.fd, &self.path, FileType::Directory, owner.map_or_else(euid, |o| o.0), 0o700)
    }

    /// Removes the directory and what the attempt left in it (links are
    /// removed, never followed).
    pub fn remove(self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.path.display(), error = %e, "cannot remove an attempt's working directory");
            }
        }
    }
}

#[cfg(test)]
#[path = "private_fs_tests.rs"]
mod tests;
