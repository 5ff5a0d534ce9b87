//! The turn's backfill step: each running backfill due a chunk creates the
//! runs of its next instants (see [`Backfills`], the component, for the
//! rules), and its progress is written with the turn.

use gnomon_backend::{BackfillProgress, BackfillRecord};
use gnomon_engine::backfills::Backfills;

use super::plan::TurnPlan;
use super::*;
use gnomon_engine::plan::BackfillStep;

impl LeaderRuntime {
    /// Reads the running backfills (new ones, cancelled ones).
    pub(super) async fn load_backfills(&mut self) -> Result<()> {
        let list = self.store.running_backfills().await?;
        // A waiting run may have expected an instant of one that is gone.
        let gone = self.engine.cache.backfills.load(list, self.engine.now);
        self.engine.cache.runs.reconsider_waiting_on(&gone);
        Ok(())
    }

    /// Whether a running backfill will give job `uid` a record at `at`.
    pub(super) fn backfill_will_make(&self, uid: &str, at: Millis) -> bool {
        self.engine.cache.backfills.covers(uid, at) && self.engine.cache.jobs.get(uid).is_some_and(|e| e.schedule.includes(at))
    }

    /// Plans one chunk of every backfill that is due: its runs (with the
    /// dependency runs they make) and its cursor moved past them, both in
    /// the turn's write.
    pub(super) fn plan_backfills(&mut self, now: Millis, plan: &mut TurnPlan) {
        for b in self.engine.cache.backfills.due(now) {
            let (n, pause) = Backfills::chunk(b.rate);
            // Paused, not ended, while its namespace's fires are deferred or
            // its open runs are at their quota.
            if !self.engine.admission.backfill_may_run(&b.namespace, self.engine.cache.runs.ns_counts(&b.namespace)) {
                self.engine.cache.backfills.wait(&b.id, now + pause);
                continue;
            }
            let Some((schedule, settled)) =
                self.engine.cache.jobs.get(&b.job_uid).map(|e| (e.schedule.clone(), self.engine.cache.jobs.settled_until(&b.job_uid, now)))
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
                    self.engine.cache.backfills.wait(&b.id, now + 1000);
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
            runs.extend(self.engine.dependency_runs(&roots, now, &mut plan.seen));
            plan.count_runs(&b.namespace, runs.len());
            // Not due again until this chunk is applied.
            self.engine.cache.backfills.wait(&b.id, Millis::MAX);
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
        let now = self.engine.now;
        let mut fired = fired;
        let dep_fired = fired.split_off(roots.min(fired.len()));
        self.engine.track_dependency_runs(runs.split_off(roots.min(runs.len())), dep_fired, now);
        for (run, outcome) in runs.into_iter().zip(fired) {
            if outcome == FireOutcome::Created {
                metrics::counter!("gnomon_runs_total", "state" => "pending").increment(1);
                self.engine.track_pending(run, now);
            }
        }
        if counted.done.is_some() {
            tracing::info!(backfill = %record.id, job = %record.job, created = counted.created, kept = counted.kept, "backfill done");
        }
        if advanced && record.advance(&counted) {
            if record.state != gnomon_backend::BackfillState::Running {
                self.engine.cache.runs.reconsider_waiting_on(&HashSet::from_iter([record.job_uid.clone()]));
            }
            self.engine.cache.backfills.advanced(record, next_at);
            return Ok(());
        }
        match self.store.get_backfill(&record.id).await? {
            Some(fresh) if fresh.state == gnomon_backend::BackfillState::Running => self.engine.cache.backfills.advanced(fresh, next_at),
            _ => {
                self.engine.cache.backfills.remove(&record.id);
                self.engine.cache.runs.reconsider_waiting_on(&HashSet::from_iter([record.job_uid.clone()]));
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
