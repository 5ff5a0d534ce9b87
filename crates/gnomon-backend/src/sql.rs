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

use crate::migrate::Migration;
use crate::{AttemptChange, StoreError, Transition};

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
    /// take this path (see [`crate::sqlite_write`]).
    pub case_chunk: usize,
    /// Turns an INSERT into insert-or-ignore; `{key}` is a column of the table.
    pub ignore_suffix: &'static str,
    /// A query returning every job's `[uid, version, last_scheduled_at]`
    /// as one JSON array (SQLite, whose driver pays per row), or none.
    pub heads_json: Option<&'static str>,
    pub migrate_lock: &'static str,
    pub migrate_unlock: &'static str,
    pub migrations: &'static [Migration],
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
/// SQLite has them ([`crate::sqlite_write`]); `None` means "not here".
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

/// Instantiates the `Store` implementation for one sqlx driver. The macro
/// keeps a single copy of the logic while every query stays monomorphic
/// (generic sqlx code over `Database` needs unwieldy higher-ranked bounds).
macro_rules! sql_store {
    ($store:ident, $db:ty, $row:ty, $dialect:expr) => {
        use std::collections::{HashMap, HashSet};

        use async_trait::async_trait;
        use gnomon_core::spec::JobSpec;
        use gnomon_core::{AttemptState, Millis, RunState};
        use sqlx::{QueryBuilder, Row, Transaction};

        use crate::sql::{
            db_err, is_unique_violation, plan_transitions, NativeWrites, RunRow, CHUNK, END_CHUNK,
        };
        use crate::*;

        const D: &crate::sql::Dialect = &$dialect;

        fn to_u64(v: i64) -> u64 {
            u64::try_from(v).unwrap_or(0)
        }
        fn to_i64(v: u64) -> i64 {
            i64::try_from(v).unwrap_or(i64::MAX)
        }
        fn new_uid() -> String {
            format!("{:016x}", rand::random::<u64>())
        }

        /// A text column. MySQL reports columns with a `_bin` collation (used
        /// so names compare case-sensitively, as on the other backends) as
        /// binary, so those are read as bytes and checked as UTF-8.
        fn text(r: &$row, column: &str) -> Result<String, StoreError> {
            match r.try_get::<String, _>(column) {
                Ok(s) => Ok(s),
                Err(_) => {
                    let bytes: Vec<u8> = r.try_get(column).map_err(db_err)?;
                    String::from_utf8(bytes).map_err(|e| StoreError::Corrupt(format!("column {column}: {e}")))
                }
            }
        }

        fn opt_text(r: &$row, column: &str) -> Result<Option<String>, StoreError> {
            match r.try_get::<Option<String>, _>(column) {
                Ok(s) => Ok(s),
                Err(_) => {
                    let bytes: Option<Vec<u8>> = r.try_get(column).map_err(db_err)?;
                    bytes.map(|b| String::from_utf8(b).map_err(|e| StoreError::Corrupt(format!("column {column}: {e}")))).transpose()
                }
            }
        }

        fn job_from_row(r: &$row) -> Result<JobRecord, StoreError> {
            let spec_text = text(r, "spec")?;
            let spec: JobSpec = serde_json::from_str(&spec_text).map_err(|e| StoreError::Corrupt(format!("job spec: {e}")))?;
            Ok(JobRecord {
                uid: text(r, "uid")?,
                namespace: text(r, "namespace")?,
                name: text(r, "name")?,
                spec,
                version: to_u64(r.try_get("version").map_err(db_err)?),
                paused: r.try_get::<i64, _>("paused").map_err(db_err)? != 0,
                created_at: r.try_get("created_at").map_err(db_err)?,
                updated_at: r.try_get("updated_at").map_err(db_err)?,
                last_scheduled_at: r.try_get("last_scheduled_at").map_err(db_err)?,
                paused_at: r.try_get("paused_at").map_err(db_err)?,
                resumed_at: r.try_get("resumed_at").map_err(db_err)?,
                schedule_changed_at: r.try_get("schedule_changed_at").map_err(db_err)?,
                previous_schedule: opt_text(r, "previous_schedule")?
                    .map(|t| serde_json::from_str(&t))
                    .transpose()
                    .map_err(|e| StoreError::Corrupt(format!("job previous_schedule: {e}")))?,
                change_seq: to_u64(r.try_get("change_seq").map_err(db_err)?),
            })
        }

        fn run_from_row(r: &$row) -> Result<RunRecord, StoreError> {
            let state = text(r, "state")?;
            Ok(RunRecord {
                id: text(r, "id")?,
                seq: r.try_get("seq").map_err(db_err)?,
                job_uid: text(r, "job_uid")?,
                job: text(r, "job")?,
                namespace: text(r, "namespace")?,
                scheduled_at: r.try_get("scheduled_at").map_err(db_err)?,
                fired_at: r.try_get("fired_at").map_err(db_err)?,
                state: RunState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("run state {state:?}")))?,
                attempt: u32::try_from(r.try_get::<i64, _>("attempt").map_err(db_err)?).unwrap_or(0),
                reason: opt_text(r, "reason")?,
                next_attempt_at: r.try_get("next_attempt_at").map_err(db_err)?,
                manual: r.try_get::<i64, _>("manual").map_err(db_err)? != 0,
                cancel_requested: r.try_get::<i64, _>("cancel_requested").map_err(db_err)? != 0,
                updated_at: r.try_get("updated_at").map_err(db_err)?,
            })
        }

        fn attempt_from_row(r: &$row) -> Result<AttemptRecord, StoreError> {
            let state = text(r, "state")?;
            Ok(AttemptRecord {
                attempt: u32::try_from(r.try_get::<i64, _>("attempt").map_err(db_err)?).unwrap_or(0),
                worker: text(r, "worker")?,
                token: to_u64(r.try_get("token").map_err(db_err)?),
                state: AttemptState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("attempt state {state:?}")))?,
                assigned_at: r.try_get("assigned_at").map_err(db_err)?,
                started_at: r.try_get("started_at").map_err(db_err)?,
                ended_at: r.try_get("ended_at").map_err(db_err)?,
                exit_code: r.try_get::<Option<i64>, _>("exit_code").map_err(db_err)?.and_then(|c| i32::try_from(c).ok()),
                output: text(r, "output")?,
            })
        }

        type Tx<'c> = Transaction<'c, $db>;

        impl $store {
            /// Applies the dialect's migrations under a database-wide lock, so
            /// several servers starting at once migrate exactly once.
            pub async fn migrate(&self) -> Result<i64, StoreError> {
                let mut conn = self.pool.acquire().await.map_err(db_err)?;
                sqlx::raw_sql(D.migrate_lock).execute(&mut *conn).await.map_err(db_err)?;
                let result = async {
                    sqlx::query("CREATE TABLE IF NOT EXISTS gnomon_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)")
                        .execute(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    let current: Option<i64> =
                        sqlx::query_scalar("SELECT MAX(version) FROM gnomon_migrations").fetch_one(&mut *conn).await.map_err(db_err)?;
                    let applied = current.unwrap_or(0);
                    let mut version = applied;
                    for m in D.migrations.iter().filter(|m| m.version > applied) {
                        for stmt in m.statements {
                            sqlx::raw_sql(stmt).execute(&mut *conn).await.map_err(|e| {
                                StoreError::Backend(format!("migration {} of the {} store failed: {e}", m.version, D.name))
                            })?;
                        }
                        sqlx::query(&D.q("INSERT INTO gnomon_migrations (version, applied_at) VALUES (?, ?)"))
                            .bind(m.version)
                            .bind(chrono_now_ms())
                            .execute(&mut *conn)
                            .await
                            .map_err(db_err)?;
                        version = m.version;
                    }
                    Ok::<i64, StoreError>(version)
                }
                .await;
                let _ = sqlx::raw_sql(D.migrate_unlock).execute(&mut *conn).await;
                result
            }

            /// Exercises every kind of statement gnomon issues, in a
            /// transaction that is rolled back, so a missing privilege is
            /// reported at start rather than at the first fire.
            pub async fn probe(&self) -> Result<(), StoreError> {
                let mut tx = self.pool.begin().await.map_err(db_err)?;
                let steps: [&str; 5] = [
                    "SELECT value FROM counters WHERE name = 'job_change_seq' FOR UPDATE",
                    "UPDATE counters SET value = value WHERE name = 'job_change_seq'",
                    "INSERT INTO job_deletions (uid, change_seq) VALUES ('gnomon-probe', 0)",
                    "DELETE FROM job_deletions WHERE uid = 'gnomon-probe'",
                    "SELECT id FROM runs WHERE id = 'gnomon-probe' FOR UPDATE",
                ];
                for step in steps {
                    if let Err(e) = sqlx::query(&D.q(step)).execute(&mut *tx).await {
                        return Err(StoreError::Backend(format!(
                            "the {} user cannot run `{step}` (missing privilege?): {e}",
                            D.name
                        )));
                    }
                }
                tx.rollback().await.map_err(db_err)
            }

            /// Begins a write transaction on the store's writer connection
            /// (see `writer_conn`).
            async fn begin_write<'c>(conn: &'c mut <$db as sqlx::Database>::Connection) -> Result<Tx<'c>, StoreError> {
                match D.begin {
                    Some(begin) => sqlx::Connection::begin_with(conn, begin).await.map_err(db_err),
                    None => sqlx::Connection::begin(conn).await.map_err(db_err),
                }
            }

            /// The fencing check: locks the scope's leadership row until the
            /// caller's transaction ends.
            async fn check_fence(tx: &mut Tx<'_>, fence: &Fence) -> Result<(), StoreError> {
                let current: Option<i64> = sqlx::query_scalar(&D.q("SELECT token FROM leadership WHERE scope = ? FOR UPDATE"))
                    .bind(&fence.scope)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_err)?;
                let current = current.map(to_u64).unwrap_or(0);
                if current != fence.token {
                    crate::count_fencing_rejection();
                    return Err(StoreError::Fenced { scope: fence.scope.clone(), token: fence.token, current });
                }
                Ok(())
            }

            async fn bump_change_seq(tx: &mut Tx<'_>) -> Result<i64, StoreError> {
                sqlx::query("UPDATE counters SET value = value + 1 WHERE name = 'job_change_seq'")
                    .execute(&mut **tx)
                    .await
                    .map_err(db_err)?;
                sqlx::query_scalar("SELECT value FROM counters WHERE name = 'job_change_seq'").fetch_one(&mut **tx).await.map_err(db_err)
            }

            async fn job_by_name(tx: &mut Tx<'_>, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
                sqlx::query(&D.q("SELECT * FROM jobs WHERE namespace = ? AND name = ? FOR UPDATE"))
                    .bind(namespace)
                    .bind(name)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_err)?
                    .map(|r| job_from_row(&r))
                    .transpose()
            }

            /// Inserts the scope's row of `table` if it is missing.
            async fn ensure_scope_row(tx: &mut Tx<'_>, table: &str, scope: &str) -> Result<(), StoreError> {
                let sql = match table {
                    "epochs" => format!("INSERT INTO epochs (scope, epoch) VALUES (?, 0){}", D.ignore("scope")),
                    _ => format!(
                        "INSERT INTO leadership (scope, token, holder, address, backend, since) VALUES (?, 0, '', '', '', 0){}",
                        D.ignore("scope")
                    ),
                };
                sqlx::query(&D.q(&sql)).bind(scope).execute(&mut **tx).await.map_err(db_err)?;
                Ok(())
            }

            async fn apply_attempt_changes(tx: &mut Tx<'_>, changes: &[(&str, &AttemptChange, Millis)]) -> Result<(), StoreError> {
                let assigns: Vec<_> = changes.iter().filter(|(_, c, _)| matches!(c, AttemptChange::Assign { .. })).collect();
                for chunk in assigns.chunks(CHUNK) {
                    let mut qb: QueryBuilder<$db> =
                        QueryBuilder::new("INSERT INTO attempts (run_id, attempt, worker, token, state, assigned_at, output) ");
                    qb.push_values(chunk, |mut b, (run_id, change, at)| {
                        if let AttemptChange::Assign { attempt, worker, token } = change {
                            b.push_bind(run_id.to_string())
                                .push_bind(i64::from(*attempt))
                                .push_bind(worker.clone())
                                .push_bind(to_i64(*token))
                                .push_bind("assigned")
                                .push_bind(*at)
                                .push_bind("");
                        }
                    });
                    qb.build().persistent(false).execute(&mut **tx).await.map_err(db_err)?;
                }
                let starts: Vec<_> = changes.iter().filter(|(_, c, _)| matches!(c, AttemptChange::Start { .. })).collect();
                let ends: Vec<_> = changes.iter().filter(|(_, c, _)| matches!(c, AttemptChange::End { .. })).collect();
                for chunk in starts.chunks(D.case_chunk) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("UPDATE attempts SET state = 'running', started_at = CASE");
                    for (run_id, change, at) in chunk {
                        if let AttemptChange::Start { attempt } = change {
                            qb.push(" WHEN run_id = ").push_bind(run_id.to_string());
                            qb.push(" AND attempt = ").push_bind(i64::from(*attempt));
                            qb.push(" THEN ").push_bind(*at);
                        }
                    }
                    qb.push(" ELSE started_at END WHERE state = 'assigned' AND ");
                    push_attempt_keys(&mut qb, chunk.iter().map(|(r, c, _)| attempt_key(r, c)).collect());
                    qb.build().persistent(false).execute(&mut **tx).await.map_err(db_err)?;
                }
                for chunk in ends.chunks(END_CHUNK.min(D.case_chunk)) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("UPDATE attempts SET ");
                    // One CASE per column, keyed by (run_id, attempt).
                    for (i, column) in ["state", "ended_at", "started_at", "exit_code", "output"].iter().enumerate() {
                        if i > 0 {
                            qb.push(", ");
                        }
                        qb.push(*column).push(" = CASE");
                        for (run_id, change, at) in chunk.iter() {
                            if let AttemptChange::End { attempt, state, exit_code, output, started_at } = change {
                                qb.push(" WHEN run_id = ").push_bind(run_id.to_string());
                                qb.push(" AND attempt = ").push_bind(i64::from(*attempt));
                                qb.push(" THEN ");
                                match *column {
                                    "state" => qb.push_bind(state.as_str()),
                                    "ended_at" => qb.push_bind(*at),
                                    "started_at" => qb.push("COALESCE(started_at, ").push_bind(*started_at).push(", ").push_bind(*at).push(")"),
                                    "exit_code" => qb.push_bind(exit_code.map(i64::from)),
                                    _ => qb.push_bind(output.clone()),
                                };
                            }
                        }
                        qb.push(" ELSE ").push(*column).push(" END");
                    }
                    qb.push(" WHERE state IN ('assigned', 'running') AND ");
                    push_attempt_keys(&mut qb, chunk.iter().map(|(r, c, _)| attempt_key(r, c)).collect());
                    qb.build().persistent(false).execute(&mut **tx).await.map_err(db_err)?;
                }
                Ok(())
            }
        }

        fn attempt_key(run_id: &str, change: &AttemptChange) -> (String, i64) {
            let attempt = match change {
                AttemptChange::Assign { attempt, .. } | AttemptChange::Start { attempt } | AttemptChange::End { attempt, .. } => *attempt,
            };
            (run_id.to_string(), i64::from(attempt))
        }

        /// Pushes `run_id IN (…) AND (run_id, attempt) IN ((k1, a1), …)`; the
        /// plain list lets every planner use the primary key.
        fn push_attempt_keys(qb: &mut QueryBuilder<'_, $db>, keys: Vec<(String, i64)>) {
            qb.push("run_id IN (");
            let mut sep = qb.separated(", ");
            for (run_id, _) in &keys {
                sep.push_bind(run_id.clone());
            }
            qb.push(") AND (run_id, attempt) IN (");
            let mut first = true;
            for (run_id, attempt) in keys {
                if !first {
                    qb.push(", ");
                }
                first = false;
                qb.push("(").push_bind(run_id).push(", ").push_bind(attempt).push(")");
            }
            qb.push(")");
        }

        fn chrono_now_ms() -> i64 {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
        }

        impl $store {
            async fn fire_tx(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::check_fence(&mut tx, fence).await?;
                let (outcomes, _) = Self::fire_in(&mut tx, runs, advances, &[]).await?;
                tx.commit().await.map_err(db_err)?;
                Ok(outcomes)
            }

            /// One fenced transaction: the fire, then the transitions (which
            /// may move the runs it just created).
            async fn fire_and_transition_tx(
                &self,
                fence: &Fence,
                runs: &[NewRun],
                advances: &[JobAdvance],
                transitions: &[Transition],
            ) -> Result<(Vec<FireOutcome>, Vec<bool>), StoreError> {
                Transition::check_lifecycle(transitions)?;
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::check_fence(&mut tx, fence).await?;
                let (outcomes, folded) = Self::fire_in(&mut tx, runs, advances, transitions).await?;
                if !folded.iter().any(|f| *f) {
                    let applied = Self::transition_in(&mut tx, transitions).await?;
                    tx.commit().await.map_err(db_err)?;
                    return Ok((outcomes, applied));
                }
                // The folded transitions moved their runs as they were
                // inserted; their attempt changes follow, then the rest.
                let attempts: Vec<(&str, &AttemptChange, Millis)> = transitions
                    .iter()
                    .zip(&folded)
                    .filter(|(_, f)| **f)
                    .filter_map(|(t, _)| t.attempt.as_ref().map(|c| (t.run_id.as_str(), c, t.at)))
                    .collect();
                Self::apply_attempt_changes(&mut tx, &attempts).await?;
                let rest: Vec<Transition> = transitions.iter().zip(&folded).filter(|(_, f)| !**f).map(|(t, _)| t.clone()).collect();
                let mut rest_applied = Self::transition_in(&mut tx, &rest).await?.into_iter();
                let applied = folded.iter().map(|f| *f || rest_applied.next().unwrap_or(false)).collect();
                tx.commit().await.map_err(db_err)?;
                Ok((outcomes, applied))
            }

            /// Inserts the runs that do not exist yet. A transition of the same
            /// write that moves a run inserted here, from the state it is
            /// inserted in, and is the only one for that run, is folded into
            /// the insert (the row is written once, in its final state): the
            /// CAS holds by construction, since no one else can see the row
            /// before the commit. Returns the fire outcomes and, per
            /// transition, whether it was folded (its attempt change is the
            /// caller's to apply).
            async fn fire_in(
                tx: &mut Tx<'_>,
                runs: &[NewRun],
                advances: &[JobAdvance],
                transitions: &[Transition],
            ) -> Result<(Vec<FireOutcome>, Vec<bool>), StoreError> {
                let tx = &mut **tx;
                let ids: Vec<String> = runs.iter().map(|r| r.id()).collect();
                // Leader writes of the scope are serialised by the fence lock,
                // so this existence check is exact.
                let mut existing: HashSet<String> = HashSet::new();
                for chunk in ids.chunks(CHUNK) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("SELECT id FROM runs WHERE id IN (");
                    let mut sep = qb.separated(", ");
                    for id in chunk {
                        sep.push_bind(id.clone());
                    }
                    qb.push(")").push(D.for_update);
                    for r in qb.build().persistent(false).fetch_all(&mut *tx).await.map_err(db_err)? {
                        existing.insert(text(&r, "id")?);
                    }
                }
                let mut created: HashSet<String> = HashSet::new();
                let fresh: Vec<(&NewRun, &String)> =
                    runs.iter().zip(&ids).filter(|(_, id)| !existing.contains(*id) && created.insert((*id).clone())).collect();
                // Transitions to fold: the only one of its run, looked up for fresh runs.
                let fold = crate::sql::fold_candidates(transitions);
                let mut folded = vec![false; transitions.len()];
                let fresh: Vec<(&NewRun, &String, RunRow)> = fresh
                    .into_iter()
                    .map(|(r, id)| {
                        let mut row = RunRow::inserted(r);
                        // Checked against the row as inserted; a move that
                        // does not apply is left to fail as a CAS.
                        if let Some(i) = fold.get(id.as_str()) {
                            folded[*i] = transitions[*i].apply_to(crate::model::run_cas!(row));
                        }
                        (r, id, row)
                    })
                    .collect();
                for chunk in fresh.chunks(CHUNK) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new(
                        "INSERT INTO runs (id, job_uid, namespace, job, scheduled_at, fired_at, state, attempt, reason, next_attempt_at, manual, cancel_requested, updated_at) ",
                    );
                    qb.push_values(chunk, |mut b, (r, id, row)| {
                        b.push_bind((*id).clone())
                            .push_bind(r.job_uid.clone())
                            .push_bind(r.namespace.clone())
                            .push_bind(r.job.clone())
                            .push_bind(r.scheduled_at)
                            .push_bind(r.fired_at)
                            .push_bind(row.state.as_str())
                            .push_bind(i64::from(row.attempt))
                            .push_bind(row.reason.clone())
                            .push_bind(row.next_attempt_at)
                            .push_bind(i64::from(r.manual))
                            .push_bind(0i64)
                            .push_bind(row.updated_at);
                    });
                    qb.push(D.ignore("id"));
                    let n = qb.build().persistent(false).execute(&mut *tx).await.map_err(db_err)?.rows_affected();
                    if n != chunk.len() as u64 {
                        return Err(StoreError::Backend(format!("fire inserted {n} of {} new runs; rolled back", chunk.len())));
                    }
                }
                // One multi-row UPDATE per chunk of advances.
                let latest = crate::sql::latest_advances(advances);
                for chunk in latest.chunks(D.case_chunk) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("UPDATE jobs SET last_scheduled_at = CASE");
                    for (uid, at) in chunk {
                        qb.push(" WHEN uid = ").push_bind(uid.to_string()).push(" THEN ").push(D.greatest).push("(COALESCE(last_scheduled_at, ");
                        qb.push_bind(*at).push("), ").push_bind(*at).push(")");
                    }
                    qb.push(" ELSE last_scheduled_at END WHERE uid IN (");
                    let mut sep = qb.separated(", ");
                    for (uid, _) in chunk {
                        sep.push_bind(uid.to_string());
                    }
                    qb.push(")");
                    qb.build().persistent(false).execute(&mut *tx).await.map_err(db_err)?;
                }
                Ok((ids.iter().map(|id| if created.contains(id) { FireOutcome::Created } else { FireOutcome::Existed }).collect(), folded))
            }

            async fn transition_tx(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
                Transition::check_lifecycle(transitions)?;
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::check_fence(&mut tx, fence).await?;
                let applied = Self::transition_in(&mut tx, transitions).await?;
                tx.commit().await.map_err(db_err)?;
                Ok(applied)
            }

            async fn transition_in(tx: &mut Tx<'_>, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
                if transitions.is_empty() {
                    return Ok(Vec::new());
                }
                let mut ids: Vec<&str> = transitions.iter().map(|t| t.run_id.as_str()).collect();
                ids.sort_unstable();
                ids.dedup();
                let mut locked: HashMap<String, RunRow> = HashMap::new();
                for chunk in ids.chunks(CHUNK) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new(
                        "SELECT id, state, attempt, reason, next_attempt_at, updated_at, cancel_requested FROM runs WHERE id IN (",
                    );
                    let mut sep = qb.separated(", ");
                    for id in chunk {
                        sep.push_bind(id.to_string());
                    }
                    qb.push(") ORDER BY id").push(D.for_update);
                    for r in qb.build().persistent(false).fetch_all(&mut **tx).await.map_err(db_err)? {
                        let state = text(&r, "state")?;
                        locked.insert(
                            text(&r, "id")?,
                            RunRow {
                                state: RunState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("run state {state:?}")))?,
                                attempt: u32::try_from(r.try_get::<i64, _>("attempt").map_err(db_err)?).unwrap_or(0),
                                reason: opt_text(&r, "reason")?,
                                next_attempt_at: r.try_get("next_attempt_at").map_err(db_err)?,
                                updated_at: r.try_get("updated_at").map_err(db_err)?,
                                cancel_requested: r.try_get::<i64, _>("cancel_requested").map_err(db_err)? != 0,
                            },
                        );
                    }
                }
                let plan = plan_transitions(locked, transitions);
                for chunk in plan.finals.chunks(D.case_chunk) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("UPDATE runs SET ");
                    for (i, column) in ["state", "attempt", "reason", "next_attempt_at", "updated_at", "cancel_requested"].iter().enumerate() {
                        if i > 0 {
                            qb.push(", ");
                        }
                        qb.push(*column).push(" = CASE id");
                        for (id, _, _, row) in chunk {
                            qb.push(" WHEN ").push_bind(id.clone()).push(" THEN ");
                            match *column {
                                "state" => qb.push_bind(row.state.as_str()),
                                "attempt" => qb.push_bind(i64::from(row.attempt)),
                                "reason" => qb.push_bind(row.reason.clone()),
                                "next_attempt_at" => qb.push_bind(row.next_attempt_at),
                                "updated_at" => qb.push_bind(row.updated_at),
                                _ => qb.push_bind(i64::from(row.cancel_requested)),
                            };
                        }
                        qb.push(" ELSE ").push(*column).push(" END");
                    }
                    // The CAS: each row must still be in the state it was locked
                    // in. The plain `id IN` list lets every planner use the index.
                    qb.push(" WHERE id IN (");
                    let mut sep = qb.separated(", ");
                    for (id, _, _, _) in chunk {
                        sep.push_bind(id.clone());
                    }
                    qb.push(") AND (id, state, attempt) IN (");
                    let mut first = true;
                    for (id, state, attempt, _) in chunk {
                        if !first {
                            qb.push(", ");
                        }
                        first = false;
                        qb.push("(").push_bind(id.clone()).push(", ").push_bind(state.as_str()).push(", ").push_bind(i64::from(*attempt)).push(")");
                    }
                    qb.push(")");
                    let n = qb.build().persistent(false).execute(&mut **tx).await.map_err(db_err)?.rows_affected();
                    if n != chunk.len() as u64 {
                        return Err(StoreError::Backend(format!("transition matched {n} of {} locked runs; rolled back", chunk.len())));
                    }
                }
                Self::apply_attempt_changes(tx, &plan.attempts).await?;
                Ok(plan.applied)
            }

        }

        #[async_trait]
        impl Store for $store {
            fn backend(&self) -> &'static str {
                D.name
            }

            async fn put_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError> {
                let ns = spec.namespace().to_string();
                let spec_text = serde_json::to_string(spec).map_err(|e| StoreError::Backend(e.to_string()))?;
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                let seq = Self::bump_change_seq(&mut tx).await?;
                let existing = Self::job_by_name(&mut tx, &ns, &spec.name).await?;
                let what = format!("job {ns}/{}", spec.name);
                match (&existing, precondition) {
                    (Some(_), Precondition::DoesNotExist) => return Err(StoreError::AlreadyExists(what)),
                    (None, Precondition::MatchesVersion(_)) => return Err(StoreError::NotFound(what)),
                    (Some(j), Precondition::MatchesVersion(v)) if j.version != v => {
                        return Err(StoreError::VersionConflict { what, expected: v, actual: j.version })
                    }
                    _ => {}
                }
                match existing {
                    Some(j) if j.spec.schedule != spec.schedule => {
                        let previous = serde_json::to_string(&j.spec.schedule).map_err(|e| StoreError::Backend(e.to_string()))?;
                        sqlx::query(&D.q(
                            "UPDATE jobs SET spec = ?, version = version + 1, updated_at = ?, change_seq = ?, \
                             schedule_changed_at = ?, previous_schedule = ? WHERE uid = ?",
                        ))
                        .bind(&spec_text)
                        .bind(now)
                        .bind(seq)
                        .bind(now)
                        .bind(previous)
                        .bind(&j.uid)
                        .execute(&mut *tx)
                        .await
                        .map_err(db_err)?;
                    }
                    Some(j) => {
                        sqlx::query(&D.q("UPDATE jobs SET spec = ?, version = version + 1, updated_at = ?, change_seq = ? WHERE uid = ?"))
                            .bind(&spec_text)
                            .bind(now)
                            .bind(seq)
                            .bind(&j.uid)
                            .execute(&mut *tx)
                            .await
                            .map_err(db_err)?;
                    }
                    None => {
                        let inserted = sqlx::query(&D.q(
                            "INSERT INTO jobs (uid, namespace, name, spec, version, paused, created_at, updated_at, last_scheduled_at, change_seq) VALUES (?, ?, ?, ?, 1, 0, ?, ?, NULL, ?)",
                        ))
                        .bind(new_uid())
                        .bind(&ns)
                        .bind(&spec.name)
                        .bind(&spec_text)
                        .bind(now)
                        .bind(now)
                        .bind(seq)
                        .execute(&mut *tx)
                        .await;
                        match inserted {
                            Err(e) if is_unique_violation(&e) => return Err(StoreError::AlreadyExists(what)),
                            other => {
                                other.map_err(db_err)?;
                            }
                        }
                    }
                }
                let record =
                    Self::job_by_name(&mut tx, &ns, &spec.name).await?.ok_or_else(|| StoreError::Backend("job vanished".into()))?;
                tx.commit().await.map_err(db_err)?;
                Ok(record)
            }

            async fn set_job_paused(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                let seq = Self::bump_change_seq(&mut tx).await?;
                // The pause or resume time is recorded only when `paused`
                // changes (assigned before `paused`: MySQL evaluates an
                // UPDATE's assignments left to right).
                let sql = if paused {
                    "UPDATE jobs SET paused_at = CASE WHEN paused = 0 THEN ? ELSE paused_at END, paused = 1, \
                     version = version + 1, updated_at = ?, change_seq = ? WHERE namespace = ? AND name = ?"
                } else {
                    "UPDATE jobs SET resumed_at = CASE WHEN paused = 1 THEN ? ELSE resumed_at END, paused = 0, \
                     version = version + 1, updated_at = ?, change_seq = ? WHERE namespace = ? AND name = ?"
                };
                let changed = sqlx::query(&D.q(sql))
                .bind(now)
                .bind(now)
                .bind(seq)
                .bind(namespace)
                .bind(name)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?
                .rows_affected();
                if changed == 0 {
                    return Err(StoreError::NotFound(format!("job {namespace}/{name}")));
                }
                let record =
                    Self::job_by_name(&mut tx, namespace, name).await?.ok_or_else(|| StoreError::Backend("job vanished".into()))?;
                tx.commit().await.map_err(db_err)?;
                Ok(record)
            }

            async fn delete_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                let seq = Self::bump_change_seq(&mut tx).await?;
                let what = format!("job {namespace}/{name}");
                let job = match (Self::job_by_name(&mut tx, namespace, name).await?, precondition) {
                    (None, _) => return Err(StoreError::NotFound(what)),
                    (Some(j), Precondition::MatchesVersion(v)) if j.version != v => {
                        return Err(StoreError::VersionConflict { what, expected: v, actual: j.version })
                    }
                    (Some(_), Precondition::DoesNotExist) => return Err(StoreError::AlreadyExists(what)),
                    (Some(j), _) => j,
                };
                sqlx::query(&D.q("DELETE FROM jobs WHERE uid = ?")).bind(&job.uid).execute(&mut *tx).await.map_err(db_err)?;
                sqlx::query(&D.q("DELETE FROM job_deletions WHERE uid = ?")).bind(&job.uid).execute(&mut *tx).await.map_err(db_err)?;
                sqlx::query(&D.q("INSERT INTO job_deletions (uid, change_seq) VALUES (?, ?)"))
                    .bind(&job.uid)
                    .bind(seq)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
                tx.commit().await.map_err(db_err)
            }

            async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
                sqlx::query(&D.q("SELECT * FROM jobs WHERE namespace = ? AND name = ?"))
                    .bind(namespace)
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db_err)?
                    .map(|r| job_from_row(&r))
                    .transpose()
            }

            async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>, StoreError> {
                let rows = match namespace {
                    Some(ns) => {
                        sqlx::query(&D.q("SELECT * FROM jobs WHERE namespace = ? ORDER BY namespace, name")).bind(ns).fetch_all(&self.pool).await
                    }
                    None => sqlx::query("SELECT * FROM jobs ORDER BY namespace, name").fetch_all(&self.pool).await,
                }
                .map_err(db_err)?;
                rows.iter().map(job_from_row).collect()
            }

            async fn job_changes(&self, since: u64) -> Result<JobChanges, StoreError> {
                // The counter is read first: every row whose change_seq is at
                // most that value has committed (writers hold the counter row
                // until they commit), so nothing up to `seq` can appear later.
                let mut tx = self.pool.begin().await.map_err(db_err)?;
                let seq: i64 = sqlx::query_scalar("SELECT value FROM counters WHERE name = 'job_change_seq'")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_err)?;
                let rows = sqlx::query(&D.q("SELECT * FROM jobs WHERE change_seq > ? AND change_seq <= ? ORDER BY change_seq"))
                    .bind(to_i64(since))
                    .bind(seq)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(db_err)?;
                let deleted = sqlx::query(&D.q("SELECT uid FROM job_deletions WHERE change_seq > ? AND change_seq <= ? ORDER BY change_seq"))
                    .bind(to_i64(since))
                    .bind(seq)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(db_err)?
                    .iter()
                    .map(|r| text(r, "uid"))
                    .collect::<Result<Vec<String>, _>>()?;
                tx.commit().await.map_err(db_err)?;
                Ok(JobChanges { upserted: rows.iter().map(job_from_row).collect::<Result<_, _>>()?, deleted, seq: to_u64(seq) })
            }

            async fn job_heads(&self) -> Result<JobHeads, StoreError> {
                // As in `job_changes`: the counter first, then the rows.
                let mut tx = self.pool.begin().await.map_err(db_err)?;
                let seq: i64 = sqlx::query_scalar("SELECT value FROM counters WHERE name = 'job_change_seq'")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_err)?;
                if let Some(sql) = D.heads_json {
                    // One row holding them all: far cheaper for drivers
                    // that pay per row (SQLite's).
                    let all: Option<String> = sqlx::query_scalar(sql).fetch_one(&mut *tx).await.map_err(db_err)?;
                    tx.commit().await.map_err(db_err)?;
                    let rows: Vec<(String, u64, Option<Millis>)> = match all {
                        Some(all) => serde_json::from_str(&all).map_err(|e| StoreError::Corrupt(format!("job heads: {e}")))?,
                        None => Vec::new(),
                    };
                    let heads = rows.into_iter().map(|(uid, version, last_scheduled_at)| JobHead { uid, version, last_scheduled_at }).collect();
                    return Ok(JobHeads { heads, seq: to_u64(seq) });
                }
                let rows = sqlx::query("SELECT uid, version, last_scheduled_at FROM jobs").fetch_all(&mut *tx).await.map_err(db_err)?;
                tx.commit().await.map_err(db_err)?;
                let heads = rows
                    .iter()
                    .map(|r| {
                        Ok(JobHead {
                            uid: text(r, "uid")?,
                            version: to_u64(r.try_get("version").map_err(db_err)?),
                            last_scheduled_at: r.try_get("last_scheduled_at").map_err(db_err)?,
                        })
                    })
                    .collect::<Result<_, StoreError>>()?;
                Ok(JobHeads { heads, seq: to_u64(seq) })
            }

            async fn jobs_by_uid(&self, uids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
                let mut out = Vec::with_capacity(uids.len());
                for chunk in uids.chunks(CHUNK) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("SELECT * FROM jobs WHERE uid IN (");
                    let mut sep = qb.separated(", ");
                    for uid in chunk {
                        sep.push_bind(uid.as_str());
                    }
                    qb.push(")");
                    for r in qb.build().persistent(false).fetch_all(&self.pool).await.map_err(db_err)? {
                        out.push(job_from_row(&r)?);
                    }
                }
                Ok(out)
            }

            async fn next_epoch(&self, scope: &str) -> Result<u64, StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::ensure_scope_row(&mut tx, "epochs", scope).await?;
                let epoch: i64 = sqlx::query_scalar(&D.q("SELECT epoch FROM epochs WHERE scope = ? FOR UPDATE"))
                    .bind(scope)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_err)?;
                // Never below the fenced token, so a new term outranks every earlier one.
                let token: Option<i64> = sqlx::query_scalar(&D.q("SELECT token FROM leadership WHERE scope = ?"))
                    .bind(scope)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_err)?;
                let next = epoch.max(token.unwrap_or(0)) + 1;
                sqlx::query(&D.q("UPDATE epochs SET epoch = ? WHERE scope = ?")).bind(next).bind(scope).execute(&mut *tx).await.map_err(db_err)?;
                tx.commit().await.map_err(db_err)?;
                Ok(to_u64(next))
            }

            async fn fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::ensure_scope_row(&mut tx, "leadership", &fence.scope).await?;
                let current: i64 = sqlx::query_scalar(&D.q("SELECT token FROM leadership WHERE scope = ? FOR UPDATE"))
                    .bind(&fence.scope)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_err)?;
                let current = to_u64(current);
                if fence.token <= current {
                    return Err(StoreError::StaleToken { scope: fence.scope.clone(), token: fence.token, current });
                }
                sqlx::query(&D.q("UPDATE leadership SET token = ?, holder = ?, address = ?, backend = ?, since = ? WHERE scope = ?"))
                    .bind(to_i64(fence.token))
                    .bind(&holder.holder)
                    .bind(&holder.address)
                    .bind(&holder.backend)
                    .bind(now)
                    .bind(&fence.scope)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
                tx.commit().await.map_err(db_err)
            }

            async fn leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError> {
                let row = sqlx::query(&D.q("SELECT * FROM leadership WHERE scope = ? AND token > 0"))
                    .bind(scope)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db_err)?;
                row.map(|r| {
                    Ok(LeadershipRecord {
                        scope: text(&r, "scope")?,
                        token: to_u64(r.try_get("token").map_err(db_err)?),
                        holder: text(&r, "holder")?,
                        address: text(&r, "address")?,
                        backend: text(&r, "backend")?,
                        since: r.try_get("since").map_err(db_err)?,
                    })
                })
                .transpose()
            }

            async fn fire(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
                if let Some(r) = self.native_turn_write(fence, runs, advances, &[]).await {
                    return r.map(|(fired, _)| fired);
                }
                // Never repeated here on a lost connection: it may have been
                // lost during the commit, so the outcome is unknown, and only
                // the caller (the leader, by reloading from the store) can
                // tell what landed.
                self.fire_tx(fence, runs, advances).await
            }

            async fn transition(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
                if let Some(r) = self.native_turn_write(fence, &[], &[], transitions).await {
                    return r.map(|(_, applied)| applied);
                }
                self.transition_tx(fence, transitions).await
            }

            async fn fire_and_transition(
                &self,
                fence: &Fence,
                runs: &[NewRun],
                advances: &[JobAdvance],
                transitions: &[Transition],
            ) -> Result<TurnWrite, StoreError> {
                if let Some(r) = self.native_turn_write(fence, runs, advances, transitions).await {
                    let (fired, applied) = r?;
                    return Ok(TurnWrite { fired, applied: Ok(applied) });
                }
                let (fired, applied) = self.fire_and_transition_tx(fence, runs, advances, transitions).await?;
                Ok(TurnWrite { fired, applied: Ok(applied) })
            }

            async fn request_cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                // Not started: cancelled at once. Live: the leader is asked to stop it.
                let attempts = [
                    (
                        "UPDATE runs SET state = 'cancelled', reason = 'cancelled by request', updated_at = ? WHERE id = ? AND state IN ('pending', 'retrying')",
                        CancelOutcome::Cancelled,
                    ),
                    ("UPDATE runs SET cancel_requested = 1, updated_at = ? WHERE id = ? AND state IN ('assigned', 'running')", CancelOutcome::Requested),
                ];
                for (sql, outcome) in attempts {
                    let n = sqlx::query(&D.q(sql)).bind(now).bind(run_id).execute(&mut *tx).await.map_err(db_err)?.rows_affected();
                    if n == 1 {
                        tx.commit().await.map_err(db_err)?;
                        return Ok(outcome);
                    }
                }
                let exists: Option<i64> = sqlx::query_scalar(&D.q("SELECT attempt FROM runs WHERE id = ?"))
                    .bind(run_id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_err)?;
                match exists {
                    None => Err(StoreError::NotFound(format!("run {run_id}"))),
                    Some(_) => Err(StoreError::Terminal(run_id.to_string())),
                }
            }

            async fn get_run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError> {
                let Some(row) =
                    sqlx::query(&D.q("SELECT * FROM runs WHERE id = ?")).bind(run_id).fetch_optional(&self.pool).await.map_err(db_err)?
                else {
                    return Ok(None);
                };
                let run = run_from_row(&row)?;
                let attempts = sqlx::query(&D.q("SELECT * FROM attempts WHERE run_id = ? ORDER BY attempt"))
                    .bind(run_id)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_err)?;
                Ok(Some(RunDetail { run, attempts: attempts.iter().map(attempt_from_row).collect::<Result<_, _>>()? }))
            }

            async fn list_runs(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError> {
                let limit = limit.clamp(1, 1000);
                let mut qb: QueryBuilder<$db> = QueryBuilder::new("SELECT * FROM runs WHERE 1 = 1");
                if let Some(ns) = &filter.namespace {
                    qb.push(" AND namespace = ").push_bind(ns.clone());
                }
                if let Some(job) = &filter.job {
                    qb.push(" AND job = ").push_bind(job.clone());
                }
                if let Some(state) = filter.state {
                    qb.push(" AND state = ").push_bind(state.as_str());
                }
                if let Some(c) = cursor {
                    qb.push(" AND seq < ").push_bind(c);
                }
                qb.push(" ORDER BY seq DESC LIMIT ").push_bind(i64::from(limit) + 1);
                let rows = qb.build().persistent(false).fetch_all(&self.pool).await.map_err(db_err)?;
                let mut runs: Vec<RunRecord> = rows.iter().map(run_from_row).collect::<Result<_, _>>()?;
                let next_cursor = if runs.len() > limit as usize {
                    runs.truncate(limit as usize);
                    runs.last().map(|r| r.seq)
                } else {
                    None
                };
                Ok(RunPage { runs, next_cursor })
            }

            async fn open_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
                let rows = sqlx::query("SELECT * FROM runs WHERE state IN ('pending', 'assigned', 'running', 'retrying') ORDER BY seq")
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_err)?;
                rows.iter().map(run_from_row).collect()
            }

            async fn live_attempts(&self) -> Result<Vec<LiveAttempt>, StoreError> {
                let rows = sqlx::query(
                    "SELECT r.id AS run_id, a.attempt AS attempt, a.worker AS worker FROM runs r \
                     JOIN attempts a ON a.run_id = r.id AND a.attempt = r.attempt \
                     WHERE r.state IN ('assigned', 'running')",
                )
                .fetch_all(&self.pool)
                .await
                .map_err(db_err)?;
                rows.iter()
                    .map(|r| {
                        Ok(LiveAttempt {
                            run_id: text(r, "run_id")?,
                            attempt: u32::try_from(r.try_get::<i64, _>("attempt").map_err(db_err)?).unwrap_or(0),
                            worker: text(r, "worker")?,
                        })
                    })
                    .collect()
            }

            async fn cancel_requests(&self) -> Result<Vec<RunRecord>, StoreError> {
                let rows = sqlx::query("SELECT * FROM runs WHERE state IN ('assigned', 'running') AND cancel_requested = 1")
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_err)?;
                rows.iter().map(run_from_row).collect()
            }
        }
    };
}

pub(crate) use sql_store;

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
