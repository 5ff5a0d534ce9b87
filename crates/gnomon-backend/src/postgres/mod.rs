//! The PostgreSQL store (`postgres://…`), PostgreSQL 12 or newer.
//!
//! Runs at PostgreSQL's default READ COMMITTED isolation; correctness comes
//! from the row locks described in `sql/`. TLS, the application name
//! and the like come from the URL's standard parameters (`sslmode=require`,
//! `sslrootcert=…`); `statement_timeout` and `lock_timeout` are set on every
//! connection from [`StoreOptions`].

pub mod lock;

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::sql::migrate::Migration;
use crate::sql::{db_err, explain_open_error, redact, Backend, Dialect, SqlStore};
use crate::StoreOptions;

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        statements: &[
            "CREATE TABLE jobs (
            uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL,
            version BIGINT NOT NULL, paused BIGINT NOT NULL DEFAULT 0,
            created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
            last_scheduled_at BIGINT, change_seq BIGINT NOT NULL,
            UNIQUE (namespace, name))",
            "CREATE INDEX jobs_change_seq ON jobs (change_seq)",
            "CREATE TABLE job_deletions (uid TEXT PRIMARY KEY, change_seq BIGINT NOT NULL)",
            "CREATE INDEX job_deletions_seq ON job_deletions (change_seq)",
            "CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
            "INSERT INTO counters (name, value) VALUES ('job_change_seq', 0)",
            "CREATE TABLE runs (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id TEXT NOT NULL UNIQUE,
            job_uid TEXT NOT NULL, namespace TEXT NOT NULL, job TEXT NOT NULL,
            scheduled_at BIGINT NOT NULL, fired_at BIGINT NOT NULL,
            state TEXT NOT NULL, attempt BIGINT NOT NULL DEFAULT 0, reason TEXT,
            next_attempt_at BIGINT, manual BIGINT NOT NULL DEFAULT 0,
            cancel_requested BIGINT NOT NULL DEFAULT 0, updated_at BIGINT NOT NULL,
            UNIQUE (job_uid, scheduled_at))",
            "CREATE INDEX runs_open ON runs (state) WHERE state IN ('pending', 'assigned', 'running', 'retrying')",
            "CREATE INDEX runs_by_job ON runs (namespace, job, seq)",
            "CREATE INDEX runs_by_state ON runs (state, seq)",
            "CREATE TABLE attempts (
            run_id TEXT NOT NULL, attempt BIGINT NOT NULL, worker TEXT NOT NULL, token BIGINT NOT NULL,
            state TEXT NOT NULL, assigned_at BIGINT NOT NULL, started_at BIGINT, ended_at BIGINT,
            exit_code BIGINT, output TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (run_id, attempt))",
            "CREATE TABLE leadership (
            scope TEXT PRIMARY KEY, token BIGINT NOT NULL, holder TEXT NOT NULL,
            address TEXT NOT NULL, backend TEXT NOT NULL, since BIGINT NOT NULL)",
            "CREATE TABLE epochs (scope TEXT PRIMARY KEY, epoch BIGINT NOT NULL)",
        ],
    },
    // When a job was last paused and resumed (see the MySQL migration 2).
    Migration {
        version: 2,
        statements: &["ALTER TABLE jobs ADD COLUMN IF NOT EXISTS paused_at BIGINT, ADD COLUMN IF NOT EXISTS resumed_at BIGINT"],
    },
    // Manual runs have ids of their own (see the MySQL migration 3).
    Migration { version: 3, statements: &["ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_job_uid_scheduled_at_key"] },
    // When a job's schedule last changed and what it was (see the SQLite
    // migration 5).
    Migration {
        version: 4,
        statements: &[
            "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS schedule_changed_at BIGINT, ADD COLUMN IF NOT EXISTS previous_schedule TEXT",
        ],
    },
    // The committed leader time (see the SQLite migration 6).
    Migration { version: 5, statements: &["ALTER TABLE leadership ADD COLUMN IF NOT EXISTS leader_time BIGINT NOT NULL DEFAULT 0"] },
    Migration {
        version: 6,
        statements: &[
            "CREATE TABLE IF NOT EXISTS notifications (
            id TEXT NOT NULL PRIMARY KEY, run_id TEXT NOT NULL, namespace TEXT NOT NULL, job TEXT NOT NULL,
            outcome TEXT NOT NULL, target TEXT NOT NULL, state TEXT NOT NULL, attempts BIGINT NOT NULL,
            next_at BIGINT NOT NULL, last_error TEXT, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS notifications_by_run ON notifications (run_id)",
            "CREATE INDEX IF NOT EXISTS notifications_due ON notifications (next_at) WHERE state = 'pending'",
        ],
    },
    // A run's parameter values (see the SQLite migration 8).
    Migration { version: 7, statements: &["ALTER TABLE runs ADD COLUMN IF NOT EXISTS params TEXT"] },
    // The body of the webhook call that started a run (see the SQLite
    // migration 9).
    Migration { version: 8, statements: &["ALTER TABLE runs ADD COLUMN IF NOT EXISTS payload TEXT"] },
    // A dependency run's origin and edges; `waiting` is an open state (see
    // the SQLite migration 10).
    Migration {
        version: 9,
        statements: &[
            "ALTER TABLE runs ADD COLUMN IF NOT EXISTS upstream TEXT",
            "DROP INDEX IF EXISTS runs_open",
            "CREATE INDEX IF NOT EXISTS runs_open ON runs (state) WHERE state IN ('waiting', 'pending', 'assigned', 'running', 'retrying')",
        ],
    },
    // Backfills (see the SQLite migration 11).
    Migration {
        version: 10,
        statements: &[
            "CREATE TABLE IF NOT EXISTS backfills (
                id TEXT PRIMARY KEY, namespace TEXT NOT NULL, job TEXT NOT NULL, job_uid TEXT NOT NULL,
                from_ms BIGINT NOT NULL, to_ms BIGINT NOT NULL, params TEXT, rate BIGINT NOT NULL, total BIGINT NOT NULL,
                cursor_ms BIGINT NOT NULL, state TEXT NOT NULL, created BIGINT NOT NULL, kept BIGINT NOT NULL, reason TEXT,
                created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS backfills_by_state ON backfills (state)",
        ],
    },
];

