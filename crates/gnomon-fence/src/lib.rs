//! Exactly-once steps for gnomon jobs: a step's database writes commit once
//! per run, whichever attempt gets there first, and every other attempt
//! gets the result that was recorded.
//!
//! gnomon runs each attempt at least once. A worker frozen past its lease
//! (a VM pause, a stop signal, a long GC) has its attempt ended and
//! retried elsewhere; when it wakes, code already running can still reach
//! its database. This crate makes the job's own database the judge: a
//! *step* — a named unit of a run's work, done in one transaction — is
//! recorded in a table (`gnomon_steps`) in the same transaction as the
//! step's writes, keyed by the run and the step's name, so the step
//! commits once, and later calls read what it recorded instead of doing
//! it again.
//!
//! The one-call form is [`run_step`]:
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool, fence: gnomon_fence::Fence) -> Result<(), gnomon_fence::FenceError> {
//! let run_id = &fence.run_id; // the closure may borrow from the caller
//! let payment_id: i64 = gnomon_fence::run_step(&pool, &fence, "charge", |tx| {
//!     Box::pin(async move {
//!         let id: i64 = sqlx::query_scalar("INSERT INTO payments (run_id, amount) VALUES ($1, 10) RETURNING id")
//!             .bind(run_id)
//!             .fetch_one(&mut **tx)
//!             .await?;
//!         Ok::<_, gnomon_fence::FenceError>(id)
//!     })
//! })
//! .await?;
//! // The same id in every attempt of the run that gets here, and one payment row.
//! # Ok(()) }
//! ```
//!
//! The same by hand, with [`guard`] in the caller's transaction:
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool, fence: gnomon_fence::Fence) -> Result<(), gnomon_fence::FenceError> {
//! use gnomon_fence::Step;
//! let mut tx = pool.begin().await?;
//! let id: i64 = match gnomon_fence::guard(&mut tx, &fence, "charge").await? {
//!     Step::Recorded { result, .. } => serde_json::from_value(result).map_err(gnomon_fence::FenceError::BadResult)?,
//!     Step::Fresh(step) => {
//!         let id: i64 = sqlx::query_scalar("INSERT INTO payments (amount) VALUES (10) RETURNING id")
//!             .fetch_one(&mut *tx)
//!             .await?;
//!         step.record(&mut tx, &id).await?;
//!         tx.commit().await?;
//!         id
//!     }
//! };
//! # Ok(()) }
//! ```
//!
//! The guard takes a [`sqlx::Transaction`], so a connection in autocommit
//! mode, where the step record and the writes would commit apart, is
//! refused by the compiler:
//!
//! ```compile_fail
//! # async fn f(pool: sqlx::PgPool, fence: gnomon_fence::Fence) -> Result<(), gnomon_fence::FenceError> {
//! let mut conn = pool.acquire().await?;
//! gnomon_fence::guard(&mut *conn, &fence, "charge").await?; // a connection, not a transaction: does not compile
//! # Ok(()) }
//! ```
//!
//! Call [`begin_attempt`] when an attempt starts (before its first step),
//! so that from then on no older attempt of the run commits a step it has
//! not already committed.
//!
//! # The rule
//!
//! An attempt's [`Fence`] is `(run_id, attempt, token)`. Of two attempts of
//! a run, the *newer* is the one with the higher attempt number, or the
//! same number and a higher token. The database keeps two tables (made by
//! [`create_tables`]; the names take a prefix, `gnomon` by default):
//!
//! - `gnomon_fence`, one row a run: the newest attempt of the run known to
//!   this database to have started. [`begin_attempt`] raises it, and so
//!   does every step commit.
//! - `gnomon_steps`, one row a step of a run, keyed by `(run_id, step)`:
//!   the attempt and token that committed the step, and its result (JSON).
//!
//! Then, for a step of a run:
//!
//! 1. **First commit wins.** At most one transaction commits the step, the
//!    step's record and the step's writes together. Guards of one run are
//!    serialized by a lock on the run's `gnomon_fence` row, taken first.
//! 2. **Every other call gets the record.** A guard that finds the step
//!    recorded returns [`Step::Recorded`] with the committing attempt, its
//!    token and its result, whether the caller is older, newer or the same
//!    attempt; the caller writes nothing.
//! 3. **No new steps for older attempts.** A guard of a step without a
//!    record, by an attempt older than the run's newest started attempt,
//!    is refused with [`FenceError::Superseded`]; the caller rolls back.
//!    Otherwise the guard raises the run's row to the caller, inserts the
//!    step's record and returns [`Step::Fresh`]: the caller does the
//!    step's writes, records a result ([`Fresh::record`]) and commits.
//! 4. **Lock holders are bounded.** A guard waits for the run's row at
//!    most [`Options::lock_wait`] (5 s by default), then fails with
//!    [`FenceError::LockTimeout`], which may be retried. A holder that
//!    stops issuing statements (frozen with the transaction open) has its
//!    session ended by the database after [`Options::idle`] (10 s by
//!    default), which rolls its transaction back and frees the row; its
//!    later commit fails. Keep a step's transaction to database work: a
//!    pause longer than `idle` between two statements ends it too.
//!
//! # What it cannot cover
//!
//! - **Effects outside the transaction.** Only the writes made in the
//!   step's transaction are exactly-once. An email sent is sent, an API
//!   called is called, whatever the step's record says; a step that
//!   commits after such an effect may have been preceded by another
//!   attempt's identical effect. For an HTTP service, gnomon's HTTP jobs
//!   send the fence (`Gnomon-Run-Id`, `Gnomon-Attempt` and
//!   `Gnomon-Fence-Token` headers): run the guard in the *receiving*
//!   service's transaction, with the fence from [`fence_from_headers`].
//! - **A result is what the caller records.** [`Fresh::record`] stores the
//!   value it is given, as JSON; a fresh step committed without it has the
//!   result `null`. Later calls get the JSON back, so a value that does
//!   not survive JSON (a float's bits, a map's key order) comes back as
//!   its JSON form.
//! - **Attempts the database has not heard of.** The `gnomon_fence` row
//!   knows only attempts that called [`begin_attempt`] or committed a step
//!   here; a newer attempt that has done neither does not yet stop an
//!   older one from committing a new step (which the newer then finds
//!   recorded).
//! - **Step names are the caller's.** The same name must mean the same
//!   work in every attempt (no attempt numbers, times or random parts in
//!   it). Names compare byte for byte on both databases (`utf8mb4_bin` on
//!   MySQL/MariaDB): `Charge` and `charge` are two steps.
//!
//! # Databases
//!
//! PostgreSQL and MySQL/MariaDB (InnoDB); see [`create_tables`] for the
//! tables. The limits are set for the guard's transaction on PostgreSQL
//! (`SET LOCAL lock_timeout`, `idle_in_transaction_session_timeout`). On
//! MySQL/MariaDB they can only be set for the session, and stay set on the
//! connection after the transaction: `innodb_lock_wait_timeout`, and for
//! a frozen holder `idle_transaction_timeout` (MariaDB) or `wait_timeout`
//! (MySQL, which has no idle-transaction limit and closes any connection
//! idle that long, in a pool too). A connection the server closed is
//! replaced by the pool. On MySQL/MariaDB a result is at most 65,535 bytes
//! of JSON (`TEXT`).
//!
//! At PostgreSQL's `REPEATABLE READ` or `SERIALIZABLE`, a guard whose
//! snapshot predates another attempt's step commit fails with a
//! serialization error (SQLSTATE 40001) rather than act on a stale view;
//! retry it.
//!
//! # Compared with DBOS Transact's step outputs
//!
//! DBOS Transact records each step's output under the workflow's id and
//! the step's position in it (its `function_id`): in `operation_outputs`
//! (its system database) for steps, and for transaction functions in
//! `transaction_outputs`, in the application database and the function's
//! own transaction. A re-run finds the output and
//! skips the step; two executions of the step at once both run it, and
//! the second to record meets the first's key and fails with a conflict
//! error. Here:
//!
//! - **A fence token, not only a key.** Each record carries the attempt
//!   and the leader token that committed it, and the `gnomon_fence` row
//!   the newest attempt started, so a superseded attempt (a worker that
//!   woke after its lease) is told apart from the current one.
//! - **Results go to older and newer attempts alike.** Whichever attempt
//!   commits first, every other attempt — an older one waking late, or the
//!   retry — gets that result from the guard, not an error.
//! - **Older attempts are refused new steps.** An attempt older than the
//!   newest started one may read recorded steps but commits no new one
//!   ([`FenceError::Superseded`]), instead of carrying on a run that is
//!   now another attempt's.
//! - **Concurrent attempts wait instead of both running.** The record is
//!   inserted by the guard, before the step's writes, under the run's row
//!   lock; the second attempt waits for the first's commit rather than
//!   doing the writes and failing at the end. The wait, and a frozen
//!   holder, are bounded ([`Options::lock_wait`], [`Options::idle`]).
//! - **Named steps.** A step is keyed by a name the caller gives, not by
//!   its position in the run's code.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::{Acquire, Transaction};

pub use gnomon_core::fence::{Fence, FenceParseError};

use sealed::Tables;

/// The prefix of the tables, unless told otherwise: `gnomon_fence` and
/// `gnomon_steps`.
pub const DEFAULT_PREFIX: &str = "gnomon";

/// The step name of a run that is one step.
pub const DEFAULT_STEP: &str = "run";

/// How long a guard waits for the run's row, unless told otherwise.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(5);

/// How long a guarded transaction may sit between statements before the
/// database ends its session, unless told otherwise.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(10);

/// The longest step name: 255 characters.
pub const MAX_STEP_LEN: usize = 255;

/// A boxed future, as [`run_step`]'s closure returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The fence of the attempt that sent an HTTP request (the
/// `Gnomon-Run-Id`, `Gnomon-Attempt` and `Gnomon-Fence-Token` headers
/// gnomon's HTTP jobs carry), for a receiving service.
pub fn fence_from_headers(headers: &http::HeaderMap) -> Result<Fence, FenceError> {
    Ok(Fence::read(["gnomon-run-id", "gnomon-attempt", "gnomon-fence-token"], |k| {
        headers.get(k).and_then(|v| v.to_str().ok()).map(str::to_string)
    })?)
}

/// The fence of a shell job's attempt (`GNOMON_RUN_ID`, `GNOMON_ATTEMPT`,
/// `GNOMON_FENCE_TOKEN`).
pub fn fence_from_env() -> Result<Fence, FenceError> {
    Ok(Fence::from_env()?)
}

/// Where the tables are and how long a guard may wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The tables are `<prefix>_fence` and `<prefix>_steps`: a plain SQL
    /// name (letters, digits, `_`; not starting with a digit), at most 57
    /// characters. [`DEFAULT_PREFIX`] by default.
    pub prefix: String,
    /// The longest wait for a lock (the run's row, and the caller's own
    /// writes in the transaction), then [`FenceError::LockTimeout`].
    /// Rounded up to a millisecond on PostgreSQL, to a second on
    /// MySQL/MariaDB. [`DEFAULT_LOCK_WAIT`] by default.
    pub lock_wait: Duration,
    /// The longest pause between two statements of the guarded
    /// transaction before the database ends the session (and so the
    /// transaction, and its locks). Rounded up like `lock_wait`.
    /// [`DEFAULT_IDLE`] by default.
    pub idle: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options { prefix: DEFAULT_PREFIX.to_string(), lock_wait: DEFAULT_LOCK_WAIT, idle: DEFAULT_IDLE }
    }
}

