//! What every serving process shares: its log, its data-dir lock, its
//! stop signal.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{anyhow, bail, Context};

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    Text,
    /// One JSON object per line (timestamp, level, target, fields), for
    /// log collectors.
    Json,
}

/// The log format of servers and workers, set once from the global
/// `--log-format` before any command runs.
pub static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// What the log shows unless `GNOMON_LOG` says otherwise. The Raft
/// library's own lines (peers unreachable while they restart, at ERROR)
/// are off: the raft store logs what matters itself (members unreachable
/// and back, elections, snapshots installed, a member stopped).
const DEFAULT_LOG: &str = "info,sqlx=warn,openraft=off";

pub(super) fn init_tracing() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("GNOMON_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG));
    if LOG_FORMAT.get() == Some(&LogFormat::Json) {
        let _ = tracing_subscriber::fmt().json().with_env_filter(filter).with_writer(std::io::stderr).try_init();
        log_start_notes();
        return;
    }
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
    log_start_notes();
}

/// The warnings `main` found before logging was set up.
fn log_start_notes() {
    for note in crate::hardening::NOTES.get().into_iter().flatten() {
        tracing::warn!("{note}");
    }
}

pub(super) fn parse_listen(listen: &str) -> anyhow::Result<SocketAddr> {
    listen.parse().map_err(|e| anyhow!("--listen {listen:?} is not an address like 127.0.0.1:7400: {e}"))
}

pub(super) fn default_node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "node".into());
    format!("{host}-{}", std::process::id())
}

/// Holds an exclusive lock on the data directory so two processes never
/// share one embedded store (the local elector would otherwise fence them
/// against each other).
pub(super) struct DirLock {
    _file: std::fs::File,
}

pub(super) fn lock_data_dir(dir: &Path) -> anyhow::Result<DirLock> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).with_context(|| format!("creating data dir {}", dir.display()))?;
    // The store and the spool hold job specs, env and output: owner only
    // (others may at most pass through, to reach the directory of an
    // attempt run as another user).
    // Checked and changed on the open directory, not by path.
    let opened = std::fs::File::open(dir).with_context(|| format!("opening data dir {}", dir.display()))?;
    let meta = opened.metadata().with_context(|| format!("reading data dir {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("data dir {} is not a directory", dir.display());
    }
    if meta.permissions().mode() & 0o066 != 0 {
        opened
            .set_permissions(std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making data dir {} private (0700)", dir.display()))?;
    }
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a file descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        bail!("data dir {} is in use by another gnomon process", dir.display());
    }
    Ok(DirLock { _file: file })
}

pub(super) async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
