//! The backpressure controller: green / yellow / red from the
//! number of pending runs against a maximum, and from worker saturation.
//!
//! - **green**: fire and dispatch freely;
//! - **yellow** (pending ≥ `yellow` × max, or every worker slot taken while
//!   runs wait): dispatch is throttled — workers' prefetch queues are filled
//!   to half their depth, so less work is committed to a worker ahead of its
//!   free slots and more of the backlog stays pending, where any worker can
//!   take it. Free slots are still filled: the throttle never idles a
//!   worker (an earlier "half the free slots per pass" did, and cost a
//!   quarter of the throughput under a backlog);
//! - **red** (pending ≥ `red` × max): new fires are deferred. They are not
//!   dropped: the jobs stay due and fire when pressure falls, through the
//!   job's misfire policy like any other late fire.
//!
//! Leaving a state needs the ratio to fall `hysteresis` below its threshold,
//! so the state does not flap around a boundary. Pure: the leader feeds it.

use serde::Serialize;

/// The leader's admission state, from least to most loaded: `green`,
/// `yellow` (dispatch throttled) or `red` (new fires deferred).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Pressure {
    /// Runs fire and are dispatched freely.
    Green,
    /// Pending runs reached the yellow threshold, or every worker slot is
    /// taken while runs wait: workers' prefetch queues are filled to half
    /// their depth (free slots are still filled).
    Yellow,
    /// Pending runs reached the red threshold: new fires are deferred (not
    /// dropped) until pressure falls, and dispatch is throttled as in
    /// yellow.
    Red,
}

impl Pressure {
    /// The state's name as the API and logs write it: `green`, `yellow` or
    /// `red`.
    pub fn as_str(self) -> &'static str {
        match self {
            Pressure::Green => "green",
            Pressure::Yellow => "yellow",
            Pressure::Red => "red",
        }
    }

    /// The value of `gnomon_backpressure_state`: 0, 1, 2.
    pub fn level(self) -> f64 {
        match self {
            Pressure::Green => 0.0,
            Pressure::Yellow => 1.0,
            Pressure::Red => 2.0,
        }
    }
}

/// The thresholds of the backpressure controller (`--max-pending`; the
/// default is 10,000 pending runs, yellow at 70 %, red at 90 %, with 5 %
/// hysteresis).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackpressureConfig {
    /// The number of pending runs (runs waiting for a worker) that the
    /// thresholds are fractions of. 0 is treated as 1.
    pub max_pending: usize,
    /// Fractions of `max_pending`: the state is at least yellow from
    /// `yellow × max_pending` pending runs.
    pub yellow: f64,
    /// The state is red from `red × max_pending` pending runs (a fraction of
    /// `max_pending`, normally above `yellow`).
    pub red: f64,
    /// How far (a fraction of `max_pending`) the pending ratio must fall
    /// below a threshold before the state drops below it.
    pub hysteresis: f64,
}

impl Default for BackpressureConfig {
    fn default() -> Self {
        Self { max_pending: 10_000, yellow: 0.7, red: 0.9, hysteresis: 0.05 }
    }
}

/// The controller: holds the current [`Pressure`] and moves it on each
/// [`update`](Self::update) the leader makes.
#[derive(Debug, Clone)]
pub struct Backpressure {
    /// The thresholds it applies.
    pub config: BackpressureConfig,
    state: Pressure,
    /// Whether the workers were saturated at the last update.
    saturated: bool,
}

impl Backpressure {
    /// A controller with the given thresholds, starting green.
    pub fn new(config: BackpressureConfig) -> Self {
        Self { config, state: Pressure::Green, saturated: false }
    }

    /// The state as of the last [`update`](Self::update) (green before the
    /// first).
    pub fn state(&self) -> Pressure {
        self.state
    }

    /// Updates the state from the pending count and the workers' free slots
    /// (`capacity` is their total; 0 when no worker is connected).
    pub fn update(&mut self, pending: usize, free_slots: usize, capacity: usize) -> Pressure {
        let c = self.config;
        let ratio = pending as f64 / c.max_pending.max(1) as f64;
        // Saturation: every slot taken and at least a slot's worth waiting per
        // slot; once yellow for it, held until the backlog halves (no flapping
        // each time one slot frees up).
        let saturated =
            capacity > 0 && if self.saturated { pending >= capacity.div_ceil(2) } else { free_slots == 0 && pending >= capacity };
        self.saturated = saturated;
        let by_ratio = |slack: f64| {
            if ratio >= c.red - slack {
                Pressure::Red
            } else if ratio >= c.yellow - slack {
                Pressure::Yellow
            } else {
                Pressure::Green
            }
        };
        let rising = by_ratio(0.0);
        // Falling only below the threshold minus the hysteresis.
        let held = by_ratio(c.hysteresis).min(self.state);
        let mut next = rising.max(held);
        if saturated && next == Pressure::Green {
            next = Pressure::Yellow;
        }
        self.state = next;
        next
    }

    /// How much of a worker's prefetch queue dispatch may fill now.
    pub fn queue_allowance(&self, prefetch: usize) -> usize {
        match self.state {
            Pressure::Green => prefetch,
            Pressure::Yellow | Pressure::Red => prefetch.div_ceil(2),
        }
    }

    /// Whether new fires are deferred now (the state is red).
    pub fn defers_fires(&self) -> bool {
        self.state == Pressure::Red
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bp() -> Backpressure {
        Backpressure::new(BackpressureConfig { max_pending: 100, ..Default::default() })
    }

    #[test]
    fn thresholds_and_hysteresis() {
        let mut b = bp();
        assert_eq!(b.update(10, 5, 10), Pressure::Green);
        assert_eq!(b.update(70, 5, 10), Pressure::Yellow);
        assert_eq!(b.update(90, 5, 10), Pressure::Red);
        assert!(b.defers_fires());
        // Just under the red line: still red (hysteresis).
        assert_eq!(b.update(87, 5, 10), Pressure::Red);
        assert_eq!(b.update(84, 5, 10), Pressure::Yellow);
        assert_eq!(b.update(66, 5, 10), Pressure::Yellow);
        assert_eq!(b.update(64, 5, 10), Pressure::Green);
    }

    #[test]
    fn saturated_workers_make_it_yellow_without_flapping() {
        let mut b = bp();
        assert_eq!(b.update(3, 0, 10), Pressure::Green, "a short queue is not a backlog");
        assert_eq!(b.update(12, 0, 10), Pressure::Yellow);
        assert_eq!(b.queue_allowance(9), 5);
        assert_eq!(b.update(8, 1, 10), Pressure::Yellow, "held while the backlog is over half the slots");
        assert_eq!(b.update(4, 1, 10), Pressure::Green);
        assert_eq!(b.update(30, 0, 0), Pressure::Green, "no workers at all is not saturation");
        assert_eq!(b.queue_allowance(9), 9);
    }
}
