//! Leader time: the clock a term's leader loops read, and how far this
//! node's wall clock is from the cluster's.
//!
//! - The **committed leader time** is kept by the store (the leadership
//!   record, or the replicated state on raft): the leader writes its clock
//!   there every [`WRITE_EVERY`], and the store only ever raises it.
//! - A new leader whose wall clock is behind the committed time (by less
//!   than the step-down bound; further is refused) starts its term only
//!   when its clock reaches it (`Node::wait_for_committed_time`): it neither
//!   decides anything at a time the cluster has passed nor jumps ahead of
//!   its own clock, so a committed time that a fast clock left ahead is
//!   waited for, never fired at.
//! - A term's [`LeaderClock`] is a hybrid clock: the wall clock, but never
//!   below the committed leader time the term started from and never below a
//!   time it has already returned, so no clock step makes a leader's time
//!   run backwards.
//! - The **skew** is this node's wall clock minus the leader's, as well as
//!   it can be known: a standby reads the committed leader time every
//!   [`OBSERVE_EVERY`]; each reading that moved says "the leader's clock was
//!   at least this much a moment ago", so `wall − committed` bounds the skew
//!   from above and the least of the recent ones is the estimate
//!   ([`SkewMeter`]). A term adds to it how far its wall clock has moved
//!   apart from the monotonic clock since it started (a clock step).
//! - Where the store server has a clock of its own (MySQL, PostgreSQL) it
//!   is a third clock beside this node's and the last leader's: a node's
//!   skew is its clock against the median of the three ([`server_skew`];
//!   the server's alone when the last leader's is not known), so a wrong
//!   clock is found out even on a cluster's first leader, and a wrong
//!   database clock does not stop nodes that agree with each other. On
//!   raft the members' median serves the same way. With such a reference,
//!   a committed time further ahead of a node that agrees with it than the
//!   step-down bound was left by a wrong clock: the term starts from the
//!   node's own clock instead of waiting for it (see `node.rs`).
//! - Past `warn` (`--max-clock-skew`) the node says so in its log and in
//!   `gnomon_clock_skew_seconds`; past `step_down` a new leader gives the
//!   term back before its first turn, and a leader steps down, rather than
//!   fire at a wrong time. A node that stepped down waits [`HOLD_OFF`]
//!   before it stands again, so that another one can lead.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gnomon_backend::{Fence, Store, StoreError};
use gnomon_core::{Clock, Millis};
use serde::Serialize;
use tokio::sync::watch;

/// How often a leader commits its clock.
pub const WRITE_EVERY: Duration = Duration::from_millis(500);
/// How often a standby reads the committed leader time.
pub const OBSERVE_EVERY: Duration = Duration::from_secs(1);
/// How long a node that stepped down for its clock waits before standing again.
pub const HOLD_OFF: Duration = Duration::from_secs(10);
/// Readings older than this no longer count.
const FRESH: Duration = Duration::from_secs(30);
/// Readings kept.
const SAMPLES: usize = 16;
/// Readings needed before the estimate may say "ahead".
const MIN_SAMPLES: usize = 3;

/// The thresholds of `--max-clock-skew` and `--clock-skew-step-down`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkewLimits {
    pub warn: Duration,
    pub step_down: Duration,
}

impl Default for SkewLimits {
    fn default() -> Self {
        Self { warn: Duration::from_secs(1), step_down: Duration::from_secs(5) }
    }
}

/// A term's clock: the wall clock, never below the committed leader time it
/// started from, never backwards; and never more than the step-down bound
/// from where the monotonic clock says the term's time should be. A wall
/// clock step past that bound trips the clock: until the term ends (the
/// keeper sees the trip within [`WRITE_EVERY`]) time goes on monotonically
/// from the term's start, so not one fire happens at the stepped time.
#[derive(Debug)]
pub struct LeaderClock {
    wall: Arc<dyn Clock>,
    floor: AtomicI64,
    /// The wall clock and the monotonic one at the term's start.
    origin: (Millis, Instant),
    /// The skew the term started with, if known (0 otherwise).
    start_skew: i64,
    limit_ms: i64,
    tripped: AtomicBool,
}

