//! jobs

use crate::plan::FirePlan;
use crate::plan::TurnPlan;
use crate::runbook::RunBook;
use crate::timeline::JobKey;
use crate::Engine;
use crate::HashSet;
use gnomon_core::policy::decide_overlap;
use gnomon_core::policy::plan_fires;
use gnomon_core::policy::Decision;
use gnomon_core::policy::OverlapDecision;
use gnomon_core::policy::PlanInput;
use gnomon_core::spec::OverlapPolicy;
use gnomon_core::Millis;
use gnomon_core::RunState;
use gnomon_records::FireOutcome;
use gnomon_records::JobAdvance;
use gnomon_records::JobRecord;
use gnomon_records::NewRun;
use gnomon_records::Transition;
use std::sync::Arc;

/// The most jobs fired in one store transaction. A burst (100,000 jobs due
/// at the same second) is written in chunks, so memory stays bounded and
/// dispatch and reports interleave with the burst instead of waiting for it.
const MAX_FIRE_BATCH: usize = 2048;
/// The smallest chunk a burst is fired in while it interleaves with
/// dispatch (smaller chunks would spend more on commits than they save).
const MIN_INTERLEAVED_FIRE: usize = 256;

impl Engine {
    /// The job's shared key (see [`JobTimeline::key`](crate::timeline::JobTimeline::key)).
    pub fn job_key(&self, uid: &str, name: &str, namespace: &str) -> Arc<JobKey> {
        self.cache.jobs.key(uid, name, namespace)
    }

    /// Takes in a job's stored record (see [`JobTimeline::upsert`](crate::timeline::JobTimeline::upsert)).
    pub fn upsert_job(&mut self, record: JobRecord) {
        self.cache.jobs.upsert_record(record, self.now);
    }

    /// The size of a fire chunk that goes out with dispatch in the same
    /// turn (about what this turn can assign: the free room, plus the slots
    /// the results waiting to be written free, less the runs already
    /// pending), or `None` when a burst should be fired in full chunks back
    /// to back: no worker is connected, or the pending runs already
    /// outnumber what the workers can take at once (their slots plus
    /// prefetch queues).
    /// `reports`: the worker results waiting to be written.
    pub fn interleaved_fire_chunk(&self, reports: usize) -> Option<usize> {
        let absorb = self.sessions.absorb();
        (absorb > 0 && self.cache.runs.ready_len() < absorb).then(|| {
            let room = (self.dispatch_room() + reports).saturating_sub(self.cache.runs.ready_len());
            room.clamp(MIN_INTERLEAVED_FIRE, MAX_FIRE_BATCH)
        })
    }

