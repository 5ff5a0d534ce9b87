//! The checks of a failover suite's whole history, once its faults are over.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use super::*;

impl Ha {
    /// The history is clean: no duplicate fires; every second of the
    /// fire_all job fired once; no run with two live attempts; no run left
    /// non-terminal (beyond the last seconds').
    pub(super) fn check_history(&self) {
        let end = now_ms() - 15_000;
        for job in ["every-second", "every-second-once", "burst", "after-second"] {
            let stuck: Vec<String> = self
                .runs(job)
                .into_iter()
                .filter(|r| r.fired_at < end && !r.state.is_terminal())
                .map(|r| format!("{} {}", r.id, r.state.as_str()))
                .collect();
            assert!(stuck.is_empty(), "{job}: {} runs left non-terminal, e.g. {:?}", stuck.len(), &stuck[..stuck.len().min(5)]);
        }
        for job in ["every-second", "every-second-once"] {
            let runs = self.runs(job);
            let mut seen = HashSet::new();
            for r in &runs {
                assert!(seen.insert(r.scheduled_at), "{job}: scheduled time {} fired twice", r.scheduled_at);
            }
        }
        let all: BTreeMap<i64, _> = self.runs("every-second").into_iter().map(|r| (r.scheduled_at, r)).collect();
        let mut t = self.started;
        let mut missing = Vec::new();
        while t <= end {
            if !all.contains_key(&t) {
                missing.push(t);
            }
            t += 1000;
        }
        assert!(missing.is_empty(), "fire_all missed {} scheduled seconds, e.g. {:?}", missing.len(), &missing[..missing.len().min(5)]);
        self.check_dependency_runs(end);
        self.check_backfill();
        for job in ["every-second", "every-second-once"] {
            for r in self.runs(job) {
                let d = self.rt.block_on(self.store.get_run(&r.id)).expect("get run").expect("run exists");
                let live = d
                    .attempts
                    .iter()
                    .filter(|a| matches!(a.state, gnomon_core::AttemptState::Assigned | gnomon_core::AttemptState::Running))
                    .count();
                assert!(live <= 1, "run {} has {live} live attempts: {:?}", r.id, d.attempts);
                let mut spans: Vec<(i64, i64)> = d.attempts.iter().map(|a| (a.assigned_at, a.ended_at.unwrap_or(i64::MAX))).collect();
                spans.sort();
                for w in spans.windows(2) {
                    assert!(w[1].0 >= w[0].1, "run {}: attempts overlap in time: {:?}", r.id, d.attempts);
                }
            }
        }
    }

    /// The backfill finished through the faults: every instant of its range
    /// has its one record (no duplicate: checked with the job's others).
    fn check_backfill(&self) {
        let Some((id, from, to)) = self.backfill.clone() else { return };
        let read = || self.rt.block_on(self.store.get_backfill(&id)).expect("get backfill").expect("it exists");
        let mut b = read();
        for _ in 0..60 {
            if b.state != gnomon_backend::BackfillState::Running {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
            b = read();
        }
        assert_eq!(b.state, gnomon_backend::BackfillState::Done, "at {}: {b:?}", now_ms());
        assert_eq!((b.total, b.created + b.kept), (80, 80), "{b:?}");
        let have: HashSet<i64> = self.runs("every-second-once").into_iter().map(|r| r.scheduled_at).collect();
        let mut t = from;
        while t <= to {
            assert!(have.contains(&t), "backfilled instant {t} has no record");
            t += 1000;
        }
    }

    /// Every run of every-second that ended has its one after-second run of
    /// the same instant, decided by its outcome (`any`: it ran unless the
    /// instant was skipped), and started only after it ended. after-second
    /// is created after every-second, so the check starts at its first
    /// run's instant (the fires before the leader knew it make none); that
    /// instant must come within seconds of the start.
    fn check_dependency_runs(&self, end: i64) {
        let downs: BTreeMap<i64, gnomon_backend::RunRecord> = self.runs("after-second").into_iter().map(|r| (r.scheduled_at, r)).collect();
        let first = *downs.keys().next().expect("after-second ran");
        assert!(first <= self.started + 10_000, "after-second's first run is at {first}, every-second started at {}", self.started);
        for up in self.runs("every-second").into_iter().filter(|r| r.fired_at < end && r.scheduled_at >= first) {
            let Some(down) = downs.get(&up.scheduled_at) else {
                let near: Vec<String> = downs
                    .range(up.scheduled_at - 3_000..up.scheduled_at + 3_000)
                    .map(|(t, r)| format!("{t} {} fired {} {}", r.id, r.fired_at, r.state.as_str()))
                    .collect();
                let ups: Vec<String> = self
                    .runs("every-second")
                    .into_iter()
                    .filter(|r| (r.scheduled_at - up.scheduled_at).abs() <= 3_000)
                    .map(|r| format!("{} {} fired {} {:?}", r.scheduled_at, r.id, r.fired_at, r.reason))
                    .collect();
                panic!(
                    "run {} ({}, fired {}) has no after-second run of its instant; after-second near it: {near:#?}; every-second near it: {ups:#?}",
                    up.id,
                    up.state.as_str(),
                    up.fired_at
                );
            };
            assert_eq!(down.id, gnomon_backend::dep_run_id(&down.job_uid, up.scheduled_at));
            let ran = up.state != gnomon_core::RunState::Skipped;
            let want = if ran { gnomon_core::RunState::Succeeded } else { gnomon_core::RunState::Skipped };
            assert_eq!(down.state, want, "{}: upstream {} ended {}; {:?}", down.id, up.id, up.state.as_str(), down.reason);
            let d = self.rt.block_on(self.store.get_run(&down.id)).expect("get run").expect("run exists");
            if let Some(first) = d.attempts.first() {
                assert!(
                    first.assigned_at >= up.updated_at,
                    "{}: started at {} before its upstream ended at {}",
                    down.id,
                    first.assigned_at,
                    up.updated_at
                );
            }
        }
    }
}
