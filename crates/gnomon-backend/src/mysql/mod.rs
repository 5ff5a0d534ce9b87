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

use crate::sql::migrate::{MigrationLock, LEGACY_SERVER, MYSQL};
use crate::sql::{db_err, explain_open_error, redact, Backend, Dialect, SqlStore};
use crate::StoreOptions;

const DIALECT: Dialect = Dialect {
    name: "mysql",
    numbered: false,
    for_update: " FOR UPDATE",
    greatest: "GREATEST",
    begin: None,
    case_chunk: 125,
    ignore_suffix: " ON DUPLICATE KEY UPDATE {key} = {key}",
    heads_json: None,
    migrations: MYSQL,
    // Lock names are server-wide: this database's own.
    migration_lock: MigrationLock::Session {
        lock: "SELECT CAST(GET_LOCK(CONCAT('gnomon/migrate/', SHA1(DATABASE())), 60) AS SIGNED)",
        unlock: "SELECT RELEASE_LOCK(CONCAT('gnomon/migrate/', SHA1(DATABASE())))",
    },
    already_made,
    legacy_table_query:
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'gnomon_migrations'",
    legacy: LEGACY_SERVER,
    size_query:
        "SELECT CAST(COALESCE(SUM(data_length + index_length), 0) AS SIGNED) FROM information_schema.tables WHERE table_schema = DATABASE()",
    // SYSDATE, not NOW: the time the function runs, not the statement's start.
    clock_query: Some("SELECT CAST(ROUND(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED)"),
    // JSON_TABLE's column collations and its optimiser support differ
    // between MariaDB and MySQL 8; the CASE statements work on both.
};

/// Whether a migration statement failed because its change is already
/// there: a duplicate column (1060) or index name (1061), or an index to
/// drop that is gone (1091). A MySQL step is not transactional, so one cut
/// off before its version was recorded runs again (see `sql/migrate.rs`).
fn already_made(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => {
            d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some_and(|m| matches!(m.number(), 1060 | 1061 | 1091))
        }
        _ => false,
    }
}

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
        let store = Self::connect(url, options).await?;
        store.migrate().await?;
        store.probe().await?;
        Ok(store)
    }

    /// Connects and checks the server, without migrating.
    pub(crate) async fn connect(url: &str, options: &StoreOptions) -> Result<Self, crate::StoreError> {
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
        Ok(SqlStore::new(MySqlBackend { pool, flavor }))
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