impl LeaderClock {
    pub fn new(wall: Arc<dyn Clock>, committed: Millis, start_skew: Option<i64>, limits: SkewLimits) -> Self {
        let origin = (wall.now_millis(), Instant::now());
        Self {
            wall,
            floor: AtomicI64::new(committed),
            origin,
            start_skew: start_skew.unwrap_or(0),
            limit_ms: i64::try_from(limits.step_down.as_millis()).unwrap_or(i64::MAX),
            tripped: AtomicBool::new(false),
        }
    }

    /// How far the wall clock has moved apart from the monotonic one since
    /// the term started (ms; positive: it stepped forward).
    pub fn stepped(&self) -> i64 {
        self.stepped_at(self.wall.now_millis())
    }

    fn stepped_at(&self, wall: Millis) -> i64 {
        let elapsed = i64::try_from(self.origin.1.elapsed().as_millis()).unwrap_or(i64::MAX);
        (wall - self.origin.0) - elapsed
    }

    /// The skew now: the one the term started with plus the step since.
    pub fn skew(&self) -> i64 {
        self.start_skew + self.stepped()
    }

    /// The wall clock under this one.
    pub fn wall(&self) -> &dyn Clock {
        &*self.wall
    }

    /// Whether a wall clock step past the bound was seen.
    pub fn tripped(&self) -> bool {
        self.tripped.load(Ordering::SeqCst)
    }
}

impl Clock for LeaderClock {
    fn now_millis(&self) -> Millis {
        let mut w = self.wall.now_millis();
        let stepped = self.stepped_at(w);
        if (self.start_skew + stepped).abs() > self.limit_ms || self.tripped() {
            self.tripped.store(true, Ordering::SeqCst);
            w -= stepped;
        }
        self.floor.fetch_max(w, Ordering::SeqCst).max(w)
    }
}

/// Readings of the committed leader time, as a standby takes them.
#[derive(Debug, Default)]
pub struct SkewMeter {
    last_committed: Option<Millis>,
    /// (wall − committed, when read).
    samples: VecDeque<(i64, Instant)>,
}

impl SkewMeter {
    /// Takes one reading. Only a value that moved since the last reading is
    /// kept: it was written at most one write interval ago, while a value
    /// that stood still may be as old as the last leader.
    pub fn observe(&mut self, committed: Millis, wall: Millis, at: Instant) {
        let moved = self.last_committed.is_some_and(|c| committed > c);
        self.last_committed = Some(committed);
        if moved && committed > 0 {
            self.samples.push_back((wall - committed, at));
            while self.samples.len() > SAMPLES {
                self.samples.pop_front();
            }
        }
    }

    /// The least `wall − committed` of the fresh readings (an upper bound
    /// of the skew, close to it), if there are enough of them.
    pub fn estimate(&self, now: Instant) -> Option<i64> {
        let fresh: Vec<i64> = self.samples.iter().filter(|(_, at)| now.saturating_duration_since(*at) <= FRESH).map(|(o, _)| *o).collect();
        (fresh.len() >= MIN_SAMPLES).then(|| fresh.into_iter().min().unwrap_or(0))
    }
}

/// Round trips to the store server longer than this give no clock reading.
const MAX_SERVER_RTT: Duration = Duration::from_millis(1000);

