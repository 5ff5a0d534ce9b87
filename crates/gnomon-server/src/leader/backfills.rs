//! [`Backfills`]: the running backfills the leader works through, and the
//! turn's step that does it. Part of the cache: loaded from the store on
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

use gnomon_backend::{BackfillProgress, BackfillRecord};

use super::plan::{BackfillStep, TurnPlan};
use super::*;

/// The most instants one step of a backfill takes.
const MAX_CHUNK: u32 = 500;

/// A backfill and when it may take its next chunk.
struct Entry {
    record: BackfillRecord,
    next_at: Millis,
}

#[derive(Default)]
pub(super) struct Backfills {
    running: BTreeMap<String, Entry>,
}

impl Backfills {
    /// Takes in the running backfills as the store has them (those not
    /// listed no longer run); the jobs of those that ran here and are gone.
    pub(super) fn load(&mut self, list: Vec<BackfillRecord>, now: Millis) -> HashSet<String> {
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
    pub(super) fn add(&mut self, record: BackfillRecord, now: Millis) {
        self.running.insert(record.id.clone(), Entry { record, next_at: now });
    }

    /// Whether a running backfill of job `uid` has the instant `at` still
    /// ahead of it (it will give it a record if its job's schedule has it).
    pub(super) fn covers(&self, uid: &str, at: Millis) -> bool {
        self.running.values().any(|e| e.record.job_uid == uid && e.record.cursor < at && at <= e.record.to)
    }

    /// The backfills due a chunk at `now`, oldest first.
    pub(super) fn due(&self, now: Millis) -> Vec<BackfillRecord> {
        self.running.values().filter(|e| e.next_at <= now).map(|e| e.record.clone()).collect()
    }

    /// How many instants one chunk of a backfill at `rate` takes, and how
    /// long after it the next one may start.
    pub(super) fn chunk(rate: u32) -> (usize, Millis) {
        let rate = rate.max(1);
        let n = rate.min(MAX_CHUNK);
        (n as usize, Millis::from(n) * 1000 / Millis::from(rate))
    }

    /// A chunk was written: the record as it is now, due again at `next_at`;
    /// ended ones leave.
    pub(super) fn advanced(&mut self, record: BackfillRecord, next_at: Millis) {
        if record.state != gnomon_backend::BackfillState::Running {
            self.running.remove(&record.id);
            return;
        }
        self.running.insert(record.id.clone(), Entry { record, next_at });
    }

    /// Not due before `at` (it waits for its job's timeline).
    pub(super) fn wait(&mut self, id: &str, at: Millis) {
        if let Some(e) = self.running.get_mut(id) {
            e.next_at = at;
        }
    }

    /// Drops one (it no longer runs).
    pub(super) fn remove(&mut self, id: &str) {
        self.running.remove(id);
    }

    /// The namespaces with running backfills.
    pub(super) fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.running.values().map(|e| e.record.namespace.as_str())
    }

    /// Namespace `ns`'s running backfills, and the instants they have still
    /// to take.
    pub(super) fn of_namespace(&self, ns: &str) -> (u64, u64) {
        self.running
            .values()
            .filter(|e| e.record.namespace == ns)
            .fold((0, 0), |(n, left), e| (n + 1, left + e.record.total.saturating_sub(e.record.created + e.record.kept)))
    }

    pub(super) fn len(&self) -> usize {
        self.running.len()
    }
}

impl LeaderRuntime {
    /// Reads the running backfills (new ones, cancelled ones).
    pub(super) async fn load_backfills(&mut self) -> Result<()> {
        let list = self.store.running_backfills().await?;
        // A waiting run may have expected an instant of one that is gone.
        let gone = self.cache.backfills.load(list, self.now);
        self.cache.runs.reconsider_waiting_on(&gone);
        Ok(())
    }

    /// Whether a running backfill will give job `uid` a record at `at`.
    pub(super) fn backfill_will_make(&self, uid: &str, at: Millis) -> bool {
        self.cache.backfills.covers(uid, at) && self.cache.jobs.get(uid).is_some_and(|e| e.schedule.includes(at))
    }

