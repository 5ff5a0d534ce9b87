//! [`Admission`]: what the leader lets in, per namespace. It owns the
//! quotas and the backpressure states, and decides from counts the leader
//! hands it (the [`RunBook`](crate::runbook::RunBook)'s per-namespace tally and the backfills'
//! instants still to come); it reads nothing itself.
//!
//! - **Quotas** refuse a request that creates runs (trigger, webhook call,
//!   backfill) whole, before anything is written: its bytes, the open runs
//!   and open bytes it would bring its namespace to (keyed runs still held
//!   after they ended count in both), its downstream runs per run, and the
//!   namespace's running backfills.
//! - **A red namespace refuses triggers** (and webhook calls): while its
//!   backlog is past the red line, a new run would only wait, so its
//!   caller is told to come back (429, `backlog`).
//! - **Backpressure per namespace**: a namespace whose backlog (pending and
//!   waiting runs) reaches red has its own fires deferred, and its
//!   backfills pause; no other namespace's. The leader-wide state is the
//!   most loaded namespace's, raised to yellow while every worker slot is
//!   taken (then dispatch fills prefetch queues to half).
//!
//! Invariants (checked by the tests below):
//! - a namespace's fires are deferred only by its own backlog;
//! - a request is refused exactly when one of its quotas would be passed,
//!   or (a trigger) while its namespace is red, and the refusal names why.

use gnomon_core::backpressure::Backpressure;

use gnomon_core::backpressure::BackpressureConfig;
use gnomon_core::backpressure::Pressure;
use gnomon_records::NewRun;

use std::collections::BTreeMap;

use gnomon_core::quota::{Quota, QuotaExceeded, QuotaName, Quotas};

use crate::fair::NsCounts;

/// What a request would create in one namespace.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// Runs the request names itself (a trigger's `count`, a key's one).
    pub roots: u64,
    /// Every run it creates, its roots and their downstream runs.
    pub runs: u64,
    /// The params and payload bytes of all of them.
    pub bytes: u64,
}

impl Ask {
    /// What creating `runs`, of which the first `roots` are the request's
    /// own, asks for.
    pub fn of(runs: &[NewRun], roots: usize) -> Ask {
        let bytes =
            runs.iter().map(|r| (r.params.as_ref().map_or(0, String::len) + r.payload.as_ref().map_or(0, String::len)) as u64).sum();
        Ask { roots: roots as u64, runs: runs.len() as u64, bytes }
    }
}

pub struct Admission {
    quotas: Quotas,
    /// The leader-wide state (see the module's text).
    pressure: Backpressure,
    /// Each namespace's own state, from its backlog alone.
    namespaces: BTreeMap<String, Backpressure>,
}

impl Admission {
    pub fn new(config: BackpressureConfig, quotas: Quotas) -> Self {
        Self { quotas, pressure: Backpressure::new(config), namespaces: BTreeMap::new() }
    }

    /// The quotas of `namespace`.
    pub fn quota(&self, namespace: &str) -> Quota {
        self.quotas.of(namespace)
    }

    /// The leader-wide state.
    pub fn pressure(&self) -> &Backpressure {
        &self.pressure
    }

    /// Namespace `ns`'s own state.
    pub fn state_of(&self, ns: &str) -> Pressure {
        self.namespaces.get(ns).map_or(Pressure::Green, Backpressure::state)
    }

    /// Whether namespace `ns`'s fires (and backfills) wait now.
    pub fn defers(&self, ns: &str) -> bool {
        self.state_of(ns) == Pressure::Red
    }