impl Options {
    /// These options with the tables `<prefix>_fence` and `<prefix>_steps`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// These options with another lock wait.
    pub fn lock_wait(mut self, lock_wait: Duration) -> Self {
        self.lock_wait = lock_wait;
        self
    }

    /// These options with another idle limit.
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }
}

/// What the guard found for a step.
#[derive(Debug)]
#[must_use = "a recorded step's result is the step's; a fresh step is done, recorded and committed by the caller"]
pub enum Step {
    /// The step is committed already, by `attempt` under `token` (older,
    /// newer or the caller's own): write nothing, use `result` (JSON
    /// `null` when nothing was recorded).
    Recorded { attempt: u32, token: u64, result: serde_json::Value },
    /// The step is the caller's: do its writes in the same transaction,
    /// [`Fresh::record`] the result, commit.
    Fresh(Fresh),
}

impl Step {
    /// Whether the step is the caller's to do.
    pub fn is_fresh(&self) -> bool {
        matches!(self, Step::Fresh(_))
    }
}

/// A step the guard gave the caller: its record is inserted (result
/// `null`) in the caller's transaction, and commits with it.
#[derive(Debug)]
#[must_use = "record the step's result before committing"]
pub struct Fresh {
    run_id: String,
    step: String,
    steps_table: String,
}

