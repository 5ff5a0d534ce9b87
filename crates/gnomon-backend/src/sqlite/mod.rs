//! The embedded SQLite store (WAL, `synchronous=FULL`).
//!
//! Every write transaction starts with `BEGIN IMMEDIATE`, so it holds
//! SQLite's single write lock from its first statement: the fencing check
//! and the writes that follow cannot interleave with another writer, in this
//! process or another one sharing the file. Reads and the API's writes use
//! sqlx and the shared queries of `sql/` (without `FOR UPDATE`,
//! which that lock makes moot). The leader's writes (fires, transitions and
//! both in one turn) run in one call on a kept `rusqlite` connection, see
//! `sqlite/write.rs`. Both writer connections are used under one lock.

pub(crate) mod write;

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use std::sync::Arc;

use sqlx::{SqliteConnection, SqlitePool};

use crate::sql::migrate::{MigrationLock, LEGACY_SQLITE, SQLITE};
use crate::sql::{Backend, Dialect, SqlStore, TurnResult};
use crate::StoreError;

const DIALECT: Dialect = Dialect {
    name: "sqlite",
    numbered: false,
    for_update: "",
    greatest: "MAX",
    begin: Some("BEGIN IMMEDIATE"),
    case_chunk: 32,
    ignore_suffix: " ON CONFLICT DO NOTHING",
    heads_json: Some("SELECT json_group_array(json_array(uid, version, last_scheduled_at)) FROM jobs"),
    migrations: SQLITE,
    // Each step in a write transaction: SQLite's write lock serialises
    // them, across processes sharing the file too.
    migration_lock: MigrationLock::Begin("BEGIN IMMEDIATE"),
    already_made: crate::sql::dialect::never_made,
    legacy_table_query: "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'gnomon_migrations'",
    legacy: LEGACY_SQLITE,
    size_query: "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
    clock_query: None,
};

/// The embedded SQLite store.
pub type SqliteStore = SqlStore<SqliteBackend>;

/// A SQLite database file as the SQL store uses it.
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    /// Reads.
    pool: SqlitePool,
    /// Write transactions: one connection of their own, kept (not a pool:
    /// a pool pings every connection it gets back, a round trip on each
    /// write), since SQLite has one writer anyway. Writers queue here
    /// instead of in SQLite's sleeping busy handler, and the connection's
    /// page cache stays warm (a pool of several rotated the leader's writes
    /// through connections whose caches the other writes had invalidated).
    writer: Arc<tokio::sync::Mutex<Writer>>,
    /// To reopen the writer connection.
    options: SqliteConnectOptions,
    /// Commits are fsynced (`synchronous=FULL`; `OFF` for a cache).
    durable: bool,
    /// The background checkpointer, stopped with the last handle.
    _checkpointer: Arc<Checkpointer>,
}

/// How often the WAL is checkpointed into the database file. Not by the
/// committing writer (SQLite's `wal_autocheckpoint` does it inside the
/// commit that crosses 1,000 pages, so every fiftieth leader write or so
/// also copied 4 MB and fsynced the database file), but from a read
/// connection beside it: a `PASSIVE` checkpoint never blocks the writer.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);

#[derive(Debug)]
struct Checkpointer(tokio::task::JoinHandle<()>);

/// The kept writer connections, and when the sqlx one was last known to
/// work. Both are used under the one lock, so the store's writes queue
/// in-process and never meet in SQLite's sleeping busy handler.
pub struct Writer {
    conn: SqliteConnection,
    checked: std::time::Instant,
    /// The leader's writes (`sqlite/write.rs`); `None` while a write
    /// has it on a blocking thread, or after one panicked (reopened then).
    native: Option<rusqlite::Connection>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("checked", &self.checked).field("native", &self.native.is_some()).finish()
    }
}

