//! gnomon-backend: the `Store` and `Elector` seams, their backends, and the
//! conformance suites every backend must pass.
//!
//! Store and election are separate seams and can be combined; fencing works
//! across any pair because the *store* checks the token of every leader write.

pub mod caller;
pub mod election;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod model;
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
/// The conformance suites every backend passes, and throwaway test
/// databases (`test-util` feature).
#[cfg(feature = "test-util")]
pub mod testing;

pub use model::*;

use async_trait::async_trait;
use gnomon_core::spec::JobSpec;
use gnomon_core::Millis;

/// Errors of the store. Each says whether retrying may help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum StoreError {
    /// A leader write carried a token that is no longer the scope's current one.
    #[error("fenced: token {token} is not the current token {current} of scope {scope:?}")]
    Fenced { scope: String, token: u64, current: u64 },
    /// `fence` was called with a token not higher than the stored one.
    #[error("stale token: {token} is not higher than the current token {current} of scope {scope:?}")]
    StaleToken { scope: String, token: u64, current: u64 },
    #[error("not found: {0}")]
    NotFound(String),
    #[error("already exists: {0}")]
    AlreadyExists(String),
    #[error("version conflict on {what}: expected version {expected}, found {actual}")]
    VersionConflict { what: String, expected: u64, actual: u64 },
    #[error("invalid transition of run {run}: {from} -> {to}")]
    InvalidTransition { run: String, from: String, to: String },
    #[error("run {0} is already in a terminal state")]
    Terminal(String),
    /// The backend could not be reached or timed out; retrying may help.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store error: {0}")]
    Backend(String),
    #[error("corrupt record: {0}")]
    Corrupt(String),
    #[error("backend {0:?} is not compiled into this build (enable its cargo feature)")]
    NotCompiled(String),
    #[error("invalid store URL: {0}")]
    InvalidUrl(String),
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// Precondition of a job write (in the manner of restate's metadata store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Precondition {
    None,
    DoesNotExist,
    MatchesVersion(u64),
}

/// What [`Store::fire_and_transition`] wrote.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct TurnWrite {
    /// Per new run, as [`Store::fire`] answers.
    pub fired: Vec<FireOutcome>,
    /// Per transition, as [`Store::transition`] answers; an error here means
    /// the fire committed and the transitions did not.
    pub applied: Result<Vec<bool>, StoreError>,
}

