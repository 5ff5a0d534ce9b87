//! Terms: the epoch counter electors draw tokens from, the fence a term
//! installs, the leadership record, and the committed leader time.

use async_trait::async_trait;
use gnomon_core::Millis;

use crate::*;

/// Epochs, fences and the leader's committed time.
///
/// # To be correct, an implementation must…
/// - **fence monotonically**: `fence` installs a token only if it is higher
///   than the scope's stored one ([`StoreError::StaleToken`] otherwise), so
///   a later term always fences above an earlier one;
/// - make `next_epoch` strictly increasing per scope, across handles and
///   processes;
/// - **move leader time only forward**: `advance_leader_time` is fenced
///   (it fails with [`StoreError::Fenced`] for any token but the current
///   one) and takes the maximum; `fence` leaves the time as it is.
#[async_trait]
pub trait LeadershipStore: Send + Sync {
    /// Bumps and returns the scope's epoch counter (token source for electors
    /// that have no native token).
    async fn next_epoch(&self, scope: &str) -> Result<u64, StoreError>;
    /// Installs `token` as the scope's current token if it is higher than the
    /// stored one; fails with [`StoreError::StaleToken`] otherwise.
    async fn fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError>;
    /// The scope's leadership record: its current token and holder.
    async fn leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError>;
    /// Raises the scope's committed leader time to `at` if `fence` is the
    /// current token (never lowers it) and returns the committed time;
    /// [`StoreError::Fenced`] otherwise. The leader writes its clock here
    /// every half second; a new leader's clock starts at or above it.
    async fn advance_leader_time(&self, fence: &Fence, at: Millis) -> Result<Millis, StoreError>;
}
