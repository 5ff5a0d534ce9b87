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

use crate::sql::migrate::{MigrationLock, LEGACY_SERVER, POSTGRES};
use crate::sql::{db_err, explain_open_error, redact, Backend, Dialect, SqlStore};
use crate::StoreOptions;

const DIALECT: Dialect = Dialect {
    name: "postgres",
    numbered: true,
    for_update: " FOR UPDATE",
    greatest: "GREATEST",
    begin: None,
    case_chunk: 125,
    ignore_suffix: " ON CONFLICT DO NOTHING",
    heads_json: None,
    migrations: POSTGRES,
    // Advisory locks are the database's own; released with the step's
    // transaction.
    migration_lock: MigrationLock::InTransaction("SELECT pg_advisory_xact_lock(74007400)"),
    already_made: crate::sql::dialect::never_made,
    legacy_table_query:
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'gnomon_migrations'",
    legacy: LEGACY_SERVER,
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
        let store = Self::connect(url, options).await?;
        store.migrate().await?;
        store.probe().await?;
        Ok(store)
    }

    /// Connects and checks the server, without migrating.
    pub(crate) async fn connect(url: &str, options: &StoreOptions) -> Result<Self, crate::StoreError> {
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
        Ok(SqlStore::new(PgBackend { pool }))
    }
}