/// This node's wall clock minus the store server's (ms), from the quickest
/// of `tries` round trips (its error is at most half of it); `None` where
/// the server has no clock of its own or does not answer in time.
pub async fn server_offset(store: &dyn Store, wall: &dyn Clock, tries: usize) -> Option<i64> {
    let mut best: Option<(Duration, i64)> = None;
    for _ in 0..tries.max(1) {
        let (sent, started) = (wall.now_millis(), Instant::now());
        let server = store.server_clock().await.ok().flatten()?;
        let rtt = started.elapsed();
        // The midpoint on the monotonic clock: a wall clock step during
        // the call does not skew the reading.
        let offset = sent + i64::try_from(rtt.as_millis() / 2).unwrap_or(i64::MAX) - server;
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    best.filter(|(rtt, _)| *rtt <= MAX_SERVER_RTT).map(|(_, o)| o)
}

/// This node's skew against the median of three clocks: the store
/// server's, this node's (`me`: this node minus the server) and the last
/// leader's (`leader`: the leader minus the server), or against the
/// server's alone when the last leader's is not known.
pub fn server_skew(me: i64, leader: Option<i64>) -> i64 {
    match leader {
        Some(l) => {
            let mut a = [0, me, l];
            a.sort_unstable();
            me - a[1]
        }
        None => me,
    }
}

/// A standby's readings of the leader's clock: against this node's wall
/// clock, and against the store server's where it has one.
#[derive(Debug, Default)]
pub struct Meters {
    pub leader: Mutex<SkewMeter>,
    pub leader_vs_server: Mutex<SkewMeter>,
}

/// What a skew comes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    Warn,
    StepDown,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::StepDown => "step_down",
        }
    }
}

/// Judges a skew (this clock − the leader's, ms) against the limits.
pub fn judge(skew: i64, limits: SkewLimits) -> Verdict {
    let off = skew.unsigned_abs();
    if off > limits.step_down.as_millis() as u64 {
        Verdict::StepDown
    } else if off > limits.warn.as_millis() as u64 {
        Verdict::Warn
    } else {
        Verdict::Ok
    }
}

/// The skew a new leader starts its term with: the standby estimate, but
/// never above `wall − committed` (the last leader's clock was at least at
/// the committed time). Without an estimate only "behind" can be known:
/// a committed time far in the past says nothing (the cluster may have
/// been down), so that case counts as no skew.
pub fn takeover_skew(committed: Millis, wall: Millis, estimate: Option<i64>) -> Option<i64> {
    let since_committed = (committed > 0).then(|| wall - committed);
    match (estimate, since_committed) {
        (Some(e), Some(s)) => Some(e.min(s)),
        (Some(e), None) => Some(e),
        (None, Some(s)) if s < 0 => Some(s),
        (None, _) => None,
    }
}

/// What a node elected leader knows of time when it decides whether to
/// take the term.
#[derive(Debug, Clone, Copy)]
pub struct Takeover {
    /// The committed leader time (0: none yet).
    pub committed: Millis,
    /// This node's wall clock.
    pub wall: Millis,
    /// This node's skew against a reference the store gives (the members'
    /// median clock, or the store server's against the last leader's).
    pub cluster_skew: Option<i64>,
    /// The standby's estimate of its skew against the last leader.
    pub estimate: Option<i64>,
}

/// The admission of a new term, decided from [`Takeover`] readings alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The clock is off by more than the step-down bound: give the term back.
    StepDown { skew: i64 },
    /// The term starts at `at`, once this node's clock reaches it (a clock
    /// behind it waits: no decision is taken at a time the cluster has
    /// already passed).
    Start {
        at: Millis,
        /// The skew the term starts with, when known.
        skew: Option<i64>,
        /// The committed time was this far ahead of a clock that agrees with
        /// the reference, beyond the bound: a wrong clock left it, and the
        /// term starts from this node's clock instead (waiting for it would
        /// stop scheduling as long; starting at it would fire early).
        reset_ahead: Option<i64>,
    },
}

/// Decides whether a new term starts, and from which leader time.
pub fn admission(t: Takeover, limits: SkewLimits) -> Admission {
    let skew = t.cluster_skew.or_else(|| takeover_skew(t.committed, t.wall, t.estimate));
    if let Some(s) = skew.filter(|s| judge(*s, limits) == Verdict::StepDown) {
        return Admission::StepDown { skew: s };
    }
    let ahead = t.committed - t.wall;
    let bound = i64::try_from(limits.step_down.as_millis()).unwrap_or(i64::MAX);
    if t.cluster_skew.is_some() && ahead > bound {
        return Admission::Start { at: t.wall, skew, reset_ahead: Some(ahead) };
    }
    Admission::Start { at: t.committed, skew, reset_ahead: None }
}