impl Fresh {
    /// The step's name.
    pub fn step(&self) -> &str {
        &self.step
    }

    /// Records the step's result (as JSON) in the transaction the guard
    /// ran in; commit afterwards. Without it the recorded result is `null`.
    pub fn record<'a, DB: Backend, R: Serialize + ?Sized>(
        self,
        tx: &'a mut Transaction<'_, DB>,
        result: &R,
    ) -> BoxFuture<'a, Result<(), FenceError>> {
        let json = serde_json::to_string(result);
        Box::pin(async move {
            let json = json.map_err(FenceError::BadResult)?;
            DB::record(&mut **tx, &self.steps_table, &self.run_id, &self.step, &json).await
        })
    }
}

/// Why a step may not go on.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// A newer attempt of the run (a higher attempt, or the same attempt
    /// with a higher token) has started, and the step has no record: roll
    /// back; this attempt commits no new step.
    #[error(
        "attempt {mine_attempt} (token {mine_token}) of run {run_id} is superseded: attempt {seen_attempt} (token {seen_token}) has started"
    )]
    Superseded { run_id: String, mine_attempt: u32, mine_token: u64, seen_attempt: u32, seen_token: u64 },
    /// A lock was not had within [`Options::lock_wait`] (PostgreSQL
    /// SQLSTATE 55P03, MySQL/MariaDB error 1205): roll back, and retry the
    /// transaction.
    #[error("a lock wait timed out: {0}")]
    LockTimeout(#[source] sqlx::Error),
    #[error(transparent)]
    Parse(#[from] FenceParseError),
    /// The table prefix is not a plain SQL name.
    #[error("the fence table prefix {0:?} is not a plain SQL name of at most 57 characters")]
    BadTable(String),
    /// The step name is empty or longer than [`MAX_STEP_LEN`] characters.
    #[error("the step name {0:?} is not 1 to 255 characters")]
    BadStep(String),
    /// A result could not be written as JSON, or a recorded one not read
    /// as the caller's type.
    #[error("a step result: {0}")]
    BadResult(#[source] serde_json::Error),
    #[error(transparent)]
    Database(sqlx::Error),
}

impl From<sqlx::Error> for FenceError {
    fn from(e: sqlx::Error) -> Self {
        if is_lock_timeout(&e) {
            FenceError::LockTimeout(e)
        } else {
            FenceError::Database(e)
        }
    }
}

impl FenceError {
    /// Whether the attempt was superseded (as opposed to a database error).
    pub fn is_superseded(&self) -> bool {
        matches!(self, FenceError::Superseded { .. })
    }

    /// Whether the transaction may be retried as it is (a lock wait timed
    /// out).
    pub fn is_lock_timeout(&self) -> bool {
        matches!(self, FenceError::LockTimeout(_))
    }
}

/// Whether a database error is a lock wait that timed out (PostgreSQL
/// SQLSTATE 55P03 `lock_not_available`, MySQL/MariaDB error 1205).
pub fn is_lock_timeout(e: &sqlx::Error) -> bool {
    let Some(d) = e.as_database_error() else { return false };
    #[cfg(feature = "postgres")]
    if let Some(pg) = d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return pg.code() == "55P03";
    }
    #[cfg(feature = "mysql")]
    if let Some(my) = d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return my.number() == 1205;
    }
    let _ = d;
    false
}

