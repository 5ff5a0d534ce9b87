//! The SQL schema's migrations: the files of `migrations/{sqlite,mysql,postgres}/`
//! (embedded at compile time), one numbering for the three databases, and
//! the runner that applies them once, in order, under the database's own
//! lock, recording each in `gnomon_schema`.
//!
//! Every number exists for every database. A step one database needs and
//! the others do not is a file of comments there (it records the number and
//! changes nothing), so a version names the same schema everywhere.
//!
//! # Numbering, then and now
//! Before the files, each backend numbered its migrations itself, recorded
//! in the table `gnomon_migrations`: SQLite 1–11, MySQL and PostgreSQL 1–10
//! (they never had SQLite's step 2). A database that has only that table is
//! read through [`LEGACY_SQLITE`] / [`LEGACY_SERVER`] at open: its highest
//! old version becomes the new one, recorded in `gnomon_schema` with every
//! version below it, and the steps after it are applied as usual.
//! `gnomon_migrations` is left as it was.
//!
//! | step | name                 | old SQLite | old MySQL / PostgreSQL |
//! |------|----------------------|-----------:|-----------------------:|
//! | 1    | initial              | 1          | 1                      |
//! | 2    | leaner_run_indexes   | 2          | — (no-op there)        |
//! | 3    | pause_times          | 3          | 2                      |
//! | 4    | manual_run_ids       | 4          | 3                      |
//! | 5    | schedule_changes     | 5          | 4                      |
//! | 6    | leader_time          | 6          | 5                      |
//! | 7    | notifications        | 7          | 6                      |
//! | 8    | run_params           | 8          | 7                      |
//! | 9    | run_payload          | 9          | 8                      |
//! | 10   | run_upstream         | 10         | 9                      |
//! | 11   | backfills            | 11         | 10                     |
//! | 12   | job_edges            | —          | —                      |
//! | 13   | worker_bindings      | —          | —                      |
//!
//! # Running them once
//! Each step is applied with its `gnomon_schema` row under the database's
//! lock ([`MigrationLock`]), after reading the recorded version under that
//! lock, so replicas opening at once apply every step exactly once:
//! SQLite and PostgreSQL apply a step and its row in one transaction (the
//! write transaction's lock; `pg_advisory_xact_lock`). MySQL commits DDL
//! implicitly, so there the whole run holds `GET_LOCK` on one connection
//! and every step is safe to run again: its files use `IF NOT EXISTS` and
//! `INSERT IGNORE`, and a change MySQL 8 cannot write so (adding a column,
//! dropping an index) that is found already made counts as made
//! ([`super::Dialect::already_made`]); a step cut off before its row is
//! recorded is then completed by the next open.
//!
//! A database whose recorded version is above the last step this build
//! knows is refused ([`crate::StoreError::SchemaTooNew`]).
//!
//! Files hold statements separated by `;` (never inside a literal); lines
//! starting with `--` are comments.

use super::backend::SqlStore;
use super::driver::{Driver, SqlRow, Tx};
use super::errors::db_err;
use super::Backend;
use crate::StoreError;

/// One step of the schema, as a database applies it.
#[derive(Debug)]
pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    /// The file's text.
    pub sql: &'static str,
}

impl Migration {
    /// The file's statements, comments left out.
    pub fn statements(&self) -> Vec<String> {
        split_statements(self.sql)
    }
}