/// This node's view of its clock, for `GET /v1/leader` and the metric.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClockStatus {
    /// This node's wall clock minus the leader's, in ms (`None`: unknown).
    pub skew_ms: Option<i64>,
    pub verdict: Option<Verdict>,
    /// When this node last gave up (or refused) a term for its clock.
    pub stepped_down_at: Option<Millis>,
}

/// Shared between the node's loops and its API.
pub type SharedStatus = Arc<Mutex<ClockStatus>>;

/// Records a skew reading: the gauge, the status, and a log line when the
/// verdict changes.
pub fn report(status: &SharedStatus, skew: Option<i64>, limits: SkewLimits, role: &'static str) -> Option<Verdict> {
    let verdict = skew.map(|s| judge(s, limits));
    let mut st = status.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = skew {
        metrics::gauge!("gnomon_clock_skew_seconds").set(s as f64 / 1000.0);
    }
    if verdict != st.verdict {
        match (verdict, skew) {
            (Some(Verdict::Warn | Verdict::StepDown), Some(s)) => {
                metrics::counter!("gnomon_clock_skew_warnings_total").increment(1);
                tracing::warn!(
                    skew_ms = s,
                    max_ms = limits.warn.as_millis() as u64,
                    role,
                    "this node's clock is {} the leader time by more than the allowed skew; check its time synchronisation",
                    if s > 0 { "ahead of" } else { "behind" }
                );
            }
            (Some(Verdict::Ok), Some(s)) if st.verdict.is_some() => {
                tracing::info!(skew_ms = s, role, "this node's clock is back within the allowed skew")
            }
            _ => {}
        }
    }
    st.skew_ms = skew;
    st.verdict = verdict;
    verdict
}

/// Marks a step-down for the clock (log, metric, status).
pub fn stepped_down(status: &SharedStatus, skew: i64, limits: SkewLimits, wall: Millis, when: &str) {
    metrics::counter!("gnomon_clock_skew_step_downs_total").increment(1);
    tracing::error!(
        skew_ms = skew,
        limit_ms = limits.step_down.as_millis() as u64,
        "{when}: this node's clock is {} the leader time by more than --clock-skew-step-down; not leading until it is fixed",
        if skew > 0 { "ahead of" } else { "behind" }
    );
    status.lock().unwrap_or_else(|p| p.into_inner()).stepped_down_at = Some(wall);
}

/// While this node does not lead: reads the committed leader time (from
/// this replica where the store has stale reads) and keeps the estimate.
pub async fn observe(
    store: Arc<dyn Store>,
    scope: &'static str,
    wall: Arc<dyn Clock>,
    meters: Arc<Meters>,
    status: SharedStatus,
    limits: SkewLimits,
    leading: impl Fn() -> bool + Send + 'static,
) {
    let reader = store.stale_reads().unwrap_or(store);
    let mut tick = tokio::time::interval(OBSERVE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if leading() {
            continue;
        }
        let Ok(Some(record)) = reader.leadership(scope).await else { continue };
        let now = Instant::now();
        let estimate = {
            let mut m = meters.leader.lock().unwrap_or_else(|p| p.into_inner());
            m.observe(record.leader_time, wall.now_millis(), now);
            m.estimate(now)
        };
        // With the server's clock: the leader's against it (read the same
        // way, the server's clock in place of this node's), and this
        // node's against the median.
        let skew = match reader.server_clock().await {
            Ok(Some(server_now)) => {
                let leader = {
                    let mut m = meters.leader_vs_server.lock().unwrap_or_else(|p| p.into_inner());
                    m.observe(record.leader_time, server_now, now);
                    m.estimate(now).map(|e| -e)
                };
                server_offset(&*reader, &*wall, 1).await.map(|me| server_skew(me, leader))
            }
            _ => estimate,
        };
        if skew.is_some() && !leading() {
            report(&status, skew, limits, "standby");
        }
    }
}

/// One term's clock keeper: commits the leader time every [`WRITE_EVERY`]
/// and watches for a clock step. Sends on `step_down` when the skew passes
/// the hard bound or the store says the term is over.
pub struct Keeper {
    pub store: Arc<dyn Store>,
    pub fence: Fence,
    pub clock: Arc<LeaderClock>,
    /// Whether the term started with a known skew.
    pub skew_known: bool,
    /// Where the store server has a clock: the cluster's median offset
    /// from it when the term started (this node's skew is then its offset
    /// less this).
    pub server_center: Option<i64>,
    pub limits: SkewLimits,
    pub status: SharedStatus,
    pub step_down: watch::Sender<bool>,
}