/// A database the steps are kept in: PostgreSQL or MySQL/MariaDB.
pub trait Backend: sealed::Dialect {}

impl<D: sealed::Dialect> Backend for D {}

/// Creates `<prefix>_fence` and `<prefix>_steps` if they are missing (a
/// pool, a connection, or a transaction). An existing `<prefix>_fence`
/// made by an earlier version of this crate is kept as it is.
///
/// PostgreSQL:
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS gnomon_fence (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL,
///   token BIGINT NOT NULL, written_at TIMESTAMPTZ NOT NULL DEFAULT now());
/// CREATE TABLE IF NOT EXISTS gnomon_steps (run_id TEXT NOT NULL, step TEXT NOT NULL,
///   attempt BIGINT NOT NULL, token BIGINT NOT NULL, result TEXT,
///   committed_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (run_id, step));
/// ```
///
/// MySQL/MariaDB:
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS gnomon_fence (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY,
///   attempt BIGINT NOT NULL, token BIGINT NOT NULL,
///   written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB;
/// CREATE TABLE IF NOT EXISTS gnomon_steps (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL,
///   step VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, attempt BIGINT NOT NULL,
///   token BIGINT NOT NULL, result TEXT, committed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
///   PRIMARY KEY (run_id, step)) ENGINE=InnoDB;
/// ```
pub async fn create_tables<'a, A, DB>(conn: A, prefix: &str) -> Result<(), FenceError>
where
    A: Acquire<'a, Database = DB>,
    DB: Backend,
{
    let tables = Tables::new(prefix)?;
    let mut conn = conn.acquire().await?;
    DB::create_tables(&mut *conn, &tables).await
}

/// Guards `step` of `fence`'s run in the caller's transaction, before the
/// step's writes, with the default [`Options`]: see [`guard_with`].
pub async fn guard<DB: Backend>(tx: &mut Transaction<'_, DB>, fence: &Fence, step: &str) -> Result<Step, FenceError> {
    guard_with(tx, fence, step, &Options::default()).await
}

/// Guards `step` of `fence`'s run in the caller's transaction, before the
/// step's writes ([the rule](crate#the-rule)):
///
/// - [`Step::Recorded`]: the step is committed already; write nothing,
///   use the result (and commit or roll back, it makes no difference).
/// - [`Step::Fresh`]: the step is the caller's; do its writes,
///   [`Fresh::record`] the result and commit.
/// - [`FenceError::Superseded`]: a newer attempt has started and the step
///   has no record; roll back.
/// - [`FenceError::LockTimeout`]: the run's row was held longer than
///   [`Options::lock_wait`]; roll back and retry.
///
/// The transaction holds the run's row lock until it ends, and from here
/// on its lock waits and pauses are bounded by `options`.
pub async fn guard_with<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    fence: &Fence,
    step: &str,
    options: &Options,
) -> Result<Step, FenceError> {
    let tables = Tables::new(&options.prefix)?;
    check_fence(fence)?;
    check_step(step)?;
    let conn = &mut **tx;
    DB::limit(conn, options).await?;
    let (seen_attempt, seen_token) = DB::lock_run(conn, &tables, fence).await?;
    if newer(fence, seen_attempt, seen_token) {
        // Refused a new step; a recorded one is still the caller's to read.
        return match DB::find_step(conn, &tables, &fence.run_id, step).await? {
            Some(found) => recorded(found),
            None => Err(superseded(fence, seen_attempt, seen_token)),
        };
    }
    if !DB::insert_step(conn, &tables, fence, step).await? {
        let found = DB::find_step(conn, &tables, &fence.run_id, step).await?;
        // The row was there a statement ago and the run's lock is held.
        return recorded(found.ok_or(FenceError::Database(sqlx::Error::RowNotFound))?);
    }
    DB::raise_run(conn, &tables, fence).await?;
    Ok(Step::Fresh(Fresh { run_id: fence.run_id.clone(), step: step.to_string(), steps_table: tables.steps }))
}

/// Marks `fence`'s attempt as started, with the default [`Options`]: see
/// [`begin_attempt_with`].
pub async fn begin_attempt<'a, A, DB>(conn: A, fence: &Fence) -> Result<(), FenceError>
where
    A: Acquire<'a, Database = DB>,
    DB: Backend,
{
    begin_attempt_with(conn, fence, &Options::default()).await
}

/// Marks `fence`'s attempt as the run's newest started one, in a short
/// transaction of its own (pass a pool or a connection, not a transaction,
/// whose commit would be the caller's): from its commit on, older
/// attempts of the run commit no new step. Refused with
/// [`FenceError::Superseded`] when a newer attempt is marked already; a
/// lock wait is bounded as in [`guard_with`].
pub async fn begin_attempt_with<'a, A, DB>(conn: A, fence: &Fence, options: &Options) -> Result<(), FenceError>
where
    A: Acquire<'a, Database = DB>,
    DB: Backend,
{
    let tables = Tables::new(&options.prefix)?;
    check_fence(fence)?;
    let mut tx = conn.begin().await?;
    DB::limit(&mut *tx, options).await?;
    let (seen_attempt, seen_token) = DB::lock_run(&mut *tx, &tables, fence).await?;
    if newer(fence, seen_attempt, seen_token) {
        return Err(superseded(fence, seen_attempt, seen_token));
    }
    DB::raise_run(&mut *tx, &tables, fence).await?;
    tx.commit().await?;
    Ok(())
}

/// Does `step` of `fence`'s run exactly once, with the default [`Options`]:
/// see [`run_step_with`].
pub async fn run_step<'a, A, DB, T, E, F>(conn: A, fence: &Fence, step: &str, f: F) -> Result<T, E>
where
    A: Acquire<'a, Database = DB>,
    DB: Backend,
    T: Serialize + DeserializeOwned,
    E: From<FenceError>,
    F: for<'c> FnOnce(&'c mut Transaction<'a, DB>) -> BoxFuture<'c, Result<T, E>>,
{
    run_step_with(conn, fence, step, &Options::default(), f).await
}

/// Does `step` of `fence`'s run exactly once: begins a transaction on
/// `conn` (a pool or a connection), guards the step ([`guard_with`]), and
/// when the step is fresh runs `f` in the transaction, records what it
/// returns and commits. Returns that, or the result an earlier commit of
/// the step recorded (then `f` is not run).
///
/// `f` gets the transaction (`&mut **tx` is the connection to write
/// through) and returns a boxed future: `|tx| Box::pin(async move { … })`.
/// An error from `f`, or from the guard (as `E::from`), rolls the
/// transaction back.
pub async fn run_step_with<'a, A, DB, T, E, F>(conn: A, fence: &Fence, step: &str, options: &Options, f: F) -> Result<T, E>
where
    A: Acquire<'a, Database = DB>,
    DB: Backend,
    T: Serialize + DeserializeOwned,
    E: From<FenceError>,
    F: for<'c> FnOnce(&'c mut Transaction<'a, DB>) -> BoxFuture<'c, Result<T, E>>,
{
    let mut tx = conn.begin().await.map_err(FenceError::from)?;
    match guard_with(&mut tx, fence, step, options).await? {
        Step::Recorded { result, .. } => {
            // Nothing of the caller's to keep.
            let _ = tx.rollback().await;
            Ok(serde_json::from_value(result).map_err(FenceError::BadResult)?)
        }
        Step::Fresh(fresh) => {
            let value = f(&mut tx).await?;
            fresh.record(&mut tx, &value).await?;
            tx.commit().await.map_err(FenceError::from)?;
            Ok(value)
        }
    }
}

/// Whether what the run's row holds is newer than `fence`: a higher
/// attempt, or the same attempt and a higher token.
fn newer(fence: &Fence, seen_attempt: i64, seen_token: i64) -> bool {
    (seen_attempt, seen_token) > (i64::from(fence.attempt), token(fence))
}

fn token(fence: &Fence) -> i64 {
    i64::try_from(fence.token).unwrap_or(i64::MAX)
}

fn superseded(fence: &Fence, seen_attempt: i64, seen_token: i64) -> FenceError {
    FenceError::Superseded {
        run_id: fence.run_id.clone(),
        mine_attempt: fence.attempt,
        mine_token: fence.token,
        seen_attempt: u32::try_from(seen_attempt).unwrap_or(u32::MAX),
        seen_token: u64::try_from(seen_token).unwrap_or(0),
    }
}

fn recorded((attempt, token, result): (i64, i64, Option<String>)) -> Result<Step, FenceError> {
    let result = match result {
        Some(text) => serde_json::from_str(&text).map_err(FenceError::BadResult)?,
        None => serde_json::Value::Null,
    };
    Ok(Step::Recorded { attempt: u32::try_from(attempt).unwrap_or(u32::MAX), token: u64::try_from(token).unwrap_or(0), result })
}

fn check_fence(fence: &Fence) -> Result<(), FenceError> {
    if fence.run_id.is_empty() || fence.run_id.len() > 255 {
        return Err(FenceParseError::Invalid(format!("run id {:?}", fence.run_id)).into());
    }
    if fence.attempt == 0 {
        return Err(FenceParseError::Invalid("attempt 0".to_string()).into());
    }
    Ok(())
}

fn check_step(step: &str) -> Result<(), FenceError> {
    let n = step.chars().count();
    if n == 0 || n > MAX_STEP_LEN {
        return Err(FenceError::BadStep(step.to_string()));
    }
    Ok(())
}

mod sealed {
    //! What each database does; the generic steps are in the crate root.

    use super::{BoxFuture, Fence, FenceError, Options};

    /// The tables of a prefix.
    #[derive(Debug, Clone)]
    pub struct Tables {
        pub fence: String,
        pub steps: String,
    }

    impl Tables {
        pub fn new(prefix: &str) -> Result<Tables, FenceError> {
            let ok = !prefix.is_empty()
                && prefix.len() <= 57
                && prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !prefix.starts_with(|c: char| c.is_ascii_digit());
            if !ok {
                return Err(FenceError::BadTable(prefix.to_string()));
            }
            Ok(Tables { fence: format!("{prefix}_fence"), steps: format!("{prefix}_steps") })
        }
    }

    /// A run's row as `(attempt, token)`; a step's record as `(attempt,
    /// token, result)`.
    pub type StepRow = (i64, i64, Option<String>);

    pub trait Dialect: sqlx::Database {
        /// Creates the tables if they are missing.
        fn create_tables<'a>(conn: &'a mut Self::Connection, t: &'a Tables) -> BoxFuture<'a, Result<(), FenceError>>;
        /// Bounds lock waits and pauses: for the transaction where the
        /// database can, else for the session.
        fn limit<'a>(conn: &'a mut Self::Connection, o: &'a Options) -> BoxFuture<'a, Result<(), FenceError>>;
        /// Inserts the run's row if it is missing, then locks and reads it.
        fn lock_run<'a>(conn: &'a mut Self::Connection, t: &'a Tables, f: &'a Fence) -> BoxFuture<'a, Result<(i64, i64), FenceError>>;
        /// The step's record, as last committed.
        fn find_step<'a>(
            conn: &'a mut Self::Connection,
            t: &'a Tables,
            run_id: &'a str,
            step: &'a str,
        ) -> BoxFuture<'a, Result<Option<StepRow>, FenceError>>;
        /// Inserts the step's record (result `NULL`) unless it exists;
        /// whether it did.
        fn insert_step<'a>(
            conn: &'a mut Self::Connection,
            t: &'a Tables,
            f: &'a Fence,
            step: &'a str,
        ) -> BoxFuture<'a, Result<bool, FenceError>>;
        /// Sets the run's row to `f`.
        fn raise_run<'a>(conn: &'a mut Self::Connection, t: &'a Tables, f: &'a Fence) -> BoxFuture<'a, Result<(), FenceError>>;
        /// Sets the step's result.
        fn record<'a>(
            conn: &'a mut Self::Connection,
            steps: &'a str,
            run_id: &'a str,
            step: &'a str,
            json: &'a str,
        ) -> BoxFuture<'a, Result<(), FenceError>>;
    }
}