    /// Moves every state on from the namespaces' counts and the workers'
    /// free slots; the leader-wide state before and after.
    pub fn update<'a>(
        &mut self,
        tally: impl Iterator<Item = (&'a str, &'a NsCounts)>,
        free_slots: usize,
        capacity: usize,
    ) -> (Pressure, Pressure) {
        let config = self.pressure.config;
        let mut next = BTreeMap::new();
        let mut most = 0;
        for (ns, counts) in tally {
            let backlog = usize::try_from(counts.backlog()).unwrap_or(usize::MAX);
            most = most.max(backlog);
            let mut p = self.namespaces.remove(ns).unwrap_or_else(|| Backpressure::new(config));
            p.update(backlog, 0, 0);
            next.insert(ns.to_string(), p);
        }
        self.namespaces = next;
        let before = self.pressure.state();
        let after = self.pressure.update(most, free_slots, capacity);
        (before, after)
    }

    /// Refuses a trigger creating what `ask` asks for in `ns`, which holds
    /// `counts` and has `reserved` backfill instants still to come.
    pub fn admit(&self, ns: &str, counts: NsCounts, reserved: u64, ask: Ask) -> std::result::Result<(), QuotaExceeded> {
        let q = self.quota(ns);
        q.check(ns, QuotaName::RequestBytes, 0, ask.bytes)?;
        if ask.roots > 0 {
            q.check(ns, QuotaName::DownstreamRuns, 0, (ask.runs - ask.roots.min(ask.runs)).div_ceil(ask.roots))?;
        }
        if self.defers(ns) {
            let c = self.pressure.config;
            let limit = (c.max_pending as f64 * c.red) as u64;
            return Err(QuotaExceeded {
                namespace: ns.to_string(),
                quota: QuotaName::Backlog,
                limit,
                usage: counts.backlog(),
                asked: ask.runs,
            });
        }
        q.check(ns, QuotaName::OpenRuns, counts.counted() + reserved, ask.runs)?;
        q.check(ns, QuotaName::OpenBytes, counts.bytes, ask.bytes)
    }

    /// Refuses a backfill of `instants` instants in `ns`, which holds
    /// `counts` open, has `reserved` backfill instants still to come and
    /// `running` backfills running.
    pub fn admit_backfill(
        &self,
        ns: &str,
        counts: NsCounts,
        reserved: u64,
        running: u64,
        instants: u64,
    ) -> std::result::Result<(), QuotaExceeded> {
        let q = self.quota(ns);
        q.check(ns, QuotaName::Backfills, running, 1)?;
        q.check(ns, QuotaName::OpenRuns, counts.counted() + reserved, instants)?;
        // Its runs' bytes count as they are created (each chunk waits
        // while the namespace is at the quota).
        q.check(ns, QuotaName::OpenBytes, counts.bytes, 0)
    }

    /// Whether a running backfill of `ns` takes its next chunk now: not
    /// while its namespace's fires are deferred, nor while its open runs
    /// or their bytes are at the quota.
    pub fn backfill_may_run(&self, ns: &str, counts: NsCounts) -> bool {
        let q = self.quota(ns);
        !self.defers(ns) && counts.counted() < q.open_runs && counts.bytes < q.open_bytes
    }
}