impl Keeper {
    /// Runs until it steps down or `stop` turns true. A write under way when
    /// `stop` comes is finished first, so no commit of this term lands after
    /// the term's loops have stopped.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(WRITE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let (stepped, own) = (self.clock.stepped(), self.clock.skew());
            // Without a skew to start from, only a step is news; where the
            // store measures the members' clocks (raft), the cluster's
            // median is the reference, so even a first leader whose clock
            // was wrong from the start is found out.
            let known = self.skew_known || stepped.unsigned_abs() > self.limits.warn.as_millis() as u64;
            let skew = match (self.store.cluster_clock_skew(), self.server_center) {
                (Some(s), _) => Some(s),
                (None, Some(c)) => server_offset(&*self.store, self.clock.wall(), 1).await.map(|o| o - c).or(known.then_some(own)),
                (None, None) => known.then_some(own),
            };
            let verdict = report(&self.status, skew, self.limits, "leader");
            let skew = skew.unwrap_or(own);
            if verdict == Some(Verdict::StepDown) || self.clock.tripped() {
                stepped_down(&self.status, skew, self.limits, self.clock.now_millis(), "while leading");
                let _ = self.step_down.send(true);
                return;
            }
            match self.store.advance_leader_time(&self.fence, self.clock.now_millis()).await {
                Ok(_) => {}
                Err(StoreError::Fenced { .. }) => {
                    let _ = self.step_down.send(true);
                    return;
                }
                Err(e) => tracing::debug!(error = %e, "committing the leader time failed; next time"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gnomon_core::ManualClock;

    const LIMITS: SkewLimits = SkewLimits { warn: Duration::from_secs(1), step_down: Duration::from_secs(5) };

    #[test]
    fn a_term_is_admitted_from_the_readings_alone() {
        let t = Takeover { committed: 10_000, wall: 10_500, cluster_skew: None, estimate: None };
        assert_eq!(admission(t, LIMITS), Admission::Start { at: 10_000, skew: None, reset_ahead: None }, "no estimate: nothing known");
        let behind = Takeover { wall: 8_000, ..t };
        assert_eq!(
            admission(behind, LIMITS),
            Admission::Start { at: 10_000, skew: Some(-2_000), reset_ahead: None },
            "a clock 2 s behind the committed time waits for it"
        );
        let far_behind = Takeover { wall: 4_000, ..t };
        assert_eq!(admission(far_behind, LIMITS), Admission::StepDown { skew: -6_000 });
        let fast = Takeover { estimate: Some(7_000), ..t };
        assert_eq!(
            admission(fast, LIMITS),
            Admission::Start { at: 10_000, skew: Some(500), reset_ahead: None },
            "an estimate is capped by wall - committed"
        );
        let fast = Takeover { wall: 20_000, estimate: Some(7_000), ..t };
        assert_eq!(admission(fast, LIMITS), Admission::StepDown { skew: 7_000 });
        let reference = Takeover { cluster_skew: Some(-6_000), ..t };
        assert_eq!(admission(reference, LIMITS), Admission::StepDown { skew: -6_000 }, "the cluster's reference decides first");
        // A committed time 20 s ahead of a clock the cluster agrees with was
        // left by a wrong clock: the term starts now.
        let poisoned = Takeover { committed: 30_000, wall: 10_000, cluster_skew: Some(100), estimate: None };
        assert_eq!(admission(poisoned, LIMITS), Admission::Start { at: 10_000, skew: Some(100), reset_ahead: Some(20_000) });
        // Without a reference, a committed time ahead is waited for (or
        // refused, past the bound).
        let ahead = Takeover { cluster_skew: None, ..poisoned };
        assert_eq!(admission(ahead, LIMITS), Admission::StepDown { skew: -20_000 });
        let first = Takeover { committed: 0, wall: 10_000, cluster_skew: None, estimate: None };
        assert_eq!(admission(first, LIMITS), Admission::Start { at: 0, skew: None, reset_ahead: None }, "a cluster's first term");
    }

    #[test]
    fn the_leader_clock_starts_at_the_committed_time_and_never_runs_backwards() {
        let wall = ManualClock::new(10_000);
        let c = LeaderClock::new(Arc::new(wall.clone()), 12_000, Some(-2_000), LIMITS);
        assert_eq!(c.now_millis(), 12_000, "behind the committed time: the committed time");
        wall.set(12_500);
        assert_eq!(c.now_millis(), 12_500, "then the wall clock");
        wall.set(11_000);
        assert_eq!(c.now_millis(), 12_500, "a step back holds the time");
        wall.set(13_000);
        assert_eq!(c.now_millis(), 13_000);
        assert!(!c.tripped());
    }

    #[test]
    fn a_step_past_the_bound_trips_the_clock_and_time_goes_on_from_the_term_start() {
        let wall = ManualClock::new(100_000);
        let c = LeaderClock::new(Arc::new(wall.clone()), 99_000, None, LIMITS);
        wall.set(103_000);
        assert_eq!(c.now_millis(), 103_000, "a 3 s step is within the bound");
        assert!(!c.tripped());
        wall.set(160_000);
        let t = c.now_millis();
        assert!(c.tripped(), "a 60 s step trips it");
        assert!((103_000..104_000).contains(&t), "the time stays where the term's monotonic time is: {t}");
        wall.set(100_500);
        assert!(c.now_millis() >= t, "and never runs backwards");
    }

    #[test]
    fn only_readings_that_moved_count_and_the_least_is_the_estimate() {
        let t0 = Instant::now();
        let mut m = SkewMeter::default();
        m.observe(50_000, 100_000, t0);
        assert_eq!(m.estimate(t0), None, "a first reading may be of a dead leader");
        m.observe(50_000, 101_000, t0 + Duration::from_secs(1));
        assert_eq!(m.samples.len(), 0, "a value that stood still is not a reading");
        for (i, age) in [(2u64, 300), (3, 40), (4, 250)] {
            m.observe(100_000 + i as i64 * 1000 - age, 100_000 + i as i64 * 1000 + 2_000, t0 + Duration::from_secs(i));
        }
        assert_eq!(m.estimate(t0 + Duration::from_secs(4)), Some(2_040), "2 s ahead, plus the youngest reading's age");
        assert_eq!(m.estimate(t0 + Duration::from_secs(40)), None, "readings go stale");
    }

    #[test]
    fn of_three_clocks_the_odd_one_out_is_off() {
        assert_eq!(server_skew(30_000, Some(0)), 30_000, "this node is the odd one");
        assert_eq!(server_skew(20, Some(30_000)), 0, "the last leader was the odd one");
        assert_eq!(server_skew(30_000, Some(30_100)), 0, "the server is the odd one: this node agrees with the leader");
        assert_eq!(server_skew(-7_000, None), -7_000, "two clocks: the server's is the reference");
        assert_eq!(server_skew(300, Some(-200)), 300, "all close: the server is the median");
    }

    #[test]
    fn a_takeover_knows_behind_from_the_committed_time_and_ahead_only_from_readings() {
        assert_eq!(takeover_skew(0, 5_000, None), None, "the first leader ever");
        assert_eq!(takeover_skew(10_000, 3_000, None), Some(-7_000), "behind the committed time");
        assert_eq!(takeover_skew(10_000, 900_000, None), None, "an idle cluster is not a fast clock");
        assert_eq!(takeover_skew(10_000, 50_000, Some(30_000)), Some(30_000), "ahead, from readings");
        assert_eq!(takeover_skew(10_000, 9_000, Some(300)), Some(-1_000), "the committed time bounds a reading");
        assert_eq!(judge(-7_000, LIMITS), Verdict::StepDown);
        assert_eq!(judge(1_500, LIMITS), Verdict::Warn);
        assert_eq!(judge(-900, LIMITS), Verdict::Ok);
    }
}
