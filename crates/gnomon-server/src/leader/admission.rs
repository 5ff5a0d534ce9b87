//! [`Admission`]: what the leader lets in, per namespace. It owns the
//! quotas and the backpressure states, and decides from counts the leader
//! hands it (the [`RunBook`]'s per-namespace tally and the backfills'
//! instants still to come); it reads nothing itself.
//!
//! - **Quotas** refuse a request that creates runs (trigger, webhook call,
//!   backfill) whole, before anything is written: its bytes, the open runs
//!   it would bring its namespace to, its downstream runs per run, and the
//!   namespace's running backfills.
//! - **Backpressure per namespace**: a namespace whose backlog (pending and
//!   waiting runs) reaches red has its own fires deferred, and its
//!   backfills pause; no other namespace's. The leader-wide state is the
//!   most loaded namespace's, raised to yellow while every worker slot is
//!   taken (then dispatch fills prefetch queues to half).
//!
//! Invariants (checked by the tests below):
//! - a namespace's fires are deferred only by its own backlog;
//! - a request is refused exactly when one of its quotas would be passed,
//!   and the refusal names that quota.

use std::collections::BTreeMap;

use gnomon_core::quota::{Quota, QuotaExceeded, QuotaName, Quotas};

use super::fair::NsCounts;
use super::*;

/// What a request would create in one namespace.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ask {
    /// Runs the request names itself (a trigger's `count`, a key's one).
    pub(super) roots: u64,
    /// Every run it creates, its roots and their downstream runs.
    pub(super) runs: u64,
    /// The params and payload bytes of all of them.
    pub(super) bytes: u64,
}

impl Ask {
    /// What creating `runs`, of which the first `roots` are the request's
    /// own, asks for.
    pub(super) fn of(runs: &[NewRun], roots: usize) -> Ask {
        let bytes =
            runs.iter().map(|r| (r.params.as_ref().map_or(0, String::len) + r.payload.as_ref().map_or(0, String::len)) as u64).sum();
        Ask { roots: roots as u64, runs: runs.len() as u64, bytes }
    }
}

pub(super) struct Admission {
    quotas: Quotas,
    /// The leader-wide state (see the module's text).
    pressure: Backpressure,
    /// Each namespace's own state, from its backlog alone.
    namespaces: BTreeMap<String, Backpressure>,
}

impl Admission {
    pub(super) fn new(config: BackpressureConfig, quotas: Quotas) -> Self {
        Self { quotas, pressure: Backpressure::new(config), namespaces: BTreeMap::new() }
    }

    /// The quotas of `namespace`.
    pub(super) fn quota(&self, namespace: &str) -> Quota {
        self.quotas.of(namespace)
    }

    /// The leader-wide state.
    pub(super) fn pressure(&self) -> &Backpressure {
        &self.pressure
    }

    /// Namespace `ns`'s own state.
    pub(super) fn state_of(&self, ns: &str) -> Pressure {
        self.namespaces.get(ns).map_or(Pressure::Green, Backpressure::state)
    }

    /// Whether namespace `ns`'s fires (and backfills) wait now.
    pub(super) fn defers(&self, ns: &str) -> bool {
        self.state_of(ns) == Pressure::Red
    }

    /// Moves every state on from the namespaces' counts and the workers'
    /// free slots; the leader-wide state before and after.
    pub(super) fn update<'a>(
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

    /// Refuses creating what `ask` asks for in `ns`, which holds `counts`
    /// open and has `reserved` backfill instants still to come.
    pub(super) fn admit(&self, ns: &str, counts: NsCounts, reserved: u64, ask: Ask) -> std::result::Result<(), QuotaExceeded> {
        let q = self.quota(ns);
        q.check(ns, QuotaName::RequestBytes, 0, ask.bytes)?;
        if ask.roots > 0 {
            q.check(ns, QuotaName::DownstreamRuns, 0, (ask.runs - ask.roots.min(ask.runs)).div_ceil(ask.roots))?;
        }
        q.check(ns, QuotaName::OpenRuns, counts.open() + reserved, ask.runs)
    }

    /// Refuses a backfill of `instants` instants in `ns`, which holds
    /// `counts` open, has `reserved` backfill instants still to come and
    /// `running` backfills running.
    pub(super) fn admit_backfill(
        &self,
        ns: &str,
        counts: NsCounts,
        reserved: u64,
        running: u64,
        instants: u64,
    ) -> std::result::Result<(), QuotaExceeded> {
        let q = self.quota(ns);
        q.check(ns, QuotaName::Backfills, running, 1)?;
        q.check(ns, QuotaName::OpenRuns, counts.open() + reserved, instants)
    }

    /// Whether a running backfill of `ns` takes its next chunk now: not
    /// while its namespace's fires are deferred, nor while its open runs
    /// are at the quota.
    pub(super) fn backfill_may_run(&self, ns: &str, counts: NsCounts) -> bool {
        !self.defers(ns) && counts.open() < self.quota(ns).open_runs
    }
}

/// Counts a refusal in `gnomon_quota_refusals_total`.
pub(super) fn count_refusal(e: &QuotaExceeded) {
    metrics::counter!("gnomon_quota_refusals_total", "namespace" => e.namespace.clone(), "quota" => e.quota.as_str()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

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