/// The persistent state of gnomon.
///
/// # To be correct, an implementation must…
/// - **Fire uniqueness** (invariant 1): `fire` creates at most one run per
///   `(job_uid, scheduled_at)` even when called concurrently from several
///   handles or processes; a duplicate is reported as [`FireOutcome::Existed`]
///   and changes nothing. The run and the job's `last_scheduled_at` advance are
///   written in the same transaction.
/// - **Fencing** (invariant 2): every method taking a [`Fence`] checks, in the
///   same transaction as its writes, that the fence's token is the current
///   token of its scope, and fails with [`StoreError::Fenced`] (writing
///   nothing) otherwise. `fence` only ever raises the token.
/// - **CAS transitions** (invariant 3): a [`Transition`] applies only when the
///   run is in `(from, from_attempt)`; otherwise it is reported as not applied
///   and writes nothing. Transitions outside the lifecycle are rejected;
///   terminal states are final.
/// - **Preconditions** on job writes are checked atomically with the write.
/// - **Pagination** of runs is newest first and stable under concurrent
///   inserts: a cursor never yields a run twice or skips an older one.
/// - **Notifications** are written by the transition that carries them,
///   only if it applies, and are never written twice (insert-or-ignore by
///   id); a delivery changes one only while it is pending with the attempts
///   the deliverer read; pruning a run deletes its notifications.
/// - **Leader time** only moves forward: `advance_leader_time` is fenced and
///   takes the maximum; `fence` leaves it as it is.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// `sqlite`, `mysql`, `postgres`, `etcd` or `raft`.
    fn backend(&self) -> &'static str;

    // --- jobs (any replica writes these directly) ---
    async fn put_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError>;
    async fn set_job_paused(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError>;
    async fn delete_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError>;
    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError>;
    async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>, StoreError>;
    /// The job change feed: jobs written and uids deleted after `since`.
    async fn job_changes(&self, since: u64) -> Result<JobChanges, StoreError>;
    /// Every job's head (uid, version, last fire) without its spec, at one
    /// feed position: what a leader rebuilding its state reads to keep the
    /// jobs it already holds at the stored version.
    async fn job_heads(&self) -> Result<JobHeads, StoreError> {
        let all = self.job_changes(0).await?;
        Ok(JobHeads {
            heads: all
                .upserted
                .into_iter()
                .map(|j| JobHead { uid: j.uid, version: j.version, last_scheduled_at: j.last_scheduled_at })
                .collect(),
            seq: all.seq,
        })
    }
    /// The stored jobs among these uids (a uid with no job is left out).
    async fn jobs_by_uid(&self, uids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
        let wanted: std::collections::HashSet<&str> = uids.iter().map(String::as_str).collect();
        let mut jobs = self.job_changes(0).await?.upserted;
        jobs.retain(|j| wanted.contains(j.uid.as_str()));
        Ok(jobs)
    }

    // --- leadership ---
    /// Bumps and returns the scope's epoch counter (token source for electors
    /// that have no native token).
    async fn next_epoch(&self, scope: &str) -> Result<u64, StoreError>;
    /// Installs `token` as the scope's current token if it is higher than the
    /// stored one; fails with [`StoreError::StaleToken`] otherwise.
    async fn fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError>;
    async fn leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError>;
    /// Raises the scope's committed leader time to `at` if `fence` is the
    /// current token (never lowers it) and returns the committed time;
    /// [`StoreError::Fenced`] otherwise. The leader writes its clock here
    /// every half second; a new leader's clock starts at or above it.
    async fn advance_leader_time(&self, fence: &Fence, at: Millis) -> Result<Millis, StoreError>;

    // --- leader writes (token-checked) ---
    async fn fire(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError>;
    async fn transition(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError>;

    /// One leader write per turn: `fire`, then `transition` (which may move
    /// the runs just fired). The SQL stores do both in one transaction, one
    /// commit. This default makes the two calls; a transition failure after
    /// the fire committed comes back in [`TurnWrite::applied`] (the fire
    /// stands). `Err` means nothing was written.
    async fn fire_and_transition(
        &self,
        fence: &Fence,
        runs: &[NewRun],
        advances: &[JobAdvance],
        transitions: &[Transition],
    ) -> Result<TurnWrite, StoreError> {
        let fired = if runs.is_empty() && advances.is_empty() { Vec::new() } else { self.fire(fence, runs, advances).await? };
        let applied = if transitions.is_empty() { Ok(Vec::new()) } else { self.transition(fence, transitions).await };
        Ok(TurnWrite { fired, applied })
    }

    // --- user writes on runs ---
    /// Cancels a run that has not started (directly) or asks the leader to
    /// stop a live one (`cancel_requested`). Fails on a terminal run.
    async fn request_cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError>;

    // --- queries ---
    async fn get_run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError>;
    async fn list_runs(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError>;
    /// Every run that is not terminal (for leader recovery).
    async fn open_runs(&self) -> Result<Vec<RunRecord>, StoreError>;
    /// Live attempts of runs whose cancellation was requested.
    async fn cancel_requests(&self) -> Result<Vec<RunRecord>, StoreError>;
    /// The worker of every live attempt (runs `assigned` or `running`), for
    /// leader recovery. The default reads each such run; the SQL stores
    /// answer with one join.
    async fn live_attempts(&self) -> Result<Vec<LiveAttempt>, StoreError> {
        let mut out = Vec::new();
        for run in self.open_runs().await? {
            if !matches!(run.state, gnomon_core::RunState::Assigned | gnomon_core::RunState::Running) {
                continue;
            }
            let Some(detail) = self.get_run(&run.id).await? else { continue };
            if let Some(a) = detail.attempts.iter().find(|a| a.attempt == detail.run.attempt) {
                out.push(LiveAttempt { run_id: run.id.clone(), attempt: a.attempt, worker: a.worker.clone() });
            }
        }
        Ok(out)
    }

    // --- notifications (the outbox) ---
    /// Pending notifications due at `now` (oldest due first), at most `limit`.
    async fn due_notifications(&self, now: Millis, limit: u32) -> Result<Vec<Notification>, StoreError>;
    /// Records a delivery, fenced: applies only while the notification is
    /// still pending with `attempts_before` attempts (false otherwise).
    async fn settle_notification(&self, fence: &Fence, delivery: &Delivery) -> Result<bool, StoreError>;
    /// A run's notifications, in id order.
    async fn run_notifications(&self, run_id: &str) -> Result<Vec<Notification>, StoreError>;

    // --- retention (token-checked) ---
    /// Deletes terminal runs (with their attempts) beyond the newest
    /// `keep_per_job` of each job or fired before `before`, at most `max`
    /// of them; returns how many. Open runs are never deleted, and fire
    /// uniqueness holds because a job's `last_scheduled_at` only moves
    /// forward. Every store prunes; this default (nothing) is for test stores.
    async fn prune(&self, _fence: &Fence, _keep_per_job: usize, _before: Millis, _max: usize) -> Result<u64, StoreError> {
        Ok(0)
    }
    /// The store's size in bytes, where the backend reports one (etcd).
    async fn size_bytes(&self) -> Option<u64> {
        None
    }

    // --- worker session leases ---
    /// Worker session liveness kept in the store itself, where the backend
    /// has leases (etcd); `None` keeps it only in the leader's memory.
    fn session_leases(&self) -> Option<std::sync::Arc<dyn SessionLeases>> {
        None
    }

    /// A view of this store whose reads answer from this replica's copy
    /// as it is, without confirming it is current (raft: no read index), for
    /// clients that ask for stale reads; `None` where reads have no such
    /// choice.
    fn stale_reads(&self) -> Option<std::sync::Arc<dyn Store>> {
        None
    }

    /// Where the store's members see each other's clocks (raft: measured on
    /// replication): this leader's clock minus the members' median, in ms,
    /// when a majority answered lately. `None` elsewhere.
    fn cluster_clock_skew(&self) -> Option<i64> {
        None
    }

    /// Whether [`Store::cluster_clock_skew`] can answer here once the
    /// members have been heard from (raft with three voters or more).
    fn measures_cluster_clocks(&self) -> bool {
        false
    }

    /// The store server's own clock (Unix ms) where it has one apart from
    /// this machine's (MySQL, PostgreSQL): the reference a node's clock is
    /// checked against. `None` elsewhere.
    async fn server_clock(&self) -> Result<Option<Millis>, StoreError> {
        Ok(None)
    }

    /// A signal on every job write, where the backend can push one (an etcd
    /// watch): the leader reads `job_changes` at once instead of at its next
    /// poll. `None`: the leader polls (at most a second late).
    fn job_change_signal(&self) -> Option<tokio::sync::mpsc::Receiver<()>> {
        None
    }
}

/// A worker session's lease as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSession {
    pub worker: String,
    pub lease: i64,
    /// Milliseconds the lease has left.
    pub remaining_ms: i64,
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