/// The statements of a migration file: split at `;`, without the lines
/// that are `--` comments; empty for a file of comments.
pub fn split_statements(sql: &str) -> Vec<String> {
    let text: String = sql.lines().filter(|l| !l.trim_start().starts_with("--")).collect::<Vec<_>>().join("\n");
    text.split(';').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// How the runner keeps two replicas from applying a step twice.
#[derive(Debug, Clone, Copy)]
pub enum MigrationLock {
    /// Each step in a transaction begun with this statement, which takes
    /// the database's write lock (SQLite `BEGIN IMMEDIATE`).
    Begin(&'static str),
    /// Each step in a transaction whose first statement takes this
    /// transaction-scoped lock (PostgreSQL `pg_advisory_xact_lock`).
    InTransaction(&'static str),
    /// The whole run on one connection under a session lock (`lock`
    /// returns 1 once taken), steps outside transactions (MySQL
    /// `GET_LOCK`: DDL commits implicitly).
    Session { lock: &'static str, unlock: &'static str },
}

impl MigrationLock {
    /// The statement a step's transaction begins with, if not the default.
    fn begin(self) -> Option<&'static str> {
        match self {
            MigrationLock::Begin(begin) => Some(begin),
            _ => None,
        }
    }
}

/// Old SQLite version → step: the same numbers.
pub const LEGACY_SQLITE: &[(i64, i64)] = &[(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6), (7, 7), (8, 8), (9, 9), (10, 10), (11, 11)];

/// Old MySQL/PostgreSQL version → step: 1 stays, the rest move up by one
/// past SQLite's step 2.
pub const LEGACY_SERVER: &[(i64, i64)] = &[(1, 1), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9), (9, 10), (10, 11)];

/// The step an old version recorded in `gnomon_migrations` is, or `None`
/// for a number no build had.
pub fn translate_legacy(map: &[(i64, i64)], old: i64) -> Option<i64> {
    map.iter().find(|(o, _)| *o == old).map(|(_, new)| *new)
}

/// `migrations/<dir>/NNN_<name>.sql`, listed in order.
const fn file(version: i64, name: &'static str, sql: &'static str) -> Migration {
    Migration { version, name, sql }
}

#[cfg(feature = "sqlite")]
pub const SQLITE: &[Migration] = &[
    file(1, "initial", include_str!("../../migrations/sqlite/001_initial.sql")),
    file(2, "leaner_run_indexes", include_str!("../../migrations/sqlite/002_leaner_run_indexes.sql")),
    file(3, "pause_times", include_str!("../../migrations/sqlite/003_pause_times.sql")),
    file(4, "manual_run_ids", include_str!("../../migrations/sqlite/004_manual_run_ids.sql")),
    file(5, "schedule_changes", include_str!("../../migrations/sqlite/005_schedule_changes.sql")),
    file(6, "leader_time", include_str!("../../migrations/sqlite/006_leader_time.sql")),
    file(7, "notifications", include_str!("../../migrations/sqlite/007_notifications.sql")),
    file(8, "run_params", include_str!("../../migrations/sqlite/008_run_params.sql")),
    file(9, "run_payload", include_str!("../../migrations/sqlite/009_run_payload.sql")),
    file(10, "run_upstream", include_str!("../../migrations/sqlite/010_run_upstream.sql")),
    file(11, "backfills", include_str!("../../migrations/sqlite/011_backfills.sql")),
    file(12, "job_edges", include_str!("../../migrations/sqlite/012_job_edges.sql")),
    file(13, "worker_bindings", include_str!("../../migrations/sqlite/013_worker_bindings.sql")),
];

#[cfg(feature = "mysql")]
pub const MYSQL: &[Migration] = &[
    file(1, "initial", include_str!("../../migrations/mysql/001_initial.sql")),
    file(2, "leaner_run_indexes", include_str!("../../migrations/mysql/002_leaner_run_indexes.sql")),
    file(3, "pause_times", include_str!("../../migrations/mysql/003_pause_times.sql")),
    file(4, "manual_run_ids", include_str!("../../migrations/mysql/004_manual_run_ids.sql")),
    file(5, "schedule_changes", include_str!("../../migrations/mysql/005_schedule_changes.sql")),
    file(6, "leader_time", include_str!("../../migrations/mysql/006_leader_time.sql")),
    file(7, "notifications", include_str!("../../migrations/mysql/007_notifications.sql")),
    file(8, "run_params", include_str!("../../migrations/mysql/008_run_params.sql")),
    file(9, "run_payload", include_str!("../../migrations/mysql/009_run_payload.sql")),
    file(10, "run_upstream", include_str!("../../migrations/mysql/010_run_upstream.sql")),
    file(11, "backfills", include_str!("../../migrations/mysql/011_backfills.sql")),
    file(12, "job_edges", include_str!("../../migrations/mysql/012_job_edges.sql")),
    file(13, "worker_bindings", include_str!("../../migrations/mysql/013_worker_bindings.sql")),
];

#[cfg(feature = "postgres")]
pub const POSTGRES: &[Migration] = &[
    file(1, "initial", include_str!("../../migrations/postgres/001_initial.sql")),
    file(2, "leaner_run_indexes", include_str!("../../migrations/postgres/002_leaner_run_indexes.sql")),
    file(3, "pause_times", include_str!("../../migrations/postgres/003_pause_times.sql")),
    file(4, "manual_run_ids", include_str!("../../migrations/postgres/004_manual_run_ids.sql")),
    file(5, "schedule_changes", include_str!("../../migrations/postgres/005_schedule_changes.sql")),
    file(6, "leader_time", include_str!("../../migrations/postgres/006_leader_time.sql")),
    file(7, "notifications", include_str!("../../migrations/postgres/007_notifications.sql")),
    file(8, "run_params", include_str!("../../migrations/postgres/008_run_params.sql")),
    file(9, "run_payload", include_str!("../../migrations/postgres/009_run_payload.sql")),
    file(10, "run_upstream", include_str!("../../migrations/postgres/010_run_upstream.sql")),
    file(11, "backfills", include_str!("../../migrations/postgres/011_backfills.sql")),
    file(12, "job_edges", include_str!("../../migrations/postgres/012_job_edges.sql")),
    file(13, "worker_bindings", include_str!("../../migrations/postgres/013_worker_bindings.sql")),
];

/// The table of applied steps (the shared numbering).
const SCHEMA_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS gnomon_schema (version BIGINT PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at BIGINT NOT NULL)";

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

type Conn<B> = <<B as Backend>::Db as sqlx::Database>::Connection;

impl<B: Backend> SqlStore<B> {
    /// Applies the steps the database lacks under its migration lock, so
    /// several servers starting at once migrate exactly once; returns the
    /// versions this call applied (one log line says which).
    pub async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
        let applied = self.migrate_steps().await?;
        if let (Some(first), Some(last)) = (applied.first(), applied.last()) {
            tracing::info!(backend = B::DIALECT.name, from = first - 1, to = last, "schema migrated");
        }
        Ok(applied)
    }

    async fn migrate_steps(&self) -> Result<Vec<i64>, StoreError> {
        let d = B::DIALECT;
        let mut conn = self.db.pool().acquire().await.map_err(db_err)?;
        let mut applied = Vec::new();
        match d.migration_lock {
            MigrationLock::Begin(_) | MigrationLock::InTransaction(_) => loop {
                let mut tx = Tx::<B::Db>::begin(&mut *conn, d.migration_lock.begin()).await?;
                if let MigrationLock::InTransaction(lock) = d.migration_lock {
                    B::Db::raw(tx.conn(), lock).await.map_err(db_err)?;
                }
                let current = Self::schema_version(tx.conn()).await?;
                let Some(step) = d.migrations.iter().find(|m| m.version > current) else {
                    tx.commit().await?;
                    return Ok(applied);
                };
                Self::apply(tx.conn(), step).await?;
                tx.commit().await?;
                applied.push(step.version);
            },
            MigrationLock::Session { lock, unlock } => {
                let got = B::Db::fetch_optional(&mut *conn, &Self::q(lock)).await.map_err(db_err)?;
                if got.map(|r| r.first_opt_int()).transpose()?.flatten() != Some(1) {
                    return Err(StoreError::Unavailable(format!(
                        "the {} store's migration lock was not granted (another server is migrating?)",
                        d.name
                    )));
                }
                let result = async {
                    loop {
                        let current = Self::schema_version(&mut conn).await?;
                        let Some(step) = d.migrations.iter().find(|m| m.version > current) else {
                            return Ok::<(), StoreError>(());
                        };
                        Self::apply(&mut conn, step).await?;
                        applied.push(step.version);
                    }
                }
                .await;
                let _ = B::Db::raw(&mut *conn, unlock).await;
                result.map(|()| applied)
            }
        }
    }

    /// One step's statements and its `gnomon_schema` row.
    async fn apply(conn: &mut Conn<B>, step: &Migration) -> Result<(), StoreError> {
        let d = B::DIALECT;
        for stmt in step.statements() {
            match B::Db::raw(conn, &stmt).await {
                Ok(()) => {}
                Err(e) if (d.already_made)(&e) => {
                    tracing::debug!(version = step.version, error = %e, "migration statement already applied; skipped");
                }
                Err(e) => {
                    return Err(StoreError::Backend(format!(
                        "migration {} ({}) of the {} store failed: {e}",
                        step.version, step.name, d.name
                    )))
                }
            }
        }
        let record = Self::q("INSERT INTO gnomon_schema (version, name, applied_at) VALUES (?, ?, ?)")
            .bind(step.version)
            .bind(step.name)
            .bind(now_ms());
        B::Db::execute(conn, &record).await.map_err(db_err)?;
        tracing::debug!(version = step.version, name = step.name, backend = d.name, "applied migration");
        Ok(())
    }

    /// The recorded version, under the caller's lock: creates the table,
    /// takes over an old `gnomon_migrations` record, and refuses a version
    /// past the last step this build knows.
    async fn schema_version(conn: &mut Conn<B>) -> Result<i64, StoreError> {
        let d = B::DIALECT;
        B::Db::raw(conn, SCHEMA_TABLE).await.map_err(db_err)?;
        let max = |table: &str| Self::q(&format!("SELECT MAX(version) FROM {table}"));
        let current = B::Db::fetch_optional(conn, &max("gnomon_schema")).await.map_err(db_err)?;
        let mut version = current.map(|r| r.first_opt_int()).transpose()?.flatten();
        if version.is_none() {
            let legacy = B::Db::fetch_optional(conn, &Self::q(d.legacy_table_query)).await.map_err(db_err)?;
            if legacy.map(|r| r.first_opt_int()).transpose()?.flatten().unwrap_or(0) > 0 {
                let old = B::Db::fetch_optional(conn, &max("gnomon_migrations")).await.map_err(db_err)?;
                if let Some(old) = old.map(|r| r.first_opt_int()).transpose()?.flatten() {
                    let new = translate_legacy(d.legacy, old).ok_or_else(|| {
                        StoreError::Backend(format!(
                            "the {} database records schema version {old} in gnomon_migrations, which no gnomon build had (the last was {})",
                            d.name,
                            d.legacy.last().map_or(0, |l| l.0)
                        ))
                    })?;
                    Self::record_up_to(conn, new, old).await?;
                    version = Some(new);
                }
            }
        }
        let version = version.unwrap_or(0);
        let known = d.migrations.last().map_or(0, |m| m.version);
        if version > known {
            return Err(StoreError::SchemaTooNew { backend: d.name.to_string(), found: version, known });
        }
        Ok(version)
    }

    /// Records steps `1..=new` as applied (one statement: all or none), for
    /// a database the old numbering had at `old`.
    async fn record_up_to(conn: &mut Conn<B>, new: i64, old: i64) -> Result<(), StoreError> {
        let d = B::DIALECT;
        let mut q = Self::q("INSERT INTO gnomon_schema (version, name, applied_at) VALUES ");
        for (i, step) in d.migrations.iter().take_while(|m| m.version <= new).enumerate() {
            q = q.push(if i > 0 { ", (?, ?, ?)" } else { "(?, ?, ?)" }).bind(step.version).bind(step.name).bind(now_ms());
        }
        B::Db::execute(conn, &q).await.map_err(db_err)?;
        tracing::info!(old, new, backend = d.name, "took over the schema version recorded in gnomon_migrations");
        Ok(())
    }
}
