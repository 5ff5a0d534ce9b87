//! The MySQL 8 / MariaDB 10.5+ store (`mysql://…`), InnoDB only.
//!
//! Runs at InnoDB's default REPEATABLE READ; every read that a decision
//! depends on is a locking read (`FOR UPDATE`), which sees the newest
//! committed row rather than the transaction's snapshot (see `sql/`), but
//! for a job write's read of its namespace, whose snapshot is taken once
//! the job change counter is locked (see `sql/jobs.rs`).
//! TLS comes from the URL's standard parameters (`ssl-mode=REQUIRED`,
//! `ssl-ca=…`). Each connection gets `innodb_lock_wait_timeout` and a
//! statement time limit (`max_statement_time` on MariaDB,
//! `max_execution_time` on MySQL, which bounds reads only).

pub mod lock;

use std::str::FromStr;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, Executor, MySqlPool};

use crate::sql::migrate::Migration;
use crate::sql::{db_err, explain_open_error, redact, Backend, Dialect, SqlStore};
use crate::StoreOptions;

const MIGRATIONS: &[Migration] = &[
    Migration {
    version: 1,
    statements: &[
        "CREATE TABLE jobs (
            uid VARCHAR(32) NOT NULL PRIMARY KEY, namespace VARCHAR(64) NOT NULL, name VARCHAR(128) NOT NULL,
            spec MEDIUMTEXT NOT NULL, version BIGINT NOT NULL, paused BIGINT NOT NULL DEFAULT 0,
            created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
            last_scheduled_at BIGINT NULL, change_seq BIGINT NOT NULL,
            UNIQUE KEY jobs_name (namespace, name), KEY jobs_change_seq (change_seq)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        "CREATE TABLE job_deletions (uid VARCHAR(32) NOT NULL PRIMARY KEY, change_seq BIGINT NOT NULL, KEY job_deletions_seq (change_seq))
         ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        "CREATE TABLE counters (name VARCHAR(64) NOT NULL PRIMARY KEY, value BIGINT NOT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        "INSERT INTO counters (name, value) VALUES ('job_change_seq', 0)",
        "CREATE TABLE runs (
            seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, id VARCHAR(64) NOT NULL,
            job_uid VARCHAR(32) NOT NULL, namespace VARCHAR(64) NOT NULL, job VARCHAR(128) NOT NULL,
            scheduled_at BIGINT NOT NULL, fired_at BIGINT NOT NULL,
            state VARCHAR(16) NOT NULL, attempt BIGINT NOT NULL DEFAULT 0, reason TEXT NULL,
            next_attempt_at BIGINT NULL, manual BIGINT NOT NULL DEFAULT 0,
            cancel_requested BIGINT NOT NULL DEFAULT 0, updated_at BIGINT NOT NULL,
            UNIQUE KEY runs_id (id), UNIQUE KEY runs_fire (job_uid, scheduled_at),
            KEY runs_by_job (namespace, job, seq), KEY runs_by_state (state, seq)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        "CREATE TABLE attempts (
            run_id VARCHAR(64) NOT NULL, attempt BIGINT NOT NULL, worker VARCHAR(255) NOT NULL, token BIGINT NOT NULL,
            state VARCHAR(16) NOT NULL, assigned_at BIGINT NOT NULL, started_at BIGINT NULL, ended_at BIGINT NULL,
            exit_code BIGINT NULL, output MEDIUMTEXT NOT NULL,
            PRIMARY KEY (run_id, attempt)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        "CREATE TABLE leadership (
            scope VARCHAR(128) NOT NULL PRIMARY KEY, token BIGINT NOT NULL, holder VARCHAR(255) NOT NULL,
            address VARCHAR(255) NOT NULL, backend VARCHAR(32) NOT NULL, since BIGINT NOT NULL
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        "CREATE TABLE epochs (scope VARCHAR(128) NOT NULL PRIMARY KEY, epoch BIGINT NOT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    ],
},
    // When a job was last paused and resumed: a new leader starts a resumed
    // job's timeline at its resumption (and fires what was due before the
    // pause) without having seen either.
    Migration {
        version: 2,
        statements: &["ALTER TABLE jobs ADD COLUMN paused_at BIGINT NULL, ADD COLUMN resumed_at BIGINT NULL"],
    },
    // Manual runs have ids of their own (`<uid>-m<instant>`), so a manual
    // run and a scheduled one may share `(job_uid, scheduled_at)`: the run id
    // alone is unique.
    Migration { version: 3, statements: &["ALTER TABLE runs DROP INDEX runs_fire"] },
    // When a job's schedule last changed and what it was (see the SQLite
    // migration 5).
    Migration {
        version: 4,
        statements: &["ALTER TABLE jobs ADD COLUMN schedule_changed_at BIGINT NULL, ADD COLUMN previous_schedule TEXT NULL"],
    },
    // The committed leader time (see the SQLite migration 6).
    Migration { version: 5, statements: &["ALTER TABLE leadership ADD COLUMN leader_time BIGINT NOT NULL DEFAULT 0"] },
    Migration {
        version: 6,
        statements: &["CREATE TABLE notifications (
            id VARCHAR(96) NOT NULL PRIMARY KEY, run_id VARCHAR(64) NOT NULL, namespace VARCHAR(64) NOT NULL,
            job VARCHAR(128) NOT NULL, outcome VARCHAR(16) NOT NULL, target TEXT NOT NULL, state VARCHAR(16) NOT NULL,
            attempts BIGINT NOT NULL, next_at BIGINT NOT NULL, last_error TEXT NULL,
            created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
            KEY notifications_by_run (run_id), KEY notifications_due (state, next_at)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"],
    },
    // A run's parameter values (see the SQLite migration 8); up to 64 KiB,
    // past what TEXT holds.
    Migration { version: 7, statements: &["ALTER TABLE runs ADD COLUMN params MEDIUMTEXT NULL"] },
    // The body of the webhook call that started a run (see the SQLite
    // migration 9); up to 64 KiB.
    Migration { version: 8, statements: &["ALTER TABLE runs ADD COLUMN payload MEDIUMTEXT NULL"] },
    // A dependency run's origin and edges (see the SQLite migration 10).
    Migration { version: 9, statements: &["ALTER TABLE runs ADD COLUMN upstream MEDIUMTEXT NULL"] },
    // Backfills (see the SQLite migration 11).
    Migration {
        version: 10,
        statements: &["CREATE TABLE IF NOT EXISTS backfills (
            id VARCHAR(255) NOT NULL PRIMARY KEY, namespace VARCHAR(64) NOT NULL, job VARCHAR(128) NOT NULL,
            job_uid VARCHAR(64) NOT NULL, from_ms BIGINT NOT NULL, to_ms BIGINT NOT NULL, params MEDIUMTEXT NULL,
            rate BIGINT NOT NULL, total BIGINT NOT NULL, cursor_ms BIGINT NOT NULL, state VARCHAR(16) NOT NULL,
            created BIGINT NOT NULL, kept BIGINT NOT NULL, reason TEXT NULL, created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL, KEY backfills_by_state (state)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"],
    },
];

const DIALECT: Dialect = Dialect {
    name: "mysql",
    numbered: false,
    for_update: " FOR UPDATE",
    greatest: "GREATEST",
    begin: None,
    case_chunk: 125,
    ignore_suffix: " ON DUPLICATE KEY UPDATE {key} = {key}",
    heads_json: None,
    migrate_lock: "SELECT GET_LOCK('gnomon_migrate', 60)",
    migrate_unlock: "SELECT RELEASE_LOCK('gnomon_migrate')",
    migrations: MIGRATIONS,
    size_query:
        "SELECT CAST(COALESCE(SUM(data_length + index_length), 0) AS SIGNED) FROM information_schema.tables WHERE table_schema = DATABASE()",
    // SYSDATE, not NOW: the time the function runs, not the statement's start.
    clock_query: Some("SELECT CAST(ROUND(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED)"),
    // JSON_TABLE's column collations and its optimiser support differ
    // between MariaDB and MySQL 8; the CASE statements work on both.
};

/// The MySQL/MariaDB store.
pub type MySqlStore = SqlStore<MySqlBackend>;

/// A MySQL or MariaDB database as the SQL store uses it: a pool, whose
/// connections also carry write transactions.
#[derive(Debug, Clone)]
pub struct MySqlBackend {
    pool: MySqlPool,
    flavor: Flavor,
}

impl Backend for MySqlBackend {
    type Db = sqlx::MySql;
    /// Write transactions take a connection from the pool, a fresh one
    /// after the server closed one.
    type Writer = sqlx::pool::PoolConnection<sqlx::MySql>;
    const DIALECT: &'static Dialect = &DIALECT;

    fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    async fn writer(&self) -> Result<Self::Writer, crate::StoreError> {
        self.pool.acquire().await.map_err(db_err)
    }
}

/// Which server answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    MySql,
    MariaDb,
}

/// Parses `VERSION()`: "8.0.36", "10.11.6-MariaDB-0+deb12u1", "11.4.2-MariaDB".
pub fn parse_version(v: &str) -> (Flavor, u32, u32) {
    let flavor = if v.to_lowercase().contains("mariadb") { Flavor::MariaDb } else { Flavor::MySql };
    let mut parts = v.split(|c: char| !c.is_ascii_digit()).filter(|p| !p.is_empty()).map(|p| p.parse::<u32>().unwrap_or(0));
    (flavor, parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// MySQL 8.0 or MariaDB 10.5, the oldest servers accepted.
pub fn version_supported(flavor: Flavor, major: u32, minor: u32) -> bool {
    match flavor {
        Flavor::MySql => major >= 8,
        Flavor::MariaDb => major > 10 || (major == 10 && minor >= 5),
    }
}

impl MySqlStore {
    /// Connects, checks the server, applies migrations and probes the
    /// privileges gnomon needs. Every failure is explained.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Self, crate::StoreError> {
        let target = redact(url);
        let connect = MySqlConnectOptions::from_str(url)
            .map_err(|e| crate::StoreError::InvalidUrl(format!("{target}: {e}")))?
            .log_statements(tracing::log::LevelFilter::Trace);
        // One probing connection first: the flavor decides the session settings.
        let mut probe = connect.connect().await.map_err(|e| explain_open_error("mysql", &target, e))?;
        let version: String =
            sqlx::query_scalar("SELECT VERSION()").fetch_one(&mut probe).await.map_err(|e| explain_open_error("mysql", &target, e))?;
        let (flavor, major, minor) = parse_version(&version);
        if !version_supported(flavor, major, minor) {
            return Err(crate::StoreError::Backend(format!(
                "mysql at {target} is version {version}; gnomon needs MySQL 8.0 or MariaDB 10.5 or newer"
            )));
        }
        let engine: String = sqlx::query_scalar("SELECT @@default_storage_engine").fetch_one(&mut probe).await.unwrap_or_default();
        if !engine.eq_ignore_ascii_case("innodb") {
            tracing::warn!(engine, "default storage engine is not InnoDB; gnomon creates its tables with ENGINE=InnoDB");
        }
        drop(probe);
        let lock_secs = options.lock_timeout.as_secs().max(1);
        let statement = match flavor {
            Flavor::MariaDb => format!("SET SESSION max_statement_time = {}", options.statement_timeout.as_secs_f64()),
            Flavor::MySql => format!("SET SESSION max_execution_time = {}", options.statement_timeout.as_millis()),
        };
        // MariaDB closes a connection idle inside a transaction after
        // idle_transaction_timeout; MySQL has no such setting, so there the
        // whole session's wait_timeout bounds it (and the pool retires idle
        // connections before the server would).
        let idle_tx = options.idle_in_transaction_timeout.as_secs().max(1);
        let idle = match flavor {
            Flavor::MariaDb => format!("SET SESSION idle_transaction_timeout = {idle_tx}"),
            Flavor::MySql => format!("SET SESSION wait_timeout = {}", idle_tx.max(10)),
        };
        let session = format!("SET SESSION innodb_lock_wait_timeout = {lock_secs}; {statement}; {idle}");
        let pool = MySqlPoolOptions::new()
            .max_connections(options.pool_max)
            .min_connections(options.pool_min)
            .acquire_timeout(options.connect_timeout)
            .idle_timeout(match flavor {
                Flavor::MariaDb => None,
                Flavor::MySql => Some(std::time::Duration::from_secs(options.idle_in_transaction_timeout.as_secs().max(10) / 2)),
            })
            .after_connect(move |conn, _meta| {
                let session = session.clone();
                Box::pin(async move {
                    conn.execute(sqlx::raw_sql(&session)).await?;
                    Ok(())
                })
            })
            .connect_with(connect)
            .await
            .map_err(|e| explain_open_error("mysql", &target, e))?;
        let store = SqlStore::new(MySqlBackend { pool, flavor });
        store.migrate().await?;
        store.probe().await?;
        Ok(store)
    }

    /// Which server answered.
    pub fn flavor(&self) -> Flavor {
        self.db.flavor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_parsed_and_checked() {
        assert_eq!(parse_version("10.11.6-MariaDB-0+deb12u1"), (Flavor::MariaDb, 10, 11));
        assert_eq!(parse_version("8.0.36"), (Flavor::MySql, 8, 0));
        assert!(version_supported(Flavor::MariaDb, 10, 11));
        assert!(version_supported(Flavor::MariaDb, 11, 0));
        assert!(!version_supported(Flavor::MariaDb, 10, 4));
        assert!(!version_supported(Flavor::MySql, 5, 7));
        assert!(version_supported(Flavor::MySql, 8, 4));
    }
}
