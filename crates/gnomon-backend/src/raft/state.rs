//! The replicated state machine: the embedded SQLite store, written only by
//! applying committed log entries, in log order, on every member.
//!
//! Every write the store has (job writes, fences, fires, transitions,
//! worker bindings) is a [`Command`] in the log; applying it calls the same
//! SQLite store method a single server would call, with the times and the
//! new job's uid the proposer put in the command, so every member computes
//! the same state and the same [`Applied`] answer. The SQLite semantics —
//! fencing by token, fire uniqueness, CAS transitions — are those of the
//! `sqlite` store, tested by the same suites.
//!
//! The database is a cache of the log: a member starts from its latest
//! snapshot (a copy of the database made with `VACUUM INTO`, kept on disk
//! as `snapshot-<id>.db`, named with its meta in `snapshot.json`) and Raft
//! re-applies the committed entries after it. So a crash between applying
//! an entry and recording that it was applied can never apply an entry
//! twice. Installing a snapshot from the leader (received into a file by
//! the network service) copies it to a new database file and swaps it in.
//! Snapshots are files end to end, never held in memory whole.

// The error types are tonic's and openraft's.
#![allow(clippy::result_large_err)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};

use super::types::{Applied, Command, Entry, LogId, Reply, SnapshotFile, SnapshotMeta, StorageError, StoredMembership, TypeConfig};
use crate::roles::*;
use crate::sqlite::SqliteStore;
use crate::{StoreError, TurnBatch};

/// The database that reads are served from; swapped when a snapshot is
/// installed.
#[derive(Debug)]
pub struct Current {
    store: RwLock<Arc<SqliteStore>>,
}

