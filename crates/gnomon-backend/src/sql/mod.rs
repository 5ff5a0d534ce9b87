//! The SQL stores (SQLite, MySQL/MariaDB, PostgreSQL): one generic
//! implementation of the store's roles, [`SqlStore`], over a [`Backend`]
//! that each database module provides (its pool, its writer connection and
//! its [`Dialect`]).
//!
//! - [`dialect`]: what differs between the databases, as data;
//!   [`query`]: a statement rendered for a dialect as it is built;
//!   [`driver`]: running one on a sqlx connection and reading its rows.
//! - [`backend`]: the [`Backend`] trait and [`SqlStore`] with the helpers
//!   every role uses (the fencing check, the job change counter);
//!   [`decode`]: rows into records.
//! - One file per role: [`jobs`], [`leadership`], [`writes`] (the leader's
//!   fenced writes, with [`attempts`] and [`plan`]), [`runs`],
//!   [`notifications`], [`retention`] (with the probes), [`workers`] (the
//!   worker bindings).
//!
//! # Concurrency model (both databases, default isolation levels)
//! PostgreSQL runs at READ COMMITTED, InnoDB at REPEATABLE READ. Neither
//! default is enough on its own for "check the token, then write", so every
//! leader transaction starts with `SELECT token FROM leadership WHERE scope = ?
//! FOR UPDATE`. A locking read returns the newest *committed* row under both
//! isolation levels (InnoDB's locking reads bypass the snapshot) and holds
//! the row lock until commit, so:
//! - a `fence` by a newer leader (which updates that row) waits for an
//!   in-flight leader write to commit, and every leader write that starts
//!   after it sees the new token and is rejected (invariant 2);
//! - leader writes of one scope are serialised, which makes the existence
//!   check that precedes a fire (`SELECT id … FOR UPDATE`) exact: no other
//!   transaction can insert one of those runs meanwhile. The unique index on
//!   the run id (derived from `(job_uid, scheduled_at)`, apart for manual
//!   runs) and the insert-or-ignore suffix stay as the last line of defence
//!   (invariant 1);
//! - a transition batch locks its runs (`SELECT … FOR UPDATE`), applies the
//!   CAS rules in memory in order, and writes the result with one multi-row
//!   `UPDATE … WHERE (id, state, attempt) IN (…)` whose affected-row count is
//!   checked (invariant 3). sqlx sets `CLIENT_FOUND_ROWS` on MySQL, so the
//!   count is of matched rows on both databases.
//!
//! Job writes from any replica serialise on the `job_change_seq` counter row
//! (`UPDATE … SET value = value + 1` first), which is also what makes the
//! change feed gap-free: a sequence number becomes visible only together with
//! the job row that carries it, and what makes the dependency checks a job
//! write makes in its transaction exact (see [`jobs`]).

pub(crate) mod attempts;
pub(crate) mod backend;
pub(crate) mod backfills;
pub(crate) mod decode;
pub(crate) mod dialect;
pub(crate) mod driver;
pub(crate) mod errors;
pub(crate) mod jobs;
pub(crate) mod leadership;
pub(crate) mod migrate;
#[cfg(all(test, feature = "sqlite", feature = "mysql", feature = "postgres"))]
mod migrate_tests;
pub(crate) mod notifications;
pub(crate) mod plan;
pub(crate) mod query;
pub(crate) mod retention;
pub(crate) mod runs;
pub(crate) mod workers;
pub(crate) mod writes;

pub(crate) use backend::TurnResult;
pub use backend::{Backend, SqlStore};
pub(crate) use dialect::Dialect;
pub(crate) use errors::{db_err, explain_open_error, redact};
pub(crate) use plan::{fold_candidates, latest_advances, RunRow};

tokio::task_local! {
    /// The uid a job created in this task gets, when the caller chose it: a
    /// replicated store applies a job's creation on every member with the
    /// uid its proposer drew.
    pub(crate) static CHOSEN_UID: String;
}

/// Rows per multi-row statement (well under both databases' bind limits).
/// Multi-row statements are built per batch and run with
/// `persistent(false)`: each batch size is a different SQL text, and caching
/// them all (sqlx keeps 100 per connection) held tens of megabytes of
/// prepared statements in a 100,000-job server.
pub(crate) const CHUNK: usize = 500;

/// The most bytes of values one multi-row statement carries: under MySQL's
/// default 16 MiB `max_allowed_packet` with room to spare.
pub(crate) const MAX_STATEMENT_BYTES: usize = 8 * 1024 * 1024;

/// Attempt ends carry up to 64 KiB of output each: fewer per statement, so a
/// statement stays under MySQL's default 16 MiB `max_allowed_packet`.
pub(crate) const END_CHUNK: usize = 64;
