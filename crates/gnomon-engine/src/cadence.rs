//! When the leader last did its periodic work, and whether its cache may
//! be trusted: [`Cadence`] (the term's start, the last store poll and the
//! last overrun scan) and [`Freshness`] (stale, and how many rebuilds
//! failed in a row).
//!
//! Invariants (checked by the tests below):
//! - a poll is due at once when asked for (a nudge) or never made, and
//!   otherwise every `POLL_EVERY_MS`;
//! - a rebuild's back-off doubles with each failure, up to 16 times the
//!   first, and a success resets it.

use gnomon_core::Millis;

/// How often the store is polled for job writes, backfills and cancel
/// requests (a push from the store, or a nudge, polls sooner).
pub const POLL_EVERY_MS: Millis = 1000;

/// How often attempts are checked for overrunning their timeout.
const OVERRUN_SCAN_EVERY_MS: Millis = 1_000;

#[derive(Default)]
pub struct Cadence {
    /// When this term's leader loops first ran (recovered attempts of
    /// workers it never saw wait one lease from here).
    term_started: Option<Millis>,
    /// When the store was last polled (0: never, or asked for now).
    last_poll: Millis,
    /// When attempts were last checked for overrunning their timeout.
    last_overrun_scan: Millis,
}

impl Cadence {
    /// When the term's loops first ran, set to `now` on the first call.
    pub fn term_started(&mut self, now: Millis) -> Millis {
        *self.term_started.get_or_insert(now)
    }

    /// When the term's loops first ran, if they have.
    pub fn started(&self) -> Option<Millis> {
        self.term_started
    }

    /// Whether the store is due a poll at `now`.
    pub fn poll_due(&self, now: Millis) -> bool {
        self.last_poll == 0 || now - self.last_poll >= POLL_EVERY_MS
    }

    /// The store was polled at `now`.
    pub fn polled(&mut self, now: Millis) {
        self.last_poll = now;
    }

    /// Poll at the next turn (something changed in the store).
    pub fn poll_now(&mut self) {
        self.last_poll = 0;
    }

    /// Whether attempts are due an overrun check at `now` (marked done).
    pub fn overrun_scan(&mut self, now: Millis) -> bool {
        if now - self.last_overrun_scan < OVERRUN_SCAN_EVERY_MS {
            return false;
        }
        self.last_overrun_scan = now;
        true
    }
}

/// Whether the cache may be trusted.
pub struct Freshness {
    /// The cache must be rebuilt from the store before the next turn.
    stale: bool,
    /// How many rebuilds failed in a row (for the back-off).
    failures: u32,
}

impl Default for Freshness {
    /// A new term's cache is stale: it is loaded before the first turn.
    fn default() -> Self {
        Self { stale: true, failures: 0 }
    }
}

impl Freshness {
    pub fn is_stale(&self) -> bool {
        self.stale
    }

    /// The cache is no longer trusted.
    pub fn distrust(&mut self) {
        self.stale = true;
    }

    /// A rebuild failed: how many in a row now.
    pub fn rebuild_failed(&mut self) -> u32 {
        self.failures += 1;
        self.failures
    }

    /// The cache was rebuilt.
    pub fn rebuilt(&mut self) {
        self.stale = false;
        self.failures = 0;
    }

    /// How long to wait after a failed step: 200 ms, doubling with each
    /// failed rebuild, at most 3.2 s.
    pub fn backoff_ms(&self) -> u64 {
        200u64 << self.failures.min(4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_is_due_when_asked_for_or_a_second_on() {
        let mut c = Cadence::default();
        assert!(c.poll_due(5_000), "never polled");
        c.polled(5_000);
        assert!(!c.poll_due(5_999) && c.poll_due(6_000));
        c.poll_now();
        assert!(c.poll_due(5_001));
        assert!(c.overrun_scan(5_000) && !c.overrun_scan(5_999) && c.overrun_scan(6_000));
        assert_eq!((c.term_started(7), c.term_started(9), c.started()), (7, 7, Some(7)));
    }

    #[test]
    fn the_rebuild_backoff_doubles_to_a_cap_and_resets() {
        let mut f = Freshness::default();
        assert!(f.is_stale());
        assert_eq!(f.backoff_ms(), 200);
        let waits: Vec<u64> = (0..6)
            .map(|_| {
                f.rebuild_failed();
                f.backoff_ms()
            })
            .collect();
        assert_eq!(waits, [400, 800, 1_600, 3_200, 3_200, 3_200]);
        f.rebuilt();
        assert!(!f.is_stale());
        assert_eq!(f.backoff_ms(), 200);
    }
}