/// Counts a refusal in `gnomon_quota_refusals_total`.
pub fn count_refusal(e: &QuotaExceeded) {
    metrics::counter!("gnomon_quota_refusals_total", "namespace" => e.namespace.clone(), "quota" => e.quota.as_str()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use gnomon_core::RunState;

    fn counts(pending: u64) -> NsCounts {
        NsCounts { pending, ..NsCounts::default() }
    }

    #[test]
    fn only_a_namespaces_own_backlog_defers_its_fires() {
        let config = BackpressureConfig { max_pending: 100, ..Default::default() };
        let mut a = Admission::new(config, Quotas::default());
        let (flooded, calm) = (counts(95), counts(1));
        let (_, after) = a.update([("a", &flooded), ("b", &calm)].into_iter(), 4, 4);
        assert!(a.defers("a") && !a.defers("b") && !a.defers("unknown"));
        assert_eq!(after, Pressure::Red, "the leader-wide state is the most loaded namespace's");
        // Hysteresis holds per namespace: 88 % is still red, 80 % is not.
        a.update([("a", &counts(88))].into_iter(), 4, 4);
        assert!(a.defers("a"));
        a.update([("a", &counts(80))].into_iter(), 4, 4);
        assert!(!a.defers("a"));
        // Saturated workers raise the leader-wide state, not a namespace's.
        let (_, after) = a.update([("a", &counts(8))].into_iter(), 0, 4);
        assert_eq!((after, a.state_of("a")), (Pressure::Yellow, Pressure::Green));
    }

    #[test]
    fn a_request_is_refused_by_the_quota_it_would_pass() {
        let quotas = Quotas::parse(&["open_runs=10", "request_bytes=100", "downstream_runs=2", "backfills=1"]).unwrap();
        let a = Admission::new(BackpressureConfig::default(), quotas);
        let ok = Ask { roots: 2, runs: 6, bytes: 100 };
        assert!(a.admit("n", counts(2), 2, ok).is_ok(), "2 open + 2 reserved + 6 = 10");
        let refused = |ask, c, r| a.admit("n", c, r, ask).unwrap_err().quota;
        assert_eq!(refused(Ask { bytes: 101, ..ok }, counts(0), 0), QuotaName::RequestBytes);
        assert_eq!(refused(Ask { runs: 7, ..ok }, counts(0), 0), QuotaName::DownstreamRuns, "5 downstream runs for 2 roots");
        assert_eq!(refused(ok, counts(3), 2), QuotaName::OpenRuns);
        assert_eq!(refused(ok, counts(2), 3), QuotaName::OpenRuns, "a backfill's instants to come count");
        assert!(a.admit_backfill("n", counts(0), 0, 0, 10).is_ok());
        assert_eq!(a.admit_backfill("n", counts(0), 0, 1, 1).unwrap_err().quota, QuotaName::Backfills);
        assert_eq!(a.admit_backfill("n", counts(1), 0, 0, 10).unwrap_err().quota, QuotaName::OpenRuns);
        assert!(a.backfill_may_run("n", counts(9)) && !a.backfill_may_run("n", counts(10)));
    }

    #[test]
    fn kept_keyed_runs_and_open_bytes_count_and_a_red_namespace_refuses_triggers() {
        let quotas = Quotas::parse(&["open_runs=10", "open_bytes=100"]).unwrap();
        let mut a = Admission::new(BackpressureConfig { max_pending: 100, ..Default::default() }, quotas);
        let one = Ask { roots: 1, runs: 1, bytes: 10 };
        let kept = NsCounts { kept: 9, ..NsCounts::default() };
        assert!(a.admit("n", kept, 0, one).is_ok(), "9 kept + 1 = 10");
        assert_eq!(a.admit("n", NsCounts { kept: 10, ..NsCounts::default() }, 0, one).unwrap_err().quota, QuotaName::OpenRuns);
        assert!(!a.backfill_may_run("n", NsCounts { kept: 10, ..NsCounts::default() }), "kept runs hold a backfill back");
        let full = NsCounts { active: 1, bytes: 91, ..NsCounts::default() };
        let e = a.admit("n", full, 0, one).unwrap_err();
        assert_eq!((e.quota, e.usage, e.asked, e.limit), (QuotaName::OpenBytes, 91, 10, 100));
        assert!(a.admit("n", NsCounts { bytes: 90, ..full }, 0, one).is_ok(), "up to the byte quota fits");
        assert!(!a.backfill_may_run("n", NsCounts { bytes: 100, ..NsCounts::default() }));
        assert_eq!(a.admit_backfill("n", NsCounts { bytes: 101, ..NsCounts::default() }, 0, 0, 1).unwrap_err().quota, QuotaName::OpenBytes);
        // Red: triggers are refused, and only that namespace's.
        let flooded = counts(95);
        a.update([("n", &flooded)].into_iter(), 4, 4);
        let e = a.admit("n", flooded, 0, Ask { bytes: 0, ..one }).unwrap_err();
        assert_eq!((e.quota, e.usage, e.limit), (QuotaName::Backlog, 95, 90));
        assert!(a.admit("m", counts(0), 0, Ask { bytes: 0, ..one }).is_ok(), "another namespace is let in");
        assert_eq!(QuotaName::Backlog.retry_after_secs(), 5);
    }

    #[test]
    fn an_ask_counts_params_and_payloads_of_every_run() {
        let run = |params: Option<&str>, payload: Option<&str>| NewRun {
            job_uid: "u".into(),
            namespace: "n".into(),
            job: "j".into(),
            scheduled_at: 0,
            fired_at: 0,
            state: RunState::Pending,
            reason: None,
            manual: true,
            key: None,
            params: params.map(str::to_string),
            payload: payload.map(str::to_string),
            upstream: None,
        };
        let ask = Ask::of(&[run(Some("{\"a\":1}"), Some("xyz")), run(None, None), run(Some("{}"), None)], 1);
        assert_eq!(ask, Ask { roots: 1, runs: 3, bytes: 7 + 3 + 2 });
    }
}