const DIALECT: Dialect = Dialect {
    name: "postgres",
    numbered: true,
    for_update: " FOR UPDATE",
    greatest: "GREATEST",
    begin: None,
    case_chunk: 125,
    ignore_suffix: " ON CONFLICT DO NOTHING",
    heads_json: None,
    migrate_lock: "SELECT pg_advisory_lock(74007400)",
    migrate_unlock: "SELECT pg_advisory_unlock(74007400)",
    migrations: MIGRATIONS,
    size_query: "SELECT pg_database_size(current_database())::BIGINT",
    // clock_timestamp, not now(): the time it runs, not the transaction's start.
    clock_query: Some("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"),
    // Tried: the same statements over `json_to_recordset($1::json)` doubled
    // batched transitions/s but cut small batches (50 runs) from 1,700 to
    // 340 runs/s: the prepared statement's generic plan joins by scanning
    // `runs`. The `CASE` statements are planned per batch.
};

/// The oldest server accepted (`server_version_num`).
const MIN_VERSION_NUM: i64 = 120000;

/// The PostgreSQL store.
pub type PgStore = SqlStore<PgBackend>;

/// A PostgreSQL database as the SQL store uses it: a pool, whose
/// connections also carry write transactions.
#[derive(Debug, Clone)]
pub struct PgBackend {
    pool: PgPool,
}

impl Backend for PgBackend {
    type Db = sqlx::Postgres;
    /// Write transactions take a connection from the pool, a fresh one
    /// after the server closed one.
    type Writer = sqlx::pool::PoolConnection<sqlx::Postgres>;
    const DIALECT: &'static Dialect = &DIALECT;

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn writer(&self) -> Result<Self::Writer, crate::StoreError> {
        self.pool.acquire().await.map_err(db_err)
    }
}

impl PgStore {
    /// Connects, checks the server, applies migrations and probes the
    /// privileges gnomon needs. Every failure is explained.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Self, crate::StoreError> {
        let target = redact(url);
        let statement_ms = options.statement_timeout.as_millis().to_string();
        let lock_ms = options.lock_timeout.as_millis().to_string();
        let idle_tx_ms = options.idle_in_transaction_timeout.as_millis().max(1000).to_string();
        let connect = PgConnectOptions::from_str(url)
            .map_err(|e| crate::StoreError::InvalidUrl(format!("{target}: {e}")))?
            .options([
                ("statement_timeout", statement_ms.as_str()),
                ("lock_timeout", lock_ms.as_str()),
                ("idle_in_transaction_session_timeout", idle_tx_ms.as_str()),
            ])
            .log_statements(tracing::log::LevelFilter::Trace);
        let pool = PgPoolOptions::new()
            .max_connections(options.pool_max)
            .min_connections(options.pool_min)
            .acquire_timeout(options.connect_timeout)
            .connect_with(connect)
            .await
            .map_err(|e| explain_open_error("postgres", &target, e))?;
        let version: String =
            sqlx::query_scalar("SHOW server_version_num").fetch_one(&pool).await.map_err(|e| explain_open_error("postgres", &target, e))?;
        let num: i64 = version.trim().parse().unwrap_or(0);
        if num < MIN_VERSION_NUM {
            return Err(crate::StoreError::Backend(format!("postgres at {target} is version {num}; gnomon needs PostgreSQL 12 or newer")));
        }
        let store = SqlStore::new(PgBackend { pool });
        store.migrate().await?;
        store.probe().await?;
        Ok(store)
    }
}
