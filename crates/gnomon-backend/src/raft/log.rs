//! The Raft log, the vote and the commit index of one member, durable in a
//! SQLite file of their own (`log.db`): WAL, `synchronous=FULL`, so an
//! append is on disk (fsynced) before Raft is told it is. Entries are
//! postcard (compact binary) behind a marker byte; JSON ones still read.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use rusqlite::{params, Connection, OptionalExtension};

use super::types::{err, from_bytes, to_binary, Entry, LogId, StorageError, TypeConfig, Vote};

/// The log of one member. Clones share the connection (the log reader Raft
/// asks for is one).
#[derive(Clone)]
pub struct LogStore {
    conn: Arc<Mutex<Connection>>,
}

impl LogStore {
    pub fn open(path: &Path) -> Result<LogStore, String> {
        let conn = Connection::open(path).map_err(|e| format!("cannot open the Raft log {}: {e}", path.display()))?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             CREATE TABLE IF NOT EXISTS log (idx INTEGER PRIMARY KEY, entry BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v BLOB NOT NULL);",
        )
        .map_err(|e| format!("cannot prepare the Raft log {}: {e}", path.display()))?;
        Ok(LogStore { conn: Arc::new(Mutex::new(conn)) })
    }

    /// Runs `f` on the connection on a blocking thread.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> rusqlite::Result<T> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = conn.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut c)
        })
        .await
        .unwrap_or_else(|e| Err(rusqlite::Error::ToSqlConversionFailure(Box::new(std::io::Error::other(e.to_string())))))
    }

    fn get_meta<T: serde::de::DeserializeOwned>(c: &Connection, k: &str) -> rusqlite::Result<Option<T>> {
        let v: Option<Vec<u8>> = c.query_row("SELECT v FROM meta WHERE k = ?1", [k], |r| r.get(0)).optional()?;
        v.map(|b| serde_json::from_slice(&b).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))).transpose()
    }

    fn put_meta<T: serde::Serialize>(c: &Connection, k: &str, v: &T) -> rusqlite::Result<()> {
        let b = serde_json::to_vec(v).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        c.execute("INSERT INTO meta (k, v) VALUES (?1, ?2) ON CONFLICT (k) DO UPDATE SET v = excluded.v", params![k, b])?;
        Ok(())
    }
}

fn decode(b: &[u8]) -> rusqlite::Result<Entry> {
    from_bytes(b).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(std::io::Error::other(e))))
}

fn bounds(range: &impl RangeBounds<u64>) -> (i64, i64) {
    let lo = match range.start_bound() {
        Bound::Included(&n) => n as i64,
        Bound::Excluded(&n) => n as i64 + 1,
        Bound::Unbounded => 0,
    };
    let hi = match range.end_bound() {
        Bound::Included(&n) => n as i64,
        Bound::Excluded(&n) => n as i64 - 1,
        Bound::Unbounded => i64::MAX,
    };
    (lo, hi)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let (lo, hi) = bounds(&range);
        self.with(move |c| {
            let mut st = c.prepare_cached("SELECT entry FROM log WHERE idx >= ?1 AND idx <= ?2 ORDER BY idx")?;
            let rows = st.query_map(params![lo, hi], |r| r.get::<_, Vec<u8>>(0))?;
            rows.map(|b| decode(&b?)).collect()
        })
        .await
        .map_err(err::read_logs)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        self.with(|c| {
            let purged: Option<LogId> = Self::get_meta(c, "last_purged")?;
            let last: Option<Vec<u8>> = c.query_row("SELECT entry FROM log ORDER BY idx DESC LIMIT 1", [], |r| r.get(0)).optional()?;
            let last = last.map(|b| decode(&b)).transpose()?.map(|e| e.log_id).or(purged);
            Ok(LogState { last_purged_log_id: purged, last_log_id: last })
        })
        .await
        .map_err(err::read_logs)
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let vote = *vote;
        self.with(move |c| Self::put_meta(c, "vote", &vote)).await.map_err(err::write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.with(|c| Self::get_meta(c, "vote")).await.map_err(err::read_vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.with(move |c| Self::put_meta(c, "committed", &committed)).await.map_err(err::write_logs)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        self.with(|c| Ok(Self::get_meta::<Option<LogId>>(c, "committed")?.flatten())).await.map_err(err::read_logs)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let rows: Vec<(i64, Vec<u8>)> = entries
            .into_iter()
            .map(|e| to_binary(&e).map(|b| (e.log_id.index as i64, b)))
            .collect::<Result<_, _>>()
            .map_err(err::write_logs)?;
        let r = self
            .with(move |c| {
                let tx = c.transaction()?;
                {
                    let mut st = tx.prepare_cached("INSERT OR REPLACE INTO log (idx, entry) VALUES (?1, ?2)")?;
                    for (i, b) in &rows {
                        st.execute(params![i, b])?;
                    }
                }
                tx.commit()
            })
            .await;
        match r {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(err::write_logs(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let from = log_id.index as i64;
        self.with(move |c| c.execute("DELETE FROM log WHERE idx >= ?1", [from]).map(|_| ())).await.map_err(err::write_logs)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let upto = log_id.index as i64;
        self.with(move |c| {
            let tx = c.transaction()?;
            Self::put_meta(&tx, "last_purged", &log_id)?;
            tx.execute("DELETE FROM log WHERE idx <= ?1", [upto])?;
            tx.commit()
        })
        .await
        .map_err(err::write_logs)
    }
}
