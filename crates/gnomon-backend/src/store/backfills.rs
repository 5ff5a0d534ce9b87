//! Backfills: the requests to create the runs of a job's past instants,
//! written by the API, worked through by the leader under its fence.

use async_trait::async_trait;
use gnomon_core::Millis;

use crate::*;

/// Backfill records.
///
/// # To be correct, an implementation must…
/// - refuse a second backfill of the same id (`AlreadyExists`);
/// - apply a progress report only to a running backfill whose cursor is
///   the one the report continues from (a fenced compare-and-swap, so a
///   deposed leader's report and a repeated one change nothing);
/// - cancel only a running backfill (`Terminal` otherwise), and never let
///   a progress report revive a cancelled one.
#[async_trait]
pub trait BackfillStore: Send + Sync {
    /// Records a new backfill, `running` from `from - 1`.
    async fn create_backfill(&self, b: &NewBackfill, now: Millis) -> Result<BackfillRecord, StoreError>;
    async fn get_backfill(&self, id: &str) -> Result<Option<BackfillRecord>, StoreError>;
    /// The backfills (of one namespace), newest first, at most 1000.
    async fn list_backfills(&self, namespace: Option<&str>) -> Result<Vec<BackfillRecord>, StoreError>;
    /// Cancels a running backfill (the runs it created stay).
    async fn cancel_backfill(&self, id: &str, now: Millis) -> Result<BackfillRecord, StoreError>;
    /// Every running backfill, oldest first (the leader's work).
    async fn running_backfills(&self) -> Result<Vec<BackfillRecord>, StoreError>;
    /// Records a backfill's progress, fenced; false if it no longer runs
    /// or moved on (see the rules above).
    async fn advance_backfill(&self, fence: &Fence, progress: &BackfillProgress) -> Result<bool, StoreError>;
}
