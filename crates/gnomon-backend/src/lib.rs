//! gnomon-backend: the `Store` and `Elector` seams, their backends, and the
//! conformance suites every backend must pass.
//!
//! Store and election are separate seams and can be combined; fencing works
//! across any pair because the *store* checks the token of every leader write.

pub mod caller;
mod chunks;
pub mod election;
pub mod electors;
#[cfg(feature = "etcd")]
pub mod etcd;
mod graph;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "raft")]
pub mod raft;
#[cfg(any(feature = "mysql", feature = "postgres", feature = "sqlite"))]
mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod store;
/// The conformance suites every backend passes, and throwaway test
/// databases (`test-util` feature).
#[cfg(feature = "test-util")]
pub mod testing;

pub use gnomon_records::*;
pub use gnomon_records::{model, spec_error};
pub use store::*;

use async_trait::async_trait;

/// The kind of store a URL names, from its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// `sqlite://FILE`: embedded, one server.
    Sqlite,
    /// `mysql://` or `mariadb://`.
    MySql,
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `etcd://HOST:PORT,…`.
    Etcd,
    /// `raft://DIR`: this server is a member of an embedded Raft cluster.
    Raft,
}

impl StoreKind {
    /// The kind of `url`, or `None` for a scheme no store has.
    pub fn of(url: &str) -> Option<StoreKind> {
        Some(match url.split_once("://")?.0 {
            "sqlite" => StoreKind::Sqlite,
            "mysql" | "mariadb" => StoreKind::MySql,
            "postgres" | "postgresql" => StoreKind::Postgres,
            "etcd" => StoreKind::Etcd,
            "raft" => StoreKind::Raft,
            _ => return None,
        })
    }

    /// Its name in messages and the backend label of metrics.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Sqlite => "sqlite",
            StoreKind::MySql => "mysql",
            StoreKind::Postgres => "postgres",
            StoreKind::Etcd => "etcd",
            StoreKind::Raft => "raft",
        }
    }

    /// Whether servers on other machines may share it, so that a local
    /// elector would make each of them a leader.
    pub fn is_shared(self) -> bool {
        matches!(self, StoreKind::MySql | StoreKind::Postgres | StoreKind::Etcd)
    }
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Worker sessions kept alive in the store: each live session has
/// a key bound to a lease of its own, refreshed while its heartbeats arrive;
/// when the lease runs out the key is deleted, and the leader, watching,
/// evicts that worker's attempts. A new leader adopts the live keys.
#[async_trait]
pub trait SessionLeases: Send + Sync + std::fmt::Debug {
    /// Registers a live session of `worker` under a new lease of `ttl`
    /// (a leader write); returns the lease.
    async fn register(&self, fence: &Fence, worker: &str, ttl: std::time::Duration) -> Result<i64, StoreError>;
    /// Refreshes a lease once; `false` if it has already expired.
    async fn refresh(&self, lease: i64) -> Result<bool, StoreError>;
    /// Ends a lease (its key goes with it).
    async fn release(&self, lease: i64) -> Result<(), StoreError>;
    /// The sessions alive now.
    async fn live(&self) -> Result<Vec<LiveSession>, StoreError>;
    /// From now on, `(worker, lease)` of every session key deleted (lease
    /// expired or revoked). The watch behind it resumes from the last
    /// revision it saw when its stream breaks.
    fn deletions(&self) -> tokio::sync::mpsc::Receiver<(String, i64)>;
}