impl Current {
    pub fn store(&self) -> Arc<SqliteStore> {
        self.store.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

pub struct StateMachine {
    dir: PathBuf,
    pub current: Arc<Current>,
    /// The file of the current database (only the state machine swaps it).
    path: PathBuf,
    generation: u64,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    /// The latest snapshot's meta and file.
    snapshot: Option<(SnapshotMeta, PathBuf)>,
    /// Numbers the files snapshots are received into.
    receiving: u64,
}

/// `snapshot.json`: the latest snapshot's meta and the file holding it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Latest {
    meta: SnapshotMeta,
    file: String,
}

fn sm_err(e: impl std::fmt::Display) -> StorageError {
    super::types::err::write_state_machine(e)
}

fn snap_err(e: impl std::fmt::Display) -> StorageError {
    super::types::err::write_snapshot(e)
}

/// Writes `data` to `path` durably (temporary file, fsync, rename).
fn write_durably(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    rename_durably(&tmp, path)
}

/// Renames `from` (whose data is already synced) to `to`, and syncs the
/// directory so the rename survives a crash.
fn rename_durably(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::rename(from, to)?;
    if let Some(dir) = to.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Runs file work on a blocking thread.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, StorageError> + Send + 'static) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(f).await.map_err(snap_err)?
}

/// The file name a snapshot is kept under.
fn snapshot_file_name(meta: &SnapshotMeta) -> String {
    format!("snapshot-{}.db", meta.snapshot_id)
}

fn remove_db(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

impl StateMachine {
    /// Opens the member's state: the latest snapshot, or an empty database.
    pub async fn open(dir: &Path) -> Result<StateMachine, StoreError> {
        let bad = |e: std::io::Error| StoreError::Backend(format!("cannot prepare the raft state in {}: {e}", dir.display()));
        // Databases of an earlier run are caches of the log, and files
        // being received or built when it stopped are incomplete: start
        // afresh.
        for e in std::fs::read_dir(dir).map_err(bad)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("state-") || name.starts_with("incoming-") || name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let meta_path = dir.join("snapshot.json");
        let snapshot = match std::fs::read(&meta_path) {
            Ok(m) => {
                let corrupt = |e: serde_json::Error| StoreError::Corrupt(format!("{}: {e}", meta_path.display()));
                // An earlier layout kept the meta alone, with the data in
                // `snapshot.db`.
                let latest = serde_json::from_slice::<Latest>(&m).or_else(|_| {
                    serde_json::from_slice::<SnapshotMeta>(&m).map(|meta| Latest { meta, file: "snapshot.db".into() }).map_err(corrupt)
                })?;
                Some((latest.meta, dir.join(latest.file)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(bad(e)),
        };
        let path = dir.join("state-1.db");
        if let Some((_, file)) = &snapshot {
            std::fs::copy(file, &path).map_err(bad)?;
        }
        let store = SqliteStore::open_cache(&format!("sqlite://{}", path.display())).await?;
        let (last_applied, membership) = match &snapshot {
            Some((m, _)) => (m.last_log_id, m.last_membership.clone()),
            None => (None, StoredMembership::default()),
        };
        Ok(StateMachine {
            dir: dir.to_path_buf(),
            current: Arc::new(Current { store: RwLock::new(Arc::new(store)) }),
            path,
            generation: 1,
            last_applied,
            membership,
            snapshot,
            receiving: 0,
        })
    }

    async fn exec(&self, cmd: Command) -> Applied {
        let store = self.current.store();
        Ok(match cmd {
            Command::PutJob { spec, precondition, now, uid } => {
                Reply::Job(Box::new(crate::sql::CHOSEN_UID.scope(uid, store.write_job(&spec, precondition, now, false)).await?))
            }
            Command::PutJobChecked { spec, precondition, now, uid } => {
                Reply::Job(Box::new(crate::sql::CHOSEN_UID.scope(uid, store.write_job(&spec, precondition, now, true)).await?))
            }
            Command::SetJobPaused { namespace, name, paused, now } => {
                Reply::Job(Box::new(store.set_job_paused(&namespace, &name, paused, now).await?))
            }
            Command::DeleteJob { namespace, name, precondition } => {
                store.remove_job(&namespace, &name, precondition, false).await?;
                Reply::Done
            }
            Command::DeleteJobChecked { namespace, name, precondition } => {
                store.remove_job(&namespace, &name, precondition, true).await?;
                Reply::Done
            }
            Command::NextEpoch { scope } => Reply::Epoch(store.next_epoch(&scope).await?),
            Command::Fence { fence, holder, now } => {
                store.fence(&fence, &holder, now).await?;
                Reply::Done
            }
            Command::Fire { fence, runs, advances } | Command::FireExt { fence, runs, advances } => {
                Reply::Fired(store.fire(&fence, &runs, &advances).await?)
            }
            Command::Transition { fence, transitions } => Reply::Transitioned(store.transition(&fence, &transitions).await?),
            Command::Turn { fence, runs, advances, transitions } | Command::TurnExt { fence, runs, advances, transitions } => {
                let batch = TurnBatch { runs, advances, transitions, ..TurnBatch::default() };
                Reply::Turn(Box::new(store.write_turn(&fence, &batch).await?))
            }
            Command::TurnBatch { fence, batch } => Reply::Turn(Box::new(store.write_turn(&fence, &batch).await?)),
            Command::RequestCancel { run_id, now } => Reply::Cancel(store.request_cancel(&run_id, now).await?),
            Command::Prune { fence, keep_per_job, before, keep_keyed_after, max } => {
                Reply::Pruned(store.prune(&fence, keep_per_job, before, keep_keyed_after, max).await?)
            }
            Command::LeaderTime { fence, at } => Reply::LeaderTime(store.advance_leader_time(&fence, at).await?),
            Command::SettleNotification { fence, delivery } => Reply::Settled(store.settle_notification(&fence, &delivery).await?),
            Command::CreateBackfill { backfill, now } => Reply::Backfill(Box::new(store.create_backfill(&backfill, now).await?)),
            Command::CancelBackfill { id, now } => Reply::Backfill(Box::new(store.cancel_backfill(&id, now).await?)),
            Command::AdvanceBackfill { fence, progress } => Reply::Settled(store.advance_backfill(&fence, &progress).await?),
            Command::BindWorker { worker, credential, now } => Reply::Owner(store.bind_worker(&worker, &credential, now).await?),
            Command::UnbindWorker { worker } => Reply::Settled(store.unbind_worker(&worker).await?),
        })
    }

    /// A consistent copy of the database as of `last_applied`, synced, in
    /// a temporary file. On a blocking thread: the state machine waits (no
    /// entry is applied meanwhile) but the runtime's threads do not.
    async fn copy_database(&self) -> Result<PathBuf, StorageError> {
        let (tmp, from) = (self.dir.join("snapshot-building.tmp"), self.path.clone());
        blocking(move || {
            let _ = std::fs::remove_file(&tmp);
            let conn = rusqlite::Connection::open(&from).map_err(snap_err)?;
            conn.execute("VACUUM INTO ?1", [tmp.display().to_string()]).map_err(snap_err)?;
            drop(conn);
            std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(snap_err)?;
            Ok(tmp)
        })
        .await
    }

    /// Makes the synced file `data` the latest snapshot: renamed to its
    /// snapshot name, then named in `snapshot.json` (so a crash leaves
    /// either the old snapshot or the new one, whole), then the older
    /// files removed (one being sent stays readable through its open
    /// handle).
    fn keep_snapshot(&mut self, meta: SnapshotMeta, data: &Path) -> Result<PathBuf, StorageError> {
        let name = snapshot_file_name(&meta);
        let path = self.dir.join(&name);
        rename_durably(data, &path).map_err(snap_err)?;
        let latest = Latest { meta: meta.clone(), file: name.clone() };
        write_durably(&self.dir.join("snapshot.json"), &serde_json::to_vec(&latest).map_err(snap_err)?).map_err(snap_err)?;
        for e in std::fs::read_dir(&self.dir).map_err(snap_err)?.flatten() {
            let other = e.file_name().to_string_lossy().into_owned();
            if other.starts_with("snapshot") && other.ends_with(".db") && other != name {
                let _ = std::fs::remove_file(e.path());
            }
        }
        self.snapshot = Some((meta, path.clone()));
        Ok(path)
    }
}

/// Hands Raft the snapshot made when it asked for a builder.
pub struct Builder {
    snapshot: Option<Snapshot<TypeConfig>>,
    error: Option<String>,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        match self.snapshot.take() {
            Some(s) => Ok(s),
            None => Err(snap_err(self.error.take().unwrap_or_else(|| "the snapshot was already taken".into()))),
        }
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        for e in entries {
            let applied = match e.payload {
                EntryPayload::Blank => Ok(Reply::None),
                EntryPayload::Normal(cmd) => {
                    let r = self.exec(cmd).await;
                    // An unavailable local database is not an answer: the
                    // member cannot go on without applying the entry.
                    if let Err(StoreError::Unavailable(m)) = &r {
                        return Err(sm_err(format!("applying entry {}: {m}", e.log_id)));
                    }
                    r
                }
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(e.log_id), m);
                    Ok(Reply::None)
                }
            };
            self.last_applied = Some(e.log_id);
            out.push(applied);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Builder {
        // Made here, while no entry is being applied, so the copy is exactly
        // the state as of `last_applied`.
        let made = self.copy_database().await.and_then(|tmp| {
            let id = self.last_applied.map(|l| format!("{}-{}", l.leader_id.term, l.index)).unwrap_or_else(|| "empty".into());
            let meta = SnapshotMeta { last_log_id: self.last_applied, last_membership: self.membership.clone(), snapshot_id: id };
            let path = self.keep_snapshot(meta.clone(), &tmp)?;
            Ok(Snapshot { meta, snapshot: Box::new(SnapshotFile::open(&path).map_err(snap_err)?) })
        });
        match made {
            Ok(s) => Builder { snapshot: Some(s), error: None },
            Err(e) => Builder { snapshot: None, error: Some(e.to_string()) },
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, StorageError> {
        self.receiving += 1;
        let path = self.dir.join(format!("incoming-sm-{}.db", self.receiving));
        std::fs::File::create(&path).map_err(snap_err)?;
        Ok(Box::new(SnapshotFile::open(&path).map_err(snap_err)?))
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Box<SnapshotFile>) -> Result<(), StorageError> {
        let received = snapshot.path.clone();
        drop(snapshot);
        self.generation += 1;
        let path = self.dir.join(format!("state-{}.db", self.generation));
        remove_db(&path);
        let (from, to) = (received.clone(), path.clone());
        blocking(move || std::fs::copy(&from, &to).map_err(snap_err)).await?;
        // Opened on a thread of its own: the open's future is not `Send`
        // in the form this trait method needs (sqlx's executor lifetimes).
        let url = format!("sqlite://{}", path.display());
        let handle = tokio::runtime::Handle::current();
        let store = tokio::task::spawn_blocking(move || handle.block_on(SqliteStore::open_cache(&url)))
            .await
            .map_err(snap_err)?
            .map_err(snap_err)?;
        *self.current.store.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(store);
        let old = std::mem::replace(&mut self.path, path);
        remove_db(&old);
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        tracing::info!(snapshot = %meta.snapshot_id, "raft: installed a snapshot from the leader");
        std::fs::File::open(&received).and_then(|f| f.sync_all()).map_err(snap_err)?;
        self.keep_snapshot(meta.clone(), &received).map(|_| ())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        match &self.snapshot {
            None => Ok(None),
            Some((meta, path)) => {
                let file = SnapshotFile::open(path).map_err(snap_err)?;
                Ok(Some(Snapshot { meta: meta.clone(), snapshot: Box::new(file) }))
            }
        }
    }
}