    /// Takes up to one chunk of due jobs off the timer heap and plans their
    /// runs into the turn. The chunk's
    /// pending runs are tracked ahead of the write, so this turn's dispatch
    /// may place them; should the write fail, the cache is rebuilt.
    pub fn plan_fire<A>(&mut self, now: Millis, reports: usize, turn: &mut TurnPlan<A>) {
        let limit = self.interleaved_fire_chunk(reports).unwrap_or(MAX_FIRE_BATCH);
        let admission = &self.admission;
        let due_jobs = self.cache.jobs.take_due(now, limit, |ns| admission.defers(ns));
        if due_jobs.is_empty() {
            return;
        }
        let mut new_runs = Vec::new();
        let mut advances = Vec::new();
        let mut replace_cancels = Vec::new();
        let mut plans = Vec::new();
        for uid in &due_jobs {
            let Some(entry) = self.cache.jobs.get(uid) else { continue };
            // The previous version's due instants first, then this one's.
            let (schedule, after, until) = match &entry.carry {
                Some(c) => (&c.schedule, entry.record.last_scheduled_at.map_or(c.after, |l| l.max(c.after)), now.min(c.until)),
                None => (&entry.schedule, entry.base(), now),
            };
            let fires = plan_fires(&PlanInput {
                schedule,
                after,
                now,
                until,
                misfire: entry.misfire,
                catchup_window_ms: entry.catchup_window_ms,
                grace_ms: self.config.misfire_grace_ms,
                // What a previous version left due fires at once.
                jittered: entry.carry.is_none(),
            });
            let (mut open, mut waiting, _) = self.cache.runs.job_counts(uid);
            for planned in &fires.times {
                let (state, reason) = match &planned.decision {
                    Decision::Skip(reason) => (RunState::Skipped, Some(reason.clone())),
                    Decision::Fire => match decide_overlap(entry.overlap, open, waiting) {
                        OverlapDecision::Fire => (RunState::Pending, None),
                        OverlapDecision::FireAndCancelOpen => {
                            replace_cancels.push((uid.clone(), planned.scheduled_at));
                            (RunState::Pending, Some(RunBook::REPLACING_REASON.into()))
                        }
                        OverlapDecision::Skip(reason) => (RunState::Skipped, Some(reason)),
                    },
                };
                if state == RunState::Pending {
                    open += 1;
                    waiting += 1;
                    if entry.overlap == OverlapPolicy::Replace {
                        open = 1;
                        waiting = 1;
                    }
                }
                new_runs.push(NewRun {
                    job_uid: uid.clone(),
                    namespace: entry.record.key.namespace.clone(),
                    job: entry.record.key.name.clone(),
                    scheduled_at: planned.scheduled_at,
                    fired_at: now,
                    state,
                    reason,
                    manual: false,
                    key: None,
                    payload: None,
                    params: (state == RunState::Pending).then(|| entry.default_params.as_deref().map(str::to_string)).flatten(),
                    upstream: None,
                });
            }
            let first = new_runs.len() - fires.times.len();
            let made = self.dependency_runs(&new_runs[first..], now, &mut turn.seen);
            new_runs.extend(made);
            // A timeline that starts at a change is written with the fire.
            let settled = (entry.settle && entry.carry.is_none()).then_some(entry.from);
            let last = fires.last_scheduled_at.max(settled);
            if let Some(last) = last {
                advances.push(JobAdvance { job_uid: uid.clone(), last_scheduled_at: last });
            }
            plans.push((uid.clone(), last, fires.more, entry.carry.is_some()));
        }
        // Replace: what is open is cancelled once the new run is written.
        let replace = replace_cancels;
        // Stamp fired_at as late as possible: when the write begins, not when
        // the turn began (planning a large batch takes time).
        let stamp = self.now;
        for run in &mut new_runs {
            run.fired_at = stamp;
        }
        let mut tracked = Vec::new();
        for run in &new_runs {
            if run.state == RunState::Pending && !self.cache.runs.contains(run.id().as_str()) {
                tracked.push(self.track_pending(run.clone(), now));
            }
        }
        turn.fire = Some(FirePlan { new_runs, advances, plans, now, stamp, tracked, replace });
    }

    /// The dependency runs that `roots` (runs of one write) make, less those
    /// already open here or made by an earlier root (`seen`).
    pub fn dependency_runs(&self, roots: &[NewRun], now: Millis, seen: &mut HashSet<String>) -> Vec<NewRun> {
        let mut out = Vec::new();
        if self.cache.jobs.has_no_edges() {
            return out;
        }
        for root in roots {
            let id = root.id();
            for run in self.cache.jobs.closure(&root.job_uid, root.scheduled_at, &id, root.params.as_deref(), now) {
                let dep = run.id();
                if !self.cache.runs.contains(&dep) && seen.insert(dep) {
                    out.push(run);
                }
            }
        }
        out
    }

    /// Tracks the dependency runs a trigger's write created.
    pub fn track_dependency_runs(&mut self, runs: Vec<NewRun>, outcomes: Vec<FireOutcome>, now: Millis) {
        for (run, outcome) in runs.into_iter().zip(outcomes) {
            if outcome == FireOutcome::Created {
                metrics::counter!("gnomon_runs_total", "state" => run.state.as_str()).increment(1);
                self.track_new(run, now);
            }
        }
    }

    /// `replace`: cancels the open runs of each job a newer run replaced
    /// (written already) that are scheduled before it; an active one's
    /// worker is told to stop it.
    pub fn plan_cancels<A>(&mut self, now: Millis, plan: &mut TurnPlan<A>) {
        for (job_uid, before) in self.cache.runs.take_replace_due() {
            for id in self.cache.runs.of_job(&job_uid) {
                let Some(run) = self.cache.runs.get(&id).filter(|r| r.scheduled_at < before) else { continue };
                match run.state {
                    RunState::Pending | RunState::Retrying => plan.cancels.push(Transition {
                        run_id: id.to_string(),
                        from: run.state,
                        from_attempt: run.attempt,
                        to: RunState::Cancelled,
                        to_attempt: run.attempt,
                        reason: Some("overlap: replaced by a newer run".into()),
                        next_attempt_at: None,
                        attempt: None,
                        at: now,
                        notify: Vec::new(),
                    }),
                    // Told once the turn's write is done (a planner sends nothing).
                    RunState::Assigned | RunState::Running => plan.cancel_sends.push((id.to_string(), run.attempt)),
                    _ => {}
                }
            }
        }
    }
}