/// Leadership of a scope, handed out by an [`Elector`].
#[derive(Debug)]
pub struct Leadership {
    pub scope: String,
    pub token: u64,
    /// Turns `true` when leadership is lost (lease expired, lock or
    /// connection gone). Leader loops must stop within 1 s of it.
    pub lost: tokio::sync::watch::Receiver<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElectionError {
    #[error("election backend unavailable: {0}")]
    Unavailable(String),
    #[error("election refused: {0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Leader election for a scope.
///
/// # To be correct, an implementation must…
/// - grant a scope to at most one candidate at a time;
/// - hand out a token that strictly increases across terms of a scope, and
///   `fence` the store with it before returning from `campaign`;
/// - set `lost` as soon as it can no longer be sure it leads;
/// - on `resign`, release promptly so another candidate can win.
#[async_trait]
pub trait Elector: Send + Sync + std::fmt::Debug {
    fn backend(&self) -> &'static str;
    /// Waits until this node leads `scope`.
    async fn campaign(&self, scope: &str, me: &LeaderInfo) -> Result<Leadership, ElectionError>;
    async fn resign(&self, leadership: &Leadership) -> Result<(), ElectionError>;
    /// The advertised address of the scope's leader as the election backend
    /// sees it, where it keeps one (etcd's election value). `None` means
    /// "ask the store's leadership record".
    async fn current_leader(&self, _scope: &str) -> Option<String> {
        None
    }
}

static FENCING_REJECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts a leader write rejected by the fencing check, in
/// `gnomon_fencing_rejections_total` and in [`fencing_rejections`].
pub fn count_fencing_rejection() {
    FENCING_REJECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    metrics::counter!("gnomon_fencing_rejections_total").increment(1);
}

/// Fencing rejections counted by this process so far.
pub fn fencing_rejections() -> u64 {
    FENCING_REJECTIONS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Connection settings of the networked stores (MySQL, PostgreSQL). TLS
/// and credentials come from the URL itself.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Most connections in the pool.
    pub pool_max: u32,
    /// Connections kept open when idle.
    pub pool_min: u32,
    /// Longest wait for a connection (connecting included).
    pub connect_timeout: std::time::Duration,
    /// Longest a single statement may run.
    pub statement_timeout: std::time::Duration,
    /// Longest a statement waits for a row lock.
    pub lock_timeout: std::time::Duration,
    /// A connection that sits inside a transaction without sending anything
    /// for this long is closed by the server, rolling the transaction back.
    /// It bounds how long a paused or cut-off leader can hold the row locks
    /// of a half-done write, which would otherwise block its successor's
    /// `fence`. Servers set it to the election TTL.
    pub idle_in_transaction_timeout: std::time::Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            pool_max: 10,
            pool_min: 1,
            connect_timeout: std::time::Duration::from_secs(5),
            statement_timeout: std::time::Duration::from_secs(30),
            lock_timeout: std::time::Duration::from_secs(10),
            idle_in_transaction_timeout: std::time::Duration::from_secs(5),
        }
    }
}

/// Opens a store from its URL with default connection settings.
pub async fn open_store(url: &str) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    open_store_with(url, &StoreOptions::default()).await
}

/// Opens a store from its URL (applying its migrations). Backends that are
/// not compiled in answer with [`StoreError::NotCompiled`].
pub async fn open_store_with(url: &str, options: &StoreOptions) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    if options.pool_max == 0 || options.pool_min > options.pool_max {
        return Err(StoreError::InvalidUrl(format!(
            "pool sizes must satisfy 1 <= max and min <= max (got min {}, max {})",
            options.pool_min, options.pool_max
        )));
    }
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s)
        .ok_or_else(|| StoreError::InvalidUrl(format!("{url:?} has no scheme (expected sqlite://, mysql://, postgres:// or etcd://)")))?;
    match scheme {
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(std::sync::Arc::new(sqlite::SqliteStore::open(url).await?)),
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => Err(StoreError::NotCompiled(scheme.to_string())),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(std::sync::Arc::new(mysql::MySqlStore::open(&url.replacen("mariadb://", "mysql://", 1), options).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(std::sync::Arc::new(postgres::PgStore::open(url, options).await?)),
        #[cfg(not(feature = "mysql"))]
        "mysql" | "mariadb" => Err(StoreError::NotCompiled(scheme.to_string())),
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => Err(StoreError::NotCompiled(scheme.to_string())),
        #[cfg(feature = "etcd")]
        "etcd" => Ok(std::sync::Arc::new(etcd::EtcdStore::open(url).await?)),
        #[cfg(not(feature = "etcd"))]
        "etcd" => Err(StoreError::NotCompiled(scheme.to_string())),
        other => Err(StoreError::InvalidUrl(format!("unknown store scheme {other:?}"))),
    }
}
