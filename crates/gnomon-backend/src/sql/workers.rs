//! [`WorkerStore`] on SQL: the `worker_bindings` table (migration 13), one
//! row per bound worker id, keyed by the id. A bind reads first (a bound id,
//! the usual case, costs no write transaction), then inserts under the
//! write lock with the dialect's insert-or-ignore and reads the row back
//! with a locking read, so of two binds racing one inserts and both read
//! its owner: SQLite's `BEGIN IMMEDIATE` serialises them; on PostgreSQL
//! and InnoDB the second insert waits for the first one's row lock and then
//! finds the key taken, and the locking read (newest committed row under
//! both isolation levels) returns it. Retention never touches the table.

use async_trait::async_trait;
use gnomon_core::Millis;

use super::backend::{Backend, SqlStore};
use super::driver::SqlRow;
use crate::{StoreError, WorkerStore};

#[async_trait]
impl<B: Backend> WorkerStore for SqlStore<B> {
    async fn bind_worker(&self, worker: &str, credential: &str, now: Millis) -> Result<String, StoreError> {
        if let Some(owner) = self.worker_owner(worker).await? {
            return Ok(owner);
        }
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        let insert = Self::q("INSERT INTO worker_bindings (worker, credential, bound_at) VALUES (?, ?, ?)")
            .bind(worker)
            .bind(credential)
            .bind(now)
            .or_ignore("worker");
        tx.execute(insert).await?;
        let read = Self::q("SELECT credential FROM worker_bindings WHERE worker = ?").bind(worker).for_update();
        let owner = tx.fetch_optional(read).await?.map(|r| r.text("credential")).transpose()?;
        tx.commit().await?;
        owner.ok_or_else(|| StoreError::Backend(format!("the binding of worker id {worker:?} vanished as it was written")))
    }

    async fn unbind_worker(&self, worker: &str) -> Result<bool, StoreError> {
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        let deleted = tx.execute(Self::q("DELETE FROM worker_bindings WHERE worker = ?").bind(worker)).await?;
        tx.commit().await?;
        Ok(deleted > 0)
    }

    async fn worker_owner(&self, worker: &str) -> Result<Option<String>, StoreError> {
        let row = self.read_optional(Self::q("SELECT credential FROM worker_bindings WHERE worker = ?").bind(worker)).await?;
        row.map(|r| r.text("credential")).transpose()
    }
}
