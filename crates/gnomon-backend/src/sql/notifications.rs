//! [`NotificationStore`] on SQL: the outbox that transitions write their
//! notifications to, read by the leader and settled under its fence.

use async_trait::async_trait;
use gnomon_core::Millis;

use super::backend::{Backend, SqlStore};
use super::decode::notification_from_row;
use crate::{Delivery, Fence, Notification, NotificationStore, StoreError};

#[async_trait]
impl<B: Backend> NotificationStore for SqlStore<B> {
    async fn due_notifications(&self, now: Millis, limit: u32) -> Result<Vec<Notification>, StoreError> {
        let q = Self::q("SELECT * FROM notifications WHERE state = 'pending' AND next_at <= ? ORDER BY next_at LIMIT ?")
            .bind(now)
            .bind(limit.clamp(1, 1000));
        self.read_all(q).await?.iter().map(notification_from_row).collect()
    }

    async fn settle_notification(&self, fence: &Fence, d: &Delivery) -> Result<bool, StoreError> {
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        Self::check_fence(&mut tx, fence).await?;
        let q = Self::q(
            "UPDATE notifications SET state = ?, attempts = ?, next_at = ?, last_error = ?, updated_at = ? \
             WHERE id = ? AND state = 'pending' AND attempts = ?",
        )
        .bind(d.state.as_str())
        .bind(d.attempts)
        .bind(d.next_at)
        .bind(d.error.clone())
        .bind(d.at)
        .bind(&d.id)
        .bind(d.attempts_before);
        let n = tx.execute(q).await?;
        tx.commit().await?;
        Ok(n == 1)
    }

    async fn run_notifications(&self, run_id: &str) -> Result<Vec<Notification>, StoreError> {
        let q = Self::q("SELECT * FROM notifications WHERE run_id = ? ORDER BY id").bind(run_id);
        self.read_all(q).await?.iter().map(notification_from_row).collect()
    }
}
