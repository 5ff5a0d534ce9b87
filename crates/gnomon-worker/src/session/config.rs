//! A worker's settings: who it is, where the servers are, its capacity
//! and prefetch, its spool, credentials, TLS, isolation and egress.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The largest `prefetch` a worker may ask for and the largest `capacity`
/// it may announce (the server refuses more). With a full prefetch queue, a
/// heartbeat listing every attempt held stays under the 8 MiB message limit
/// of both ends.
pub use gnomon_proto::limits::{MAX_CAPACITY, MAX_PREFETCH};

/// The prefetch queue of a worker that does not choose one: eight times its
/// capacity. This is the most the worker holds, not what it is given: the
/// leader fills a queue only with short runs, only as deep as the worker's
/// recent attempt durations let a queued run start within about 100 ms
/// (the whole depth only for runs of a few milliseconds), and halves it
/// under backpressure.
pub fn default_prefetch(capacity: u32) -> u32 {
    capacity.saturating_mul(8).min(MAX_PREFETCH)
}

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Stable worker id.
    pub id: String,
    /// Server addresses (`host:port`), tried in turn.
    pub servers: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Attempts executed at once.
    pub capacity: u32,
    /// Assignments accepted beyond `capacity`, queued and started as soon
    /// as a slot frees (the leader fills them only with short runs).
    pub prefetch: u32,
    /// Where unacked reports are kept; `None` keeps them in memory only.
    pub spool_dir: Option<PathBuf>,
    pub drain_timeout: Duration,
    /// Fraction of the lease TTL after which unacked heartbeats make the
    /// worker kill its attempts.
    pub self_fence_fraction: f64,
    /// Bearer token for the servers, if they require one.
    pub token: Option<String>,
    /// The executor kinds this worker runs (`shell`, `http`, `handler`);
    /// empty: all of them.
    pub executors: Vec<String>,
    /// How shell jobs are isolated.
    pub isolation: Arc<crate::isolation::Isolation>,
    /// TLS to the servers (`https://`); `None`: plain HTTP/2.
    pub tls: Option<WorkerTls>,
    /// Where HTTP jobs may connect.
    pub egress: crate::egress::Egress,
}

/// TLS settings of a worker's connections. Files are read at every connect,
/// so renewed certificates are picked up without a restart.
#[derive(Debug, Clone, Default)]
pub struct WorkerTls {
    /// PEM roots to trust; `None`: the public web roots.
    pub ca: Option<PathBuf>,
    /// Client certificate and key (PEM), for servers that require mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// A certificate (PEM, first in the file) accepted as is: an embedded
    /// worker's own server's, so a self-signed one works over loopback.
    pub pin: Option<PathBuf>,
}

impl WorkerConfig {
    pub fn new(id: impl Into<String>, servers: Vec<String>) -> Self {
        let capacity = 16;
        Self {
            id: id.into(),
            servers,
            labels: BTreeMap::new(),
            capacity,
            prefetch: default_prefetch(capacity),
            spool_dir: None,
            drain_timeout: Duration::from_secs(30),
            self_fence_fraction: 0.7,
            token: None,
            executors: Vec::new(),
            isolation: Arc::default(),
            tls: None,
            egress: crate::egress::Egress::with_defaults(),
        }
    }
}