/// How long the writer connection is trusted without a check: at most one
/// ping a second, and a connection that fails it is reopened.
const WRITER_CHECK_EVERY: Duration = Duration::from_secs(1);

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl SqliteBackend {
    async fn connect(
        url: &str,
        options: SqliteConnectOptions,
        checkpointer: Option<tokio::task::JoinHandle<()>>,
        durable: bool,
    ) -> Result<Self, StoreError> {
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await
            .map_err(|e| StoreError::Unavailable(format!("cannot open {url}: {e}")))?;
        let writer =
            sqlx::Connection::connect_with(&options).await.map_err(|e| StoreError::Unavailable(format!("cannot open {url}: {e}")))?;
        Ok(Self {
            pool,
            writer: Arc::new(tokio::sync::Mutex::new(Writer { conn: writer, checked: std::time::Instant::now(), native: None })),
            options,
            durable,
            _checkpointer: Arc::new(Checkpointer(checkpointer.unwrap_or_else(|| tokio::spawn(async {})))),
        })
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `sqlite://PATH` and applies
    /// migrations.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, true).await
    }

    /// As [`SqliteStore::open`], without an fsync per commit
    /// (`synchronous=OFF`): for a database that is a cache of something
    /// durable and is rebuilt from it after a crash (the raft state
    /// machine, rebuilt from its snapshot and log).
    pub async fn open_cache(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, false).await
    }

    async fn open_with(url: &str, durable: bool) -> Result<Self, StoreError> {
        if url.contains(":memory:") {
            // Each connection would have a database of its own.
            return Err(StoreError::InvalidUrl(format!("{url}: an in-memory SQLite store is not supported; give a file path")));
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::InvalidUrl(format!("{url}: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(if durable { SqliteSynchronous::Full } else { SqliteSynchronous::Off })
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true)
            .pragma("wal_autocheckpoint", "0");
        // Migrate first, on connections that are then closed: a connection
        // that loaded the schema before a migration changed it would report
        // a `SELECT *` with the old columns while SQLite returns the new ones
        // (sqlx keeps the column list of its first prepare).
        let migrating = SqlStore::new(SqliteBackend::connect(url, options.clone(), None, durable).await?);
        migrating.migrate().await?;
        migrating.db.pool.close().await;
        drop(migrating);
        let checkpoints = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .map_err(|e| StoreError::Unavailable(format!("cannot open {url}: {e}")))?;
        let checkpointer = tokio::spawn(async move {
            let mut every = tokio::time::interval(CHECKPOINT_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&checkpoints).await {
                    tracing::debug!(error = %e, "WAL checkpoint failed; retrying");
                }
            }
        });
        let db = SqliteBackend::connect(url, options, Some(checkpointer), durable).await?;
        let native = crate::sqlite::write::open(db.options.get_filename(), durable)?;
        db.writer.lock().await.native = Some(native);
        Ok(SqlStore::new(db))
    }
}

impl Backend for SqliteBackend {
    type Db = sqlx::Sqlite;
    /// The kept sqlx writer connection, under the lock both writers share.
    type Writer = tokio::sync::OwnedMappedMutexGuard<Writer, SqliteConnection>;
    const DIALECT: &'static Dialect = &DIALECT;

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn writer(&self) -> Result<Self::Writer, StoreError> {
        let mut w = self.writer.clone().lock_owned().await;
        if w.checked.elapsed() >= WRITER_CHECK_EVERY {
            if let Err(e) = sqlx::Connection::ping(&mut w.conn).await {
                tracing::warn!(error = %e, "the SQLite writer connection failed its check; reopening it");
                w.conn = sqlx::Connection::connect_with(&self.options).await.map_err(crate::sql::db_err)?;
            }
            w.checked = std::time::Instant::now();
        }
        Ok(tokio::sync::OwnedMutexGuard::map(w, |w| &mut w.conn))
    }

    /// A leader write (fire, transitions or both) in one call on a blocking
    /// thread, on the kept `rusqlite` connection: see `sqlite/write.rs`.
    async fn native_turn_write(
        &self,
        fence: &crate::Fence,
        runs: &[crate::NewRun],
        advances: &[crate::JobAdvance],
        transitions: &[crate::Transition],
    ) -> Option<TurnResult> {
        if let Err(e) = crate::Transition::check_lifecycle(transitions) {
            return Some(Err(e));
        }
        let mut w = self.writer.lock().await;
        let conn = match w.native.take() {
            Some(c) => c,
            None => match crate::sqlite::write::open(self.options.get_filename(), self.durable) {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            },
        };
        // One hand-off to a blocking thread for the whole write. (Running it
        // in place with `block_in_place` measured the same, and would need a
        // second path for current-thread runtimes.)
        let (fence, runs, advances, transitions) = (fence.clone(), runs.to_vec(), advances.to_vec(), transitions.to_vec());
        let done = tokio::task::spawn_blocking(move || {
            let mut conn = conn;
            let result = crate::sqlite::write::turn_write(&mut conn, &fence, &runs, &advances, &transitions);
            (conn, result)
        })
        .await;
        Some(match done {
            Ok((conn, result)) => {
                w.native = Some(conn);
                result
            }
            // Rolled back with the connection, which is reopened next time.
            Err(e) => Err(StoreError::Backend(format!("the SQLite write failed: {e}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn open_temp() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("gnomon.db").display());
        (dir, url)
    }

    #[tokio::test]
    async fn conformance_suite_passes_on_sqlite() {
        let (_dir, url) = open_temp().await;
        let url2 = url.clone();
        crate::testing::conformance::store_suite(move || {
            let url = url2.clone();
            async move { Arc::new(SqliteStore::open(&url).await.unwrap()) as Arc<dyn Store> }
        })
        .await;
        let _ = url;
    }

    #[tokio::test]
    async fn elector_suite_passes_on_local() {
        let (_dir, url) = open_temp().await;
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&url).await.unwrap());
        crate::testing::conformance::elector_suite(store.clone(), Arc::new(crate::election::local::LocalElector::new(store))).await;
    }

    use crate::Store;
}
