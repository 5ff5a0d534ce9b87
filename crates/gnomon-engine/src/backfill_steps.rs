//! The backfill step's plan: one chunk of each running backfill due.

use crate::backfills::Backfills;
use gnomon_records::BackfillRecord;

use crate::plan::BackfillStep;
use crate::plan::TurnPlan;
use crate::Engine;
use gnomon_core::Millis;
use gnomon_core::RunState;
use gnomon_records::BackfillProgress;
use gnomon_records::NewRun;

impl Engine {
    /// Whether a running backfill will give job `uid` a record at `at`.
    pub fn backfill_will_make(&self, uid: &str, at: Millis) -> bool {
        self.cache.backfills.covers(uid, at) && self.cache.jobs.get(uid).is_some_and(|e| e.schedule.includes(at))
    }

    /// Plans one chunk of every backfill that is due: its runs (with the
    /// dependency runs they make) and its cursor moved past them, both in
    /// the turn's write.
    pub fn plan_backfills<A>(&mut self, now: Millis, plan: &mut TurnPlan<A>) {
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
