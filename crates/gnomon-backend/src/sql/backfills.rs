//! [`BackfillStore`] on SQL: the `backfills` table. A change reads the row
//! under the write lock, applies the record's own rule
//! ([`BackfillRecord::advance`], [`BackfillRecord::cancel`]) and writes
//! the changed columns back.

use async_trait::async_trait;
use gnomon_core::Millis;

use super::backend::{to_i64, Backend, SqlStore};
use super::decode::backfill_from_row;
use super::driver::Tx;
use crate::{BackfillProgress, BackfillRecord, BackfillStore, Fence, NewBackfill, StoreError};

impl<B: Backend> SqlStore<B> {
    async fn backfill_for_update(tx: &mut Tx<'_, B::Db>, id: &str) -> Result<Option<BackfillRecord>, StoreError> {
        let q = Self::q("SELECT * FROM backfills WHERE id = ?").bind(id).for_update();
        tx.fetch_optional(q).await?.as_ref().map(backfill_from_row).transpose()
    }

    async fn write_backfill(tx: &mut Tx<'_, B::Db>, b: &BackfillRecord) -> Result<(), StoreError> {
        let q = Self::q("UPDATE backfills SET cursor_ms = ?, state = ?, created = ?, kept = ?, reason = ?, updated_at = ? WHERE id = ?")
            .bind(b.cursor)
            .bind(b.state.as_str())
            .bind(to_i64(b.created))
            .bind(to_i64(b.kept))
            .bind(b.reason.clone())
            .bind(b.updated_at)
            .bind(&b.id);
        tx.execute(q).await?;
        Ok(())
    }

    /// Creates the backfill in the caller's transaction; `None` when its id
    /// is taken (nothing written).
    pub(super) async fn create_backfill_in(
        tx: &mut Tx<'_, B::Db>,
        b: &NewBackfill,
        now: Millis,
    ) -> Result<Option<BackfillRecord>, StoreError> {
        if Self::backfill_for_update(tx, &b.id).await?.is_some() {
            return Ok(None);
        }
        let rec = BackfillRecord::new(b, now);
        let q = Self::q(
            "INSERT INTO backfills (id, namespace, job, job_uid, from_ms, to_ms, params, rate, total, cursor_ms, state, created, kept, \
             reason, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, NULL, ?, ?)",
        )
        .bind(&rec.id)
        .bind(&rec.namespace)
        .bind(&rec.job)
        .bind(&rec.job_uid)
        .bind(rec.from)
        .bind(rec.to)
        .bind(rec.params.clone())
        .bind(i64::from(rec.rate))
        .bind(to_i64(rec.total))
        .bind(rec.cursor)
        .bind(rec.state.as_str())
        .bind(now)
        .bind(now);
        tx.execute(q).await?;
        Ok(Some(rec))
    }

    /// Moves a backfill's cursor in the caller's (fenced) transaction, by
    /// the record's own rule; whether it applied.
    pub(super) async fn advance_backfill_in(tx: &mut Tx<'_, B::Db>, p: &BackfillProgress) -> Result<bool, StoreError> {
        let Some(mut b) = Self::backfill_for_update(tx, &p.id).await? else { return Ok(false) };
        if !b.advance(p) {
            return Ok(false);
        }
        Self::write_backfill(tx, &b).await?;
        Ok(true)
    }
}

#[async_trait]
impl<B: Backend> BackfillStore for SqlStore<B> {
    async fn create_backfill(&self, b: &NewBackfill, now: Millis) -> Result<BackfillRecord, StoreError> {
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        let Some(rec) = Self::create_backfill_in(&mut tx, b, now).await? else {
            return Err(StoreError::AlreadyExists(format!("backfill {}", b.id)));
        };
        tx.commit().await?;
        Ok(rec)
    }

    async fn get_backfill(&self, id: &str) -> Result<Option<BackfillRecord>, StoreError> {
        let q = Self::q("SELECT * FROM backfills WHERE id = ?").bind(id);
        self.read_optional(q).await?.as_ref().map(backfill_from_row).transpose()
    }

    async fn list_backfills(&self, namespace: Option<&str>) -> Result<Vec<BackfillRecord>, StoreError> {
        let q = match namespace {
            Some(ns) => Self::q("SELECT * FROM backfills WHERE namespace = ? ORDER BY created_at DESC, id DESC LIMIT 1000").bind(ns),
            None => Self::q("SELECT * FROM backfills ORDER BY created_at DESC, id DESC LIMIT 1000"),
        };
        self.read_all(q).await?.iter().map(backfill_from_row).collect()
    }

    async fn cancel_backfill(&self, id: &str, now: Millis) -> Result<BackfillRecord, StoreError> {
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        let Some(mut b) = Self::backfill_for_update(&mut tx, id).await? else {
            return Err(StoreError::NotFound(format!("backfill {id}")));
        };
        if !b.cancel(now) {
            return Err(StoreError::Terminal(format!("backfill {id}")));
        }
        Self::write_backfill(&mut tx, &b).await?;
        tx.commit().await?;
        Ok(b)
    }

    async fn running_backfills(&self) -> Result<Vec<BackfillRecord>, StoreError> {
        let q = Self::q("SELECT * FROM backfills WHERE state = 'running' ORDER BY created_at, id");
        self.read_all(q).await?.iter().map(backfill_from_row).collect()
    }

    async fn advance_backfill(&self, fence: &Fence, p: &BackfillProgress) -> Result<bool, StoreError> {
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        Self::check_fence(&mut tx, fence).await?;
        if !Self::advance_backfill_in(&mut tx, p).await? {
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }
}
