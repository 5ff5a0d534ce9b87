//! What the networked SQL stores (MySQL/MariaDB and PostgreSQL) share: the
//! dialect differences, error mapping, the migration runner, the in-memory
//! CAS simulation of a transition batch, and the [`sql_store!`] macro that
//! instantiates one `Store` implementation per sqlx driver.
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

use std::collections::HashMap;

use gnomon_core::{Millis, RunState};

use crate::sql::migrate::Migration;
use crate::{AttemptChange, StoreError, Transition};

pub(crate) mod api;
pub(crate) mod api_runs;
pub(crate) mod migrate;
pub(crate) mod store;
pub(crate) mod writes;

pub(crate) use store::sql_store;

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

/// Attempt ends carry up to 64 KiB of output each: fewer per statement, so a
/// statement stays under MySQL's default 16 MiB `max_allowed_packet`.
pub(crate) const END_CHUNK: usize = 64;

pub(crate) struct Dialect {
    pub name: &'static str,
    /// `$1, $2, …` placeholders instead of `?`.
    pub numbered: bool,
    /// `" FOR UPDATE"` where rows are locked by locking reads; empty for
    /// SQLite, whose `BEGIN IMMEDIATE` takes the database's write lock.
    pub for_update: &'static str,
    /// The two-argument maximum: `GREATEST` (MySQL, PostgreSQL) or `MAX` (SQLite).
    pub greatest: &'static str,
    /// How a write transaction begins, if not with the driver's default.
    pub begin: Option<&'static str>,
    /// Rows per multi-row `CASE` update (long, to save round trips). SQLite
    /// compiles a `CASE` with n branches in O(n²); its leader writes do not
    /// take this path (see [`crate::sqlite::write`]).
    pub case_chunk: usize,
    /// Turns an INSERT into insert-or-ignore; `{key}` is a column of the table.
    pub ignore_suffix: &'static str,
    /// A query returning every job's `[uid, version, last_scheduled_at]`
    /// as one JSON array (SQLite, whose driver pays per row), or none.
    pub heads_json: Option<&'static str>,
    pub migrate_lock: &'static str,
    pub migrate_unlock: &'static str,
    pub migrations: &'static [Migration],
    /// The database's size in bytes, one BIGINT (`gnomon_store_size_bytes`).
    pub size_query: &'static str,
    /// The database server's clock, Unix ms as one BIGINT; none where the
    /// database is this machine's (SQLite).
    pub clock_query: Option<&'static str>,
}

impl Dialect {
    /// Rewrites `?` placeholders and `FOR UPDATE` for the dialect.
    pub fn q(&self, sql: &str) -> String {
        let sql = if self.for_update.is_empty() { sql.replace(" FOR UPDATE", "") } else { sql.to_string() };
        if !self.numbered {
            return sql;
        }
        let mut out = String::with_capacity(sql.len() + 8);
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            } else {
                out.push(c);
            }
        }
        out
    }

    pub fn ignore(&self, key: &str) -> String {
        self.ignore_suffix.replace("{key}", key)
    }
}

/// Maps a driver error to a [`StoreError`], saying whether a retry may help.
/// How a lost connection's error begins. A write that meets it has an
/// unknown outcome (the connection may have gone during the commit).
pub(crate) const CONNECTION_LOST: &str = "connection lost: ";

pub(crate) fn db_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => StoreError::Unavailable(format!("{CONNECTION_LOST}{e}")),
        // PostgreSQL ended the session: idle in a transaction or idle past
        // the timeouts, an administrator, a shutdown.
        sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("25P03" | "57P01" | "57P02" | "57P05" | "08003" | "08006")) => {
            StoreError::Unavailable(format!("{CONNECTION_LOST}{e}"))
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Tls(_) => StoreError::Unavailable(e.to_string()),
        sqlx::Error::Database(d) => {
            let code = d.code().map(|c| c.to_string()).unwrap_or_default();
            let msg = d.message();
            // Serialization failure, deadlock, lock or statement timeout:
            // the transaction was rolled back and may be retried.
            if matches!(code.as_str(), "40001" | "40P01" | "55P03" | "57014" | "57P01" | "5" | "6")
                || msg.contains("database is locked")
                || msg.contains("Lock wait timeout")
                || msg.contains("Deadlock found")
                || msg.contains("max_statement_time")
                || msg.contains("maximum statement execution time")
            {
                StoreError::Unavailable(e.to_string())
            } else {
                StoreError::Backend(e.to_string())
            }
        }
        _ => StoreError::Backend(e.to_string()),
    }
}

pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

/// Explains a failure to connect or to use the database, for start-up.
pub(crate) fn explain_open_error(backend: &str, target: &str, e: sqlx::Error) -> StoreError {
    let text = e.to_string();
    let lower = text.to_lowercase();
    if let sqlx::Error::Database(d) = &e {
        let code = d.code().map(|c| c.to_string()).unwrap_or_default();
        if matches!(code.as_str(), "28P01" | "28000") || lower.contains("access denied for user") {
            return StoreError::Unavailable(format!(
                "{backend} at {target}: authentication failed (check the user and password in the URL): {text}"
            ));
        }
        if code == "3D000" || lower.contains("unknown database") {
            return StoreError::Unavailable(format!("{backend} at {target}: the database does not exist (create it first): {text}"));
        }
        if code == "42501" || lower.contains("command denied") || lower.contains("permission denied") {
            return StoreError::Backend(format!("{backend} at {target}: the database user lacks a privilege gnomon needs: {text}"));
        }
    }
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => {
            StoreError::Unavailable(format!("{backend} at {target} is unreachable (is it running, and is the address right?): {text}"))
        }
        sqlx::Error::Tls(_) => StoreError::Unavailable(format!("{backend} at {target}: TLS failed: {text}")),
        _ => StoreError::Unavailable(format!("{backend} at {target}: {text}")),
    }
}

/// The host:port part of a URL, without credentials, for messages.
pub(crate) fn redact(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest).to_string()
}

/// A turn write's fire outcomes (per new run) and applied flags (per transition).
pub(crate) type TurnResult = Result<(Vec<crate::FireOutcome>, Vec<bool>), StoreError>;

/// The state of one run as a transition batch sees it.
#[derive(Debug, Clone)]
pub(crate) struct RunRow {
    pub state: RunState,
    pub attempt: u32,
    pub reason: Option<String>,
    pub next_attempt_at: Option<Millis>,
    pub updated_at: Millis,
    pub cancel_requested: bool,
}

impl RunRow {
    /// A new run's row as a fire inserts it.
    pub(crate) fn inserted(r: &crate::NewRun) -> RunRow {
        RunRow {
            state: r.state,
            attempt: 0,
            reason: r.reason.clone(),
            next_attempt_at: None,
            updated_at: r.fired_at,
            cancel_requested: false,
        }
    }
}

/// The transitions a fire may fold into its inserts, by run id: those that
/// are the only one of their run in the batch (index into `transitions`).
pub(crate) fn fold_candidates(transitions: &[Transition]) -> HashMap<&str, usize> {
    let mut per_run: HashMap<&str, (usize, usize)> = HashMap::new();
    for (i, t) in transitions.iter().enumerate() {
        per_run.entry(t.run_id.as_str()).or_insert((i, 0)).1 += 1;
    }
    per_run.into_iter().filter(|(_, (_, n))| *n == 1).map(|(id, (i, _))| (id, i)).collect()
}

/// A fire's job advances, one per job: the highest time wins
/// (`last_scheduled_at` never goes back).
pub(crate) fn latest_advances(advances: &[crate::JobAdvance]) -> Vec<(&str, Millis)> {
    let mut latest: HashMap<&str, Millis> = HashMap::new();
    for a in advances {
        let e = latest.entry(a.job_uid.as_str()).or_insert(a.last_scheduled_at);
        *e = (*e).max(a.last_scheduled_at);
    }
    latest.into_iter().collect()
}

/// Leader writes done in-process rather than by the shared SQL path: only
/// SQLite has them ([`crate::sqlite::write`]); `None` means "not here".
#[async_trait::async_trait]
pub(crate) trait NativeWrites {
    async fn native_turn_write(
        &self,
        _fence: &crate::Fence,
        _runs: &[crate::NewRun],
        _advances: &[crate::JobAdvance],
        _transitions: &[crate::Transition],
    ) -> Option<TurnResult> {
        None
    }
}