    /// Plans one chunk of every backfill that is due: its runs (with the
    /// dependency runs they make) and its cursor moved past them, both in
    /// the turn's write.
    pub(super) fn plan_backfills(&mut self, now: Millis, plan: &mut TurnPlan) {
        for b in self.cache.backfills.due(now) {
            let (n, pause) = Backfills::chunk(b.rate);
            // Paused, not ended, while its namespace's fires are deferred or
            // its open runs are at their quota.
            if !self.admission.backfill_may_run(&b.namespace, self.cache.runs.ns_counts(&b.namespace)) {
                self.cache.backfills.wait(&b.id, now + pause);
                continue;
            }
            let Some((schedule, settled)) =
                self.cache.jobs.get(&b.job_uid).map(|e| (e.schedule.clone(), self.cache.jobs.settled_until(&b.job_uid, now)))
            else {
                plan.backfills.push(finish(b, None, Vec::new(), 0, "its job was deleted", now));
                continue;
            };
            let until = b.to.min(settled.unwrap_or(Millis::MIN));
            let (times, more) = schedule.fires_between(b.cursor, until, n);
            if times.is_empty() {
                if until >= b.to {
                    let to = b.to;
                    plan.backfills.push(finish(b, Some(to), Vec::new(), 0, "every instant of the range has a record", now));
                } else {
                    // The job's timeline has not passed the range yet.
                    self.cache.backfills.wait(&b.id, now + 1000);
                }
                continue;
            }
            let roots: Vec<NewRun> = times
                .iter()
                .map(|&at| NewRun {
                    job_uid: b.job_uid.clone(),
                    namespace: b.namespace.clone(),
                    job: b.job.clone(),
                    scheduled_at: at,
                    fired_at: now,
                    state: RunState::Pending,
                    reason: Some(format!("backfill {}", b.id)),
                    manual: false,
                    key: None,
                    params: b.params.clone(),
                    payload: None,
                    upstream: None,
                })
                .collect();
            let n_roots = roots.len();
            let mut runs = roots.clone();
            runs.extend(self.dependency_runs(&roots, now, &mut plan.seen));
            plan.count_runs(&b.namespace, runs.len());
            // Not due again until this chunk is applied.
            self.cache.backfills.wait(&b.id, Millis::MAX);
            let last = *times.last().unwrap_or(&b.cursor);
            if !more && until >= b.to {
                let to = b.to;
                plan.backfills.push(finish(b, Some(to), runs, n_roots, "every instant of the range has a record", now));
            } else {
                let progress = BackfillProgress {
                    id: b.id.clone(),
                    from_cursor: b.cursor,
                    cursor: last,
                    created: b.created,
                    kept: b.kept,
                    done: None,
                    at: now,
                };
                plan.backfills.push(BackfillStep { record: b, runs, roots: n_roots, progress, next_at: now + pause });
            }
        }
    }

    /// A backfill's chunk is written (`fired`, its runs' outcomes) and its
    /// progress applied or refused (`advanced`; `counted` is the progress
    /// with the chunk counted, as the store recorded it). When the store
    /// refused it (the backfill was cancelled, or an earlier write whose
    /// outcome was unknown did land), the store's copy is taken instead: a
    /// backfill that still runs stays (waiting runs may expect its
    /// instants), one that ended leaves, and the waiting runs on its job
    /// are decided again.
    pub(super) async fn apply_backfill_step(
        &mut self,
        step: BackfillStep,
        fired: Vec<FireOutcome>,
        advanced: bool,
        counted: BackfillProgress,
    ) -> Result<()> {
        let BackfillStep { mut record, mut runs, roots, next_at, .. } = step;
        let now = self.now;
        let mut fired = fired;
        let dep_fired = fired.split_off(roots.min(fired.len()));
        self.track_dependency_runs(runs.split_off(roots.min(runs.len())), dep_fired, now);
        for (run, outcome) in runs.into_iter().zip(fired) {
            if outcome == FireOutcome::Created {
                metrics::counter!("gnomon_runs_total", "state" => "pending").increment(1);
                self.track_pending(run, now);
            }
        }
        if counted.done.is_some() {
            tracing::info!(backfill = %record.id, job = %record.job, created = counted.created, kept = counted.kept, "backfill done");
        }
        if advanced && record.advance(&counted) {
            if record.state != gnomon_backend::BackfillState::Running {
                self.cache.runs.reconsider_waiting_on(&HashSet::from_iter([record.job_uid.clone()]));
            }
            self.cache.backfills.advanced(record, next_at);
            return Ok(());
        }
        match self.store.get_backfill(&record.id).await? {
            Some(fresh) if fresh.state == gnomon_backend::BackfillState::Running => self.cache.backfills.advanced(fresh, next_at),
            _ => {
                self.cache.backfills.remove(&record.id);
                self.cache.runs.reconsider_waiting_on(&HashSet::from_iter([record.job_uid.clone()]));
            }
        }
        Ok(())
    }
}

/// The last step of backfill `b`: its cursor at `cursor` (or where it
/// stands), done for the reason `why`, with the chunk `runs` (the first
/// `roots` its own instants).
fn finish(b: BackfillRecord, cursor: Option<Millis>, runs: Vec<NewRun>, roots: usize, why: &str, now: Millis) -> BackfillStep {
    let progress = BackfillProgress {
        id: b.id.clone(),
        from_cursor: b.cursor,
        cursor: cursor.unwrap_or(b.cursor),
        created: b.created,
        kept: b.kept,
        done: Some(why.into()),
        at: now,
    };
    BackfillStep { record: b, runs, roots, progress, next_at: now }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gnomon_backend::{BackfillState, NewBackfill};

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
