//! The notification outbox: rows written with the transition that raised
//! them, read and settled by the leader's deliverer.

use async_trait::async_trait;
use gnomon_core::Millis;

use crate::*;

/// The outbox of run outcome notifications.
///
/// # To be correct, an implementation must…
/// - change a notification by a delivery only while it is pending with the
///   attempts the deliverer read (`settle_notification` is a fenced CAS);
/// - delete a run's notifications with the run when it is pruned.
#[async_trait]
pub trait NotificationStore: Send + Sync {
    /// Pending notifications due at `now` (oldest due first), at most `limit`.
    async fn due_notifications(&self, now: Millis, limit: u32) -> Result<Vec<Notification>, StoreError>;
    /// Records a delivery, fenced: applies only while the notification is
    /// still pending with `attempts_before` attempts (false otherwise).
    async fn settle_notification(&self, fence: &Fence, delivery: &Delivery) -> Result<bool, StoreError>;
    /// A run's notifications, in id order.
    async fn run_notifications(&self, run_id: &str) -> Result<Vec<Notification>, StoreError>;
}