/// The outcome of simulating a batch against the locked rows.
pub(crate) struct Planned<'a> {
    /// Per transition: applied or not.
    pub applied: Vec<bool>,
    /// Per changed run: (id, original state, original attempt, final row).
    pub finals: Vec<(String, RunState, u32, RunRow)>,
    /// Attempt changes of applied transitions, in order.
    pub attempts: Vec<(&'a str, &'a AttemptChange, Millis)>,
}

/// Applies the CAS rule of each transition in order, as the SQLite store's
/// one-`UPDATE`-per-transition loop would, against rows locked by the caller.
pub(crate) fn plan_transitions<'a>(locked: HashMap<String, RunRow>, batch: &'a [Transition]) -> Planned<'a> {
    let mut current = locked;
    let mut original: HashMap<String, (RunState, u32)> = HashMap::new();
    let mut order = Vec::new();
    let mut applied = Vec::with_capacity(batch.len());
    let mut attempts = Vec::new();
    for t in batch {
        let Some(row) = current.get_mut(&t.run_id) else {
            applied.push(false);
            continue;
        };
        let before = (row.state, row.attempt);
        if !t.apply_to(crate::model::run_cas!(row)) {
            applied.push(false);
            continue;
        }
        if !original.contains_key(&t.run_id) {
            original.insert(t.run_id.clone(), before);
            order.push(t.run_id.clone());
        }
        if let Some(change) = &t.attempt {
            attempts.push((t.run_id.as_str(), change, t.at));
        }
        applied.push(true);
    }
    let finals = order
        .into_iter()
        .map(|id| {
            let (s, a) = original[&id];
            let row = current[&id].clone();
            (id, s, a, row)
        })
        .collect();
    Planned { applied, finals, attempts }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: RunState, attempt: u32) -> RunRow {
        RunRow { state, attempt, reason: None, next_attempt_at: None, updated_at: 0, cancel_requested: true }
    }

    fn t(id: &str, from: RunState, fa: u32, to: RunState, ta: u32) -> Transition {
        Transition {
            run_id: id.into(),
            from,
            from_attempt: fa,
            to,
            to_attempt: ta,
            reason: None,
            next_attempt_at: None,
            attempt: None,
            at: 7,
            notify: Vec::new(),
        }
    }

    #[test]
    fn placeholders_are_numbered_for_postgres() {
        let d = Dialect {
            name: "x",
            numbered: true,
            for_update: " FOR UPDATE",
            greatest: "GREATEST",
            begin: None,
            case_chunk: 32,
            ignore_suffix: "",
            heads_json: None,
            migrate_lock: "",
            migrate_unlock: "",
            migrations: &[],
            size_query: "",
            clock_query: None,
        };
        assert_eq!(d.q("a = ? AND b = ? FOR UPDATE"), "a = $1 AND b = $2 FOR UPDATE");
        let d = Dialect { numbered: false, for_update: "", ..d };
        assert_eq!(d.q("a = ? FOR UPDATE"), "a = ?");
    }

    #[test]
    fn plan_chains_transitions_and_rejects_wrong_state() {
        let mut locked = HashMap::new();
        locked.insert("r1".to_string(), row(RunState::Assigned, 1));
        locked.insert("r2".to_string(), row(RunState::Pending, 0));
        let batch = vec![
            t("r1", RunState::Assigned, 1, RunState::Running, 1),
            t("r1", RunState::Running, 1, RunState::Succeeded, 1),
            t("r2", RunState::Running, 1, RunState::Succeeded, 1),
            t("missing", RunState::Pending, 0, RunState::Assigned, 1),
            t("r1", RunState::Running, 1, RunState::Failed, 1),
        ];
        let plan = plan_transitions(locked, &batch);
        assert_eq!(plan.applied, vec![true, true, false, false, false]);
        assert_eq!(plan.finals.len(), 1);
        let (id, from, from_attempt, fin) = &plan.finals[0];
        assert_eq!((id.as_str(), *from, *from_attempt), ("r1", RunState::Assigned, 1));
        assert_eq!(fin.state, RunState::Succeeded);
        assert!(!fin.cancel_requested, "a terminal run's cancel request is cleared");
        assert_eq!(fin.updated_at, 7);
    }

    #[test]
    fn redact_hides_credentials() {
        assert_eq!(redact("mysql://root:secret@127.0.0.1:3306/test?ssl-mode=disabled"), "127.0.0.1:3306");
        assert_eq!(redact("postgres://127.0.0.1/test"), "127.0.0.1");
    }
}
