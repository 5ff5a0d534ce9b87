//! Judging what workers hold: heartbeats that leave attempts out, and
//! attempts that overran their timeout.

use crate::RECONNECT_SLACK_MS;

use crate::inbox::WorkerEvent;
use crate::runbook::RunId;
use crate::Engine;
use crate::HashMap;
use crate::HashSet;
use gnomon_core::outcome::RetryHint;
use gnomon_core::AttemptState;
use gnomon_core::Millis;
use gnomon_proto::v1;
use gnomon_records::Transition;

/// How far past its job's timeout (counted from its assignment) an attempt
/// may run before the leader ends it `timed_out` itself, on top of the
/// lease TTL: the worker kills it at the timeout and reports; this only
/// catches a worker that keeps listing an attempt and never reports.
pub const OVERRUN_GRACE_MS: Millis = 60_000;

impl Engine {
    /// A heartbeat lists every attempt the worker holds, executing or
    /// queued. An attempt the leader has it holding that two heartbeats in a
    /// row did not list, assigned more than a heartbeat interval before,
    /// and with no report of it waiting to be written, never reached the
    /// worker or was dropped by it: it is ended `lost` at the next turn
    /// (the runtime's `plan_expiries`) and retried per its job's policy, instead
    /// of staying `assigned` for as long as the worker lives. Two in a row,
    /// because a report can leave the worker just after a heartbeat that no
    /// longer lists its attempt, and an assignment can cross a heartbeat.
    pub fn reconcile_held(&mut self, worker: &str, listed: &[v1::AttemptRef], now: Millis) {
        let Some(s) = self.sessions.get(worker) else { return };
        let held = self.cache.runs.runs_held_by(worker);
        if held.is_empty() && s.unlisted.is_empty() {
            return;
        }
        let listed: HashSet<(&str, u32)> = listed.iter().map(|a| (a.run_id.as_str(), a.attempt)).collect();
        let reported: HashSet<&str> = self
            .reports
            .reports()
            .iter()
            .filter_map(|e| match e {
                WorkerEvent::Finished { worker: w, run_id, .. } if w == worker => Some(run_id.as_str()),
                _ => None,
            })
            .collect();
        let mut unlisted = HashMap::default();
        let mut gone = Vec::new();
        for id in &held {
            let Some(run) = self.cache.runs.get(id) else { continue };
            if listed.contains(&(&**id, run.attempt))
                || reported.contains(&**id)
                || self.cache.runs.is_orphan(id)
                || now - run.assigned_at <= self.config.heartbeat_ms
            {
                continue;
            }
            let misses = s.unlisted.get(id).copied().unwrap_or(0) + 1;
            if misses >= 2 {
                gone.push((worker.to_string(), id.clone()));
            } else {
                unlisted.insert(id.clone(), misses);
            }
        }
        self.sessions.set_unlisted(worker, unlisted);
        self.reports.unheld(gone);
    }

    /// Attempts that ran past their job's timeout by more than the grace
    /// (from when they began: their start, or their assignment if later,
    /// as the store has them) with no result: ended `timed_out` by the
    /// leader, and the worker is told to stop them. Checked once a second.
    pub fn expire_overruns(&mut self, now: Millis, batch: &mut Vec<Transition>, aborts: &mut Vec<(String, String, u32, String)>) {
        if !self.cadence.overrun_scan(now) {
            return;
        }
        let grace = OVERRUN_GRACE_MS + self.config.lease_ttl_ms;
        let overran: Vec<(RunId, String, u32, Millis)> = self
            .cache
            .runs
            .holders()
            .filter_map(|(id, worker)| {
                let run = self.cache.runs.get(id)?;
                let timeout = self.cache.jobs.get(&run.key.uid)?.timeout?;
                let timeout = Millis::try_from(timeout.as_millis()).unwrap_or(Millis::MAX / 4);
                (now > run.began_at + timeout + grace).then(|| (id.clone(), worker.clone(), run.attempt, timeout))
            })
            .collect();
        for (id, worker, attempt, timeout) in overran {
            let reported = self
                .reports
                .reports()
                .iter()
                .any(|e| matches!(e, WorkerEvent::Finished { run_id, attempt: a, .. } if **run_id == *id && *a == attempt));
            if reported {
                continue;
            }
            tracing::warn!(worker = %worker, run = %id, attempt, "no result past the job's timeout and the grace; the leader ends the attempt timed out");
            metrics::counter!("gnomon_attempts_overrun_total").increment(1);
            let why = format!(
                "worker {worker} reported no result within the timeout ({timeout} ms) and a grace of {grace} ms; ended by the leader"
            );
            if let Some(t) = self.end_attempt(&id, AttemptState::TimedOut, None, why, RetryHint::Policy, now) {
                batch.push(t);
                aborts.push((worker, id.to_string(), attempt, "the attempt overran its timeout and was ended by the leader".into()));
            }
        }
    }
}

impl Engine {
    /// A session key was deleted in the store: its lease ran out (the worker
    /// stopped heartbeating) or was revoked. Evict that worker's attempts.
    pub fn on_lease_deleted(&mut self, worker: &str, lease: i64) {
        let now = self.now;
        let ttl = self.config.lease_ttl_ms;
        // The store lease is refreshed only every 0.7×TTL, so it can run
        // out up to 0.7×TTL before the worker fences itself (0.7×TTL after
        // its last acknowledged heartbeat). It is evicted when the in-memory
        // lease says so: a full TTL after its last heartbeat, never earlier.
        if self.sessions.store_lease_deleted(worker, lease, ttl) {
            tracing::warn!(worker, lease, "worker session lease deleted in the store; evicting it a lease after its last heartbeat");
            metrics::counter!("gnomon_worker_lease_deletions_total").increment(1);
        }
        if self.sessions.forget_adopted(worker, lease) {
            // A lease adopted from the previous leader: that leader acked
            // the worker at most 0.7×TTL after the lease's last refresh, so
            // the worker's attempts may run until 0.7×TTL after its
            // deletion (and never past the term start's own bound).
            let floor = self.cadence.started().unwrap_or(now) + ttl + RECONNECT_SLACK_MS;
            self.cache.runs.set_orphan_deadlines(worker, (now + ttl * 7 / 10).min(floor));
        }
    }
}
