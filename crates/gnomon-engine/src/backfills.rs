//! [`Backfills`]: the running backfills the leader works through (the
//! turn's step that does it is the leader's). Part of the cache: loaded from the store on
//! every rebuild and on every poll (which picks up new and cancelled ones).
//!
//! A backfill creates the runs of its job's instants in `[from, to]` by
//! their scheduled run ids (`run_id(job, instant)`), inserted if absent,
//! so an instant that already has a run or a skip record keeps it, and a
//! repeated, overlapping or resumed backfill creates nothing twice. It
//! takes only instants the job's timeline will never fire itself (at or
//! before where the timeline stands), at most `rate` a second, and records
//! its cursor after each chunk (a fenced compare-and-swap from the cursor
//! it read), so a new leader continues where the last write left it.
//!
//! A waiting dependency run expects an upstream's run at an instant a
//! running backfill of it will still reach (`covers`); every waiting run is
//! decided again once a backfill ends or stops running here.
//!
//! Invariants (checked by the tests below):
//! - a backfill is here only while the store last said it runs;
//! - it is due again no sooner than its rate allows.

use std::collections::BTreeMap;

use gnomon_core::Millis;
use gnomon_records::BackfillRecord;

use crate::HashSet;

/// The most instants one step of a backfill takes.
const MAX_CHUNK: u32 = 500;

/// A backfill and when it may take its next chunk.
struct Entry {
    record: BackfillRecord,
    next_at: Millis,
}

#[derive(Default)]
pub struct Backfills {
    running: BTreeMap<String, Entry>,
}

impl Backfills {
    /// Takes in the running backfills as the store has them (those not
    /// listed no longer run); the jobs of those that ran here and are gone.
    pub fn load(&mut self, list: Vec<BackfillRecord>, now: Millis) -> HashSet<String> {
        let mut next = BTreeMap::new();
        for record in list {
            let next_at = self.running.get(&record.id).map_or(now, |e| e.next_at);
            next.insert(record.id.clone(), Entry { record, next_at });
        }
        let gone = self.running.iter().filter(|(id, _)| !next.contains_key(*id)).map(|(_, e)| e.record.job_uid.clone()).collect();
        self.running = next;
        gone
    }

    /// Takes in a backfill just created.
    pub fn add(&mut self, record: BackfillRecord, now: Millis) {
        self.running.insert(record.id.clone(), Entry { record, next_at: now });
    }

    /// Whether a running backfill of job `uid` has the instant `at` still
    /// ahead of it (it will give it a record if its job's schedule has it).
    pub fn covers(&self, uid: &str, at: Millis) -> bool {
        self.running.values().any(|e| e.record.job_uid == uid && e.record.cursor < at && at <= e.record.to)
    }

    /// The backfills due a chunk at `now`, oldest first.
    pub fn due(&self, now: Millis) -> Vec<BackfillRecord> {
        self.running.values().filter(|e| e.next_at <= now).map(|e| e.record.clone()).collect()
    }

    /// How many instants one chunk of a backfill at `rate` takes, and how
    /// long after it the next one may start.
    pub fn chunk(rate: u32) -> (usize, Millis) {
        let rate = rate.max(1);
        let n = rate.min(MAX_CHUNK);
        (n as usize, Millis::from(n) * 1000 / Millis::from(rate))
    }

    /// A chunk was written: the record as it is now, due again at `next_at`;
    /// ended ones leave.
    pub fn advanced(&mut self, record: BackfillRecord, next_at: Millis) {
        if record.state != gnomon_records::BackfillState::Running {
            self.running.remove(&record.id);
            return;
        }
        self.running.insert(record.id.clone(), Entry { record, next_at });
    }

    /// Not due before `at` (it waits for its job's timeline).
    pub fn wait(&mut self, id: &str, at: Millis) {
        if let Some(e) = self.running.get_mut(id) {
            e.next_at = at;
        }
    }

    /// Drops one (it no longer runs).
    pub fn remove(&mut self, id: &str) {
        self.running.remove(id);
    }

    /// The namespaces with running backfills.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.running.values().map(|e| e.record.namespace.as_str())
    }

    /// Namespace `ns`'s running backfills, and the instants they have still
    /// to take.
    pub fn of_namespace(&self, ns: &str) -> (u64, u64) {
        self.running
            .values()
            .filter(|e| e.record.namespace == ns)
            .fold((0, 0), |(n, left), e| (n + 1, left + e.record.total.saturating_sub(e.record.created + e.record.kept)))
    }

    pub fn len(&self) -> usize {
        self.running.len()
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gnomon_records::{BackfillState, NewBackfill};

    fn record(id: &str, rate: u32) -> BackfillRecord {
        let b = NewBackfill {
            id: id.into(),
            namespace: "default".into(),
            job: "j".into(),
            job_uid: "u".into(),
            from: 1000,
            to: 9000,
            params: None,
            rate,
            total: 9,
        };
        BackfillRecord::new(&b, 0)
    }

    #[test]
    fn a_backfill_is_due_as_its_rate_allows_and_leaves_when_it_ends() {
        assert_eq!(Backfills::chunk(10), (10, 1000));
        assert_eq!(Backfills::chunk(1000), (500, 500));
        assert_eq!(Backfills::chunk(0), (1, 1000));
        let mut b = Backfills::default();
        b.load(vec![record("a", 2), record("b", 5)], 100);
        assert_eq!(b.due(100).len(), 2);
        let mut a = record("a", 2);
        a.cursor = 2000;
        b.advanced(a.clone(), 1100);
        assert_eq!(b.due(1000).iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["b"]);
        // A reload keeps when each is due, and drops (and says so) what no
        // longer runs.
        assert_eq!(b.load(vec![a.clone()], 1000), HashSet::from_iter(["u".to_string()]));
        assert!(b.covers("u", 3000) && b.covers("u", 9000), "instants past its cursor");
        assert!(!b.covers("u", 2000) && !b.covers("u", 9001) && !b.covers("other", 3000));
        assert!(b.due(1000).is_empty() && b.len() == 1);
        assert_eq!(b.due(1100)[0].cursor, 2000);
        a.state = BackfillState::Done;
        b.advanced(a, 2000);
        assert_eq!(b.len(), 0);
    }
}
