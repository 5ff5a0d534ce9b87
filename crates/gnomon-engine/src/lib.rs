//! gnomon-engine: what the leader decides with, and no I/O. It holds the
//! components a leader's turn plans over, each the one owner of its state
//! with its own invariants and tests:
//!
//! - [`timeline::JobTimeline`]: the scheduled jobs, their timelines and
//!   the timer, with the dependency graph ([`graph::DepGraph`]);
//! - [`runbook::RunBook`]: the open runs and every index over them (ready
//!   queues, retries, holders, orphans, waiters, held keyed runs);
//! - [`fair`]: the fair queues and tallies per namespace;
//! - [`admission::Admission`]: quotas and backpressure per namespace;
//! - [`cadence`]: when the store is polled, and whether the cache may be
//!   trusted.
//!
//! The crate depends on no async runtime, no store and no RPC library
//! (`scripts/test.sh` checks its dependency tree), so what it decides rests
//! only on its inputs: the clock the caller reads, the store's answers and
//! the messages it is given.

pub mod admission;
mod asks;
mod backfill_steps;
pub mod backfills;
pub mod cadence;
mod config;
pub mod dispatch;
pub mod fair;
pub mod graph;
pub mod inbox;
mod jobs;
pub mod notes;
pub mod notify;
pub mod plan;
pub mod release;
mod results;
pub mod runbook;
mod runs;
pub mod sessions;
pub mod timeline;
pub mod view;
mod workers;

use std::collections::hash_map::DefaultHasher;

pub use config::LeaderConfig;
pub use workers::OVERRUN_GRACE_MS;

/// The worker's longest reconnect backoff, added to a new leader's wait for
/// recovered attempts to be reclaimed.
pub const RECONNECT_SLACK_MS: gnomon_core::Millis = 2_000;

/// The leader's state and its decisions, without I/O: the components a
/// turn plans over, the term's fence, the settings, the time of the step
/// under way and the seeded random numbers. The runtime (`gnomon-server`'s
/// `LeaderRuntime`) owns one, feeds it the clock once a step, the store's
/// answers and the messages, makes the one fenced write of what it plans,
/// and sends what the applied outcome says.
pub struct Engine {
    /// What the leader knows from the store, dropped and rebuilt whole.
    pub cache: Cache,
    /// Whether the cache may be trusted.
    pub freshness: cadence::Freshness,
    /// When the term started and its periodic work last ran.
    pub cadence: cadence::Cadence,
    /// The worker sessions (their leases and streams' state).
    pub sessions: sessions::Sessions,
    /// What the view shows beside sessions and pressure (why runs wait).
    pub notes: notes::Notes,
    /// Quotas and backpressure, per namespace.
    pub admission: admission::Admission,
    /// The workers' reports not yet written (kept across a rebuild).
    pub reports: inbox::Reports,
    /// The term's fence: every write and every message carries its token.
    pub fence: gnomon_records::Fence,
    pub config: LeaderConfig,
    /// The time of the step under way (the clock is read once a step).
    pub now: gnomon_core::Millis,
    /// The leader's random numbers (retry jitter, session ids), from its
    /// seed: an input, so the same inputs make the same plans.
    pub rng: rand::rngs::StdRng,
}

impl Engine {
    /// An engine for the term that `fence` names, at `now`, its random
    /// numbers from `seed`; its cache is stale (a rebuild comes first).
    pub fn new(fence: gnomon_records::Fence, config: LeaderConfig, now: gnomon_core::Millis, seed: u64) -> Engine {
        Engine {
            admission: admission::Admission::new(config.backpressure, config.quotas.clone()),
            cache: Cache::default(),
            freshness: cadence::Freshness::default(),
            cadence: cadence::Cadence::default(),
            sessions: sessions::Sessions::default(),
            notes: notes::Notes::default(),
            reports: inbox::Reports::default(),
            fence,
            config,
            now,
            rng: rand::SeedableRng::seed_from_u64(seed),
        }
    }
}

/// What the leader knows from the store: dropped and rebuilt as a whole
/// (after any store error it cannot classify, and at the start of a term).
#[derive(Default)]
pub struct Cache {
    /// The scheduled jobs, their timelines and the timer.
    pub jobs: timeline::JobTimeline,
    /// The open runs, their queues and who holds their attempts.
    pub runs: runbook::RunBook,
    /// The running backfills.
    pub backfills: backfills::Backfills,
}

use std::hash::BuildHasherDefault;

/// The engine's maps and sets hash with fixed keys, so that the order in
/// which it walks them, and so everything it decides, depends only on its
/// inputs: a simulation seed replays exactly. (Their keys are run, job and
/// worker ids the server or an authenticated worker chose.)
pub type HashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<DefaultHasher>>;
/// See [`HashMap`].
pub type HashSet<K> = std::collections::HashSet<K, BuildHasherDefault<DefaultHasher>>;

/// Weight of the newest duration in the moving averages of attempt
/// durations.
const DURATION_EWMA: f64 = 0.2;

/// A moving average of attempt durations with a new one of `ms` in it.
pub fn with_duration(average: Option<f64>, ms: f64) -> Option<f64> {
    Some(average.map_or(ms, |o| o + DURATION_EWMA * (ms - o)))
}
