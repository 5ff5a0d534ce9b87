//! [`LeadershipStore`] on SQL: epochs, the fence (the scope's leadership
//! row, which every leader write locks) and the committed leader time.

use async_trait::async_trait;
use gnomon_core::Millis;

use super::backend::{to_i64, to_u64, Backend, SqlStore};
use super::decode::leadership_from_row;
use super::driver::{SqlRow, Tx};
use crate::{Fence, LeaderInfo, LeadershipRecord, LeadershipStore, StoreError};

impl<B: Backend> SqlStore<B> {
    /// Inserts the scope's `epochs` row if it is missing.
    async fn ensure_epoch_row(tx: &mut Tx<'_, B::Db>, scope: &str) -> Result<(), StoreError> {
        tx.execute(Self::q("INSERT INTO epochs (scope, epoch) VALUES (?, 0)").bind(scope).or_ignore("scope")).await.map(|_| ())
    }

    /// Inserts the scope's `leadership` row (token 0: nobody) if it is missing.
    async fn ensure_leadership_row(tx: &mut Tx<'_, B::Db>, scope: &str) -> Result<(), StoreError> {
        let q = Self::q("INSERT INTO leadership (scope, token, holder, address, backend, since) VALUES (?, 0, '', '', '', 0)");
        tx.execute(q.bind(scope).or_ignore("scope")).await.map(|_| ())
    }
}

#[async_trait]
impl<B: Backend> LeadershipStore for SqlStore<B> {
    async fn next_epoch(&self, scope: &str) -> Result<u64, StoreError> {
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        Self::ensure_epoch_row(&mut tx, scope).await?;
        let epoch = tx.fetch_one(Self::q("SELECT epoch FROM epochs WHERE scope = ?").bind(scope).for_update()).await?.int("epoch")?;
        // Never below the fenced token, so a new term outranks every earlier one.
        let token = tx.fetch_optional(Self::q("SELECT token FROM leadership WHERE scope = ?").bind(scope)).await?;
        let token = token.map(|r| r.int("token")).transpose()?.unwrap_or(0);
        let next = epoch.max(token) + 1;
        tx.execute(Self::q("UPDATE epochs SET epoch = ? WHERE scope = ?").bind(next).bind(scope)).await?;
        tx.commit().await?;
        Ok(to_u64(next))
    }

    async fn fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError> {
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        Self::ensure_leadership_row(&mut tx, &fence.scope).await?;
        let current =
            tx.fetch_one(Self::q("SELECT token FROM leadership WHERE scope = ?").bind(&fence.scope).for_update()).await?.uint("token")?;
        if fence.token <= current {
            return Err(StoreError::StaleToken { scope: fence.scope.clone(), token: fence.token, current });
        }
        let q = Self::q("UPDATE leadership SET token = ?, holder = ?, address = ?, backend = ?, since = ? WHERE scope = ?")
            .bind(to_i64(fence.token))
            .bind(&holder.holder)
            .bind(&holder.address)
            .bind(&holder.backend)
            .bind(now)
            .bind(&fence.scope);
        tx.execute(q).await?;
        tx.commit().await
    }

    async fn leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError> {
        let row = self.read_optional(Self::q("SELECT * FROM leadership WHERE scope = ? AND token > 0").bind(scope)).await?;
        row.map(|r| leadership_from_row(&r)).transpose()
    }

    async fn advance_leader_time(&self, fence: &Fence, at: Millis) -> Result<Millis, StoreError> {
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        Self::check_fence(&mut tx, fence).await?;
        let advance = Self::q("UPDATE leadership SET leader_time = ")
            .push(B::DIALECT.greatest)
            .push("(leader_time, ?) WHERE scope = ?")
            .bind(at)
            .bind(&fence.scope);
        tx.execute(advance).await?;
        let committed =
            tx.fetch_one(Self::q("SELECT leader_time FROM leadership WHERE scope = ?").bind(&fence.scope)).await?.int("leader_time")?;
        tx.commit().await?;
        Ok(committed)
    }
}