#[cfg(feature = "postgres")]
mod postgres;

#[cfg(feature = "mysql")]
mod mysql;

#[cfg(test)]
mod tests {
    use super::*;

    fn f(attempt: u32, token: u64) -> Fence {
        Fence { run_id: "r".into(), attempt, token }
    }

    #[test]
    fn a_higher_attempt_or_the_same_attempt_with_a_higher_token_is_newer() {
        let me = f(2, 5);
        assert!(!newer(&me, 2, 5), "the same attempt again");
        assert!(!newer(&me, 1, 5));
        assert!(!newer(&me, 1, 9), "an older attempt, whatever its token");
        assert!(!newer(&me, 2, 4));
        assert!(newer(&me, 3, 0));
        assert!(newer(&me, 2, 6));
        assert!(!newer(&f(1, u64::MAX), 1, i64::MAX), "tokens past i64 are the largest");
    }

    #[test]
    fn fences_are_read_from_headers_and_refused_when_malformed() {
        let mut h = http::HeaderMap::new();
        h.insert("Gnomon-Run-Id", "abc-1000".parse().unwrap());
        h.insert("Gnomon-Attempt", "2".parse().unwrap());
        assert!(matches!(fence_from_headers(&h), Err(FenceError::Parse(FenceParseError::Missing(_)))));
        h.insert("Gnomon-Fence-Token", "x".parse().unwrap());
        assert!(matches!(fence_from_headers(&h), Err(FenceError::Parse(FenceParseError::Invalid(_)))));
        h.insert("Gnomon-Fence-Token", "7".parse().unwrap());
        assert_eq!(fence_from_headers(&h).unwrap(), Fence { run_id: "abc-1000".into(), attempt: 2, token: 7 });
    }

