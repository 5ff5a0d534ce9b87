//! What a long-running gnomon process (server, dev, worker, raft member)
//! does at start so that the jobs it runs cannot read its secrets:
//! - it becomes non-dumpable (`PR_SET_DUMPABLE 0`): other processes of the
//!   same user (its shell jobs, without `--run-as`) can no longer read its
//!   `/proc/PID/environ`, `mem` or `maps`, nor ptrace it, and it leaves no
//!   core dump. Children get the usual dumpable state back at `execve`;
//! - it takes the secrets out of its environment once clap has read them
//!   and the notifier has captured its signing secrets: `GNOMON_TOKEN`,
//!   `GNOMON_STORE` (a URL with a password) and every
//!   `GNOMON_NOTIFY_SECRET_*` are unset and their bytes overwritten where
//!   they were (the initial environment block that `/proc/PID/environ`
//!   shows, or the copy a configuration file put there), so nothing it
//!   starts inherits them and no scan of its memory finds them there.
//!
//! All of it runs in `main` before the async runtime starts (one thread).

use std::ffi::CStr;

use clap::parser::ValueSource;
use clap::ArgMatches;

/// The variables that carry a secret, besides `GNOMON_NOTIFY_SECRET_*`.
pub const SECRET_VARS: [&str; 2] = ["GNOMON_TOKEN", "GNOMON_STORE"];

/// What start-up found worth a warning, logged once logging is set up.
pub static NOTES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Marks the process non-dumpable. Returns whether it worked.
pub fn non_dumpable() -> bool {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) == 0 }
}

/// Whether a variable's name marks it as a secret.
pub fn is_secret_var(name: &str) -> bool {
    SECRET_VARS.contains(&name) || name.starts_with(gnomon_core::notify::SECRET_ENV_PREFIX)
}

/// The secrets given as command-line flags (readable by every local user
/// in `/proc/PID/cmdline`), as the flags' names.
pub fn secrets_on_command_line(matches: &ArgMatches) -> Vec<&'static str> {
    let on_line =
        |m: &ArgMatches, id: &str| m.try_get_raw(id).ok().flatten().is_some() && m.value_source(id) == Some(ValueSource::CommandLine);
    let mut found = Vec::new();
    let sub = matches.subcommand().map(|(_, m)| m);
    if on_line(matches, "token") || sub.is_some_and(|m| on_line(m, "token")) {
        found.push("--token");
    }
    if let Some(m) = sub {
        let store_password =
            m.try_get_raw("store").ok().flatten().into_iter().flatten().any(|v| {
                v.to_str().is_some_and(|s| s.split_once("://").is_some_and(|(_, rest)| rest.contains('@')) || s.contains("password"))
            });
        if store_password && on_line(m, "store") {
            found.push("--store");
        }
    }
    found
}

/// Unsets every secret variable and overwrites its bytes in place. Call
/// while the process is single-threaded. Returns the names removed.
pub fn scrub_environment() -> Vec<String> {
    let mut entries: Vec<(*mut libc::c_char, usize)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    // SAFETY: single-threaded (before the runtime starts): nothing changes
    // `environ` while it is walked. Each entry is a NUL-terminated
    // "NAME=value" string, either in the initial environment block (on the
    // stack, writable) or allocated by setenv (heap, writable).
    unsafe {
        let mut p = environ;
        while !p.is_null() && !(*p).is_null() {
            let entry = CStr::from_ptr(*p);
            let bytes = entry.to_bytes();
            if let Some(eq) = bytes.iter().position(|b| *b == b'=') {
                if let Ok(name) = std::str::from_utf8(&bytes[..eq]) {
                    if is_secret_var(name) {
                        names.push(name.to_string());
                        entries.push((*p, bytes.len()));
                    }
                }
            }
            p = p.add(1);
        }
    }
    names.sort();
    names.dedup();
    for n in &names {
        // Edition 2021: a safe call; single-threaded here.
        std::env::remove_var(n);
    }
    // The strings are no longer reachable through `environ` (unsetenv only
    // drops the pointers): wipe them.
    for (ptr, len) in entries {
        // SAFETY: `len` bytes at `ptr` are the entry's own (before its NUL).
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
    }
    names
}

extern "C" {
    static mut environ: *mut *mut libc::c_char;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_variables_are_named() {
        assert!(is_secret_var("GNOMON_TOKEN") && is_secret_var("GNOMON_STORE") && is_secret_var("GNOMON_NOTIFY_SECRET_a__X"));
        assert!(!is_secret_var("GNOMON_TOKEN_FILE") && !is_secret_var("GNOMON_STORE_POOL_MAX") && !is_secret_var("GNOMON_LOG"));
    }
}
