//! Time source. Schedule and policy logic takes a [`Clock`] so tests move time
//! by hand instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::Millis;

/// A source of "now" in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time, in milliseconds since the Unix epoch (UTC).
    fn now_millis(&self) -> Millis;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> Millis {
        chrono::Utc::now().timestamp_millis()
    }
}

/// A clock that only moves when told to. Cloning shares the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock that reads `start` (milliseconds since the epoch) until it
    /// is moved.
    pub fn new(start: Millis) -> Self {
        Self { now: Arc::new(AtomicI64::new(start)) }
    }
    /// Moves the clock, and every clone of it, to `ms` (milliseconds since
    /// the epoch; it may go backwards).
    pub fn set(&self, ms: Millis) {
        self.now.store(ms, Ordering::SeqCst);
    }
    /// Moves the clock, and every clone of it, `ms` milliseconds forward
    /// (backwards when negative).
    pub fn advance(&self, ms: Millis) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> Millis {
        self.now.load(Ordering::SeqCst)
    }
}