    #[test]
    fn names_are_checked() {
        let t = Tables::new("gnomon").unwrap();
        assert_eq!((t.fence.as_str(), t.steps.as_str()), ("gnomon_fence", "gnomon_steps"));
        for bad in ["", "x; drop table y", "1abc", "a-b", &"p".repeat(58)] {
            assert!(matches!(Tables::new(bad), Err(FenceError::BadTable(_))), "{bad:?}");
        }
        assert!(Tables::new(&"p".repeat(57)).is_ok());
        assert!(check_step("run").is_ok());
        assert!(check_step(&"é".repeat(255)).is_ok(), "characters, not bytes");
        assert!(matches!(check_step(""), Err(FenceError::BadStep(_))));
        assert!(matches!(check_step(&"s".repeat(256)), Err(FenceError::BadStep(_))));
        assert!(check_fence(&Fence { run_id: String::new(), attempt: 1, token: 1 }).is_err());
        assert!(check_fence(&Fence { run_id: "r".into(), attempt: 0, token: 1 }).is_err());
        assert!(check_fence(&f(1, 0)).is_ok());
    }

    #[test]
    fn recorded_results_are_json_and_null_when_unrecorded() {
        let Step::Recorded { attempt, token, result } = recorded((2, 7, Some(r#"{"a":[1,"x",null]}"#.into()))).unwrap() else {
            panic!("recorded")
        };
        assert_eq!((attempt, token, result), (2, 7, serde_json::json!({"a": [1, "x", null]})));
        let Step::Recorded { result, .. } = recorded((1, 1, None)).unwrap() else { panic!("recorded") };
        assert_eq!(result, serde_json::Value::Null);
        assert!(matches!(recorded((1, 1, Some("{".into()))), Err(FenceError::BadResult(_))));
    }
}
