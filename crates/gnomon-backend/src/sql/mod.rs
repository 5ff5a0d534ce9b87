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
//!   [`notifications`], [`retention`] (with the probes).
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
//! the job row that carries it.

pub(crate) mod attempts;
pub(crate) mod backend;
pub(crate) mod decode;
pub(crate) mod dialect;
pub(crate) mod driver;
pub(crate) mod errors;
pub(crate) mod jobs;
pub(crate) mod leadership;
pub(crate) mod migrate;
pub(crate) mod notifications;
pub(crate) mod plan;
pub(crate) mod query;
pub(crate) mod retention;
pub(crate) mod runs;
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

/// `items` in order, in slices of at most [`CHUNK`] rows and
/// [`MAX_STATEMENT_BYTES`] of values (`sizes[i]` is item `i`'s; an item
/// larger than that alone goes alone).
pub(crate) fn chunks_by_bytes<'a, T>(items: &'a [T], sizes: &[usize]) -> Vec<&'a [T]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, size) in sizes.iter().enumerate().take(items.len()) {
        if i > start && (i - start >= CHUNK || bytes + size > MAX_STATEMENT_BYTES) {
            out.push(&items[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// Attempt ends carry up to 64 KiB of output each: fewer per statement, so a
/// statement stays under MySQL's default 16 MiB `max_allowed_packet`.
pub(crate) const END_CHUNK: usize = 64;

#[cfg(test)]
mod chunk_tests {
    #[test]
    fn chunks_keep_order_and_stay_under_both_bounds() {
        let items: Vec<usize> = (0..1200).collect();
        let small = vec![10; 1200];
        let lens: Vec<usize> = super::chunks_by_bytes(&items, &small).iter().map(|c| c.len()).collect();
        assert_eq!(lens, [500, 500, 200]);
        let big = vec![3 * 1024 * 1024; 5];
        let chunks = super::chunks_by_bytes(&items[..5], &big);
        assert_eq!(chunks, [&[0, 1][..], &[2, 3], &[4]]);
        let huge = vec![super::MAX_STATEMENT_BYTES * 2, 1];
        assert_eq!(super::chunks_by_bytes(&items[..2], &huge), [&[0][..], &[1]]);
        assert!(super::chunks_by_bytes::<usize>(&[], &[]).is_empty());
    }
}
