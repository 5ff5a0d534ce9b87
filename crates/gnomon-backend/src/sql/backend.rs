//! [`Backend`], what a SQL database module provides, and [`SqlStore`], the
//! store built on one, with the helpers its roles share: the start-up
//! privilege probe, write transactions, the fencing check and the
//! job change counter.

use std::future::Future;
use std::ops::DerefMut;

use sqlx::Database;

use super::decode::job_from_row;
use super::dialect::Dialect;
use super::driver::{Driver, SqlRow, Tx};
use super::errors::db_err;
use super::query::Query;
use crate::{Fence, FireOutcome, JobAdvance, JobRecord, NewRun, StoreError, Transition};

/// A turn write's fire outcomes (per new run) and applied flags (per transition).
pub type TurnResult = Result<(Vec<FireOutcome>, Vec<bool>), StoreError>;

/// One SQL database as the shared store code uses it.
///
/// To be correct, an implementation must:
/// - give write transactions ([`Backend::writer`]) a connection whose
///   transactions see every committed write (a pool connection, or one kept
///   connection), and begin them as [`Dialect::begin`] says, so that the
///   locking read of the fencing check serialises leader writes of a scope;
/// - if it overrides [`Backend::native_turn_write`], keep the shared
///   semantics (one fenced transaction; transitions as compare-and-swaps in
///   batch order; a fire's inserts idempotent by run id) and run it under
///   the same lock as [`Backend::writer`]'s transactions.
pub trait Backend: Send + Sync + 'static {
    /// The sqlx driver.
    type Db: Driver;
    /// A writer connection, held for one transaction.
    type Writer: DerefMut<Target = <Self::Db as Database>::Connection> + Send;

    /// The database's dialect.
    const DIALECT: &'static Dialect;

    /// Connections for reads (and migrations).
    fn pool(&self) -> &sqlx::Pool<Self::Db>;

    /// The connection a write transaction runs on.
    fn writer(&self) -> impl Future<Output = Result<Self::Writer, StoreError>> + Send;

    /// A leader write (fire, transitions or both) done other than by the
    /// shared SQL path; `None` means "take the shared path".
    fn native_turn_write(
        &self,
        _fence: &Fence,
        _runs: &[NewRun],
        _advances: &[JobAdvance],
        _transitions: &[Transition],
    ) -> impl Future<Output = Option<TurnResult>> + Send {
        async { None }
    }
}

/// The store over one SQL database.
#[derive(Debug, Clone)]
pub struct SqlStore<B> {
    pub(crate) db: B,
}

pub(crate) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl<B: Backend> SqlStore<B> {
    pub(crate) fn new(db: B) -> Self {
        SqlStore { db }
    }

    /// A statement in this store's dialect (`?` placeholders).
    pub(crate) fn q(sql: &str) -> Query {
        Query::new(B::DIALECT, sql)
    }

    /// All rows of a read outside any transaction.
    pub(crate) async fn read_all(&self, q: Query) -> Result<Vec<<B::Db as Database>::Row>, StoreError> {
        let mut conn = self.db.pool().acquire().await.map_err(db_err)?;
        B::Db::fetch_all(&mut *conn, &q).await.map_err(db_err)
    }

    /// The first row of a read outside any transaction.
    pub(crate) async fn read_optional(&self, q: Query) -> Result<Option<<B::Db as Database>::Row>, StoreError> {
        let mut conn = self.db.pool().acquire().await.map_err(db_err)?;
        B::Db::fetch_optional(&mut *conn, &q).await.map_err(db_err)
    }

    /// Begins a write transaction on a writer connection.
    pub(crate) async fn begin_write(w: &mut B::Writer) -> Result<Tx<'_, B::Db>, StoreError> {
        Tx::begin(&mut **w, B::DIALECT.begin).await
    }

    /// Exercises every kind of statement gnomon issues, in a transaction
    /// that is rolled back, so a missing privilege is reported at start
    /// rather than at the first fire.
    pub(crate) async fn probe(&self) -> Result<(), StoreError> {
        let mut conn = self.db.pool().acquire().await.map_err(db_err)?;
        let mut tx = Tx::<B::Db>::begin(&mut *conn, None).await?;
        let steps = [
            Self::q("SELECT value FROM counters WHERE name = 'job_change_seq'").for_update(),
            Self::q("UPDATE counters SET value = value WHERE name = 'job_change_seq'"),
            Self::q("INSERT INTO job_deletions (uid, change_seq) VALUES ('gnomon-probe', 0)"),
            Self::q("DELETE FROM job_deletions WHERE uid = 'gnomon-probe'"),
            Self::q("SELECT id FROM runs WHERE id = 'gnomon-probe'").for_update(),
        ];
        for step in steps {
            let text = step.sql().to_string();
            if let Err(e) = tx.try_execute(step).await {
                return Err(StoreError::Backend(format!("the {} user cannot run `{text}` (missing privilege?): {e}", B::DIALECT.name)));
            }
        }
        tx.rollback().await
    }

    /// The fencing check: locks the scope's leadership row until the
    /// caller's transaction ends.
    pub(crate) async fn check_fence(tx: &mut Tx<'_, B::Db>, fence: &Fence) -> Result<(), StoreError> {
        let row = tx.fetch_optional(Self::q("SELECT token FROM leadership WHERE scope = ?").bind(&fence.scope).for_update()).await?;
        Self::fence_holds(fence, row.map(|r| r.int("token")).transpose()?)
    }

    /// Whether the scope's recorded token (`current`, as read) is the
    /// fence's; counts and reports the rejection when not.
    pub(crate) fn fence_holds(fence: &Fence, current: Option<i64>) -> Result<(), StoreError> {
        let current = current.map(to_u64).unwrap_or(0);
        if current != fence.token {
            crate::count_fencing_rejection();
            return Err(StoreError::Fenced { scope: fence.scope.clone(), token: fence.token, current });
        }
        Ok(())
    }

    /// Takes the job change counter's next value; the counter row stays
    /// locked until the transaction ends, which orders job writes.
    pub(crate) async fn bump_change_seq(tx: &mut Tx<'_, B::Db>) -> Result<i64, StoreError> {
        tx.execute(Self::q("UPDATE counters SET value = value + 1 WHERE name = 'job_change_seq'")).await?;
        Self::change_seq(tx).await
    }

    /// The job change counter's value.
    pub(crate) async fn change_seq(tx: &mut Tx<'_, B::Db>) -> Result<i64, StoreError> {
        tx.fetch_one(Self::q("SELECT value FROM counters WHERE name = 'job_change_seq'")).await?.int("value")
    }

    /// A job by name, locked for the transaction.
    pub(crate) async fn job_by_name(tx: &mut Tx<'_, B::Db>, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
        let q = Self::q("SELECT * FROM jobs WHERE namespace = ? AND name = ?").bind(namespace).bind(name).for_update();
        tx.fetch_optional(q).await?.map(|r| job_from_row(&r)).transpose()
    }
}
