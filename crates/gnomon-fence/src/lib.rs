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

pub use gnomon_core::fence::{Fence, FenceParseError};

pub use api::{begin_attempt, begin_attempt_with, create_tables, guard, guard_with, run_step, run_step_with};
pub use dialect::Backend;
pub use error::{is_lock_timeout, FenceError};
pub use fence::{fence_from_env, fence_from_headers};
pub use options::{Options, DEFAULT_IDLE, DEFAULT_LOCK_WAIT, DEFAULT_PREFIX};
pub use step::{Fresh, Step, DEFAULT_STEP, MAX_STEP_LEN};

mod api;
mod dialect;
mod driver;
mod error;
mod fence;
mod options;
mod statements;
mod step;

#[cfg(feature = "postgres")]
mod postgres;

#[cfg(feature = "mysql")]
mod mysql;

#[cfg(test)]
mod tests;

/// A boxed future, as [`run_step`]'s closure returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
