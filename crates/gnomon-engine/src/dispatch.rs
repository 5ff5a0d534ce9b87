//! Dispatch: which ready runs go to which workers this turn. The pass
//! reserves each chosen worker's slot in the run book as it goes (so the
//! rest of the pass sees it taken); the runtime writes the assignments and
//! sends them once the write applied.

use crate::sessions::PREFETCH_SHORT_MS;
use crate::timeline::JobEntry;
use crate::Engine;
use crate::HashMap;
use crate::HashSet;
use gnomon_core::routing::pick_worker;
use gnomon_core::routing::Candidate;
use gnomon_core::spec::Executor;
use gnomon_core::spec::OverlapPolicy;
use gnomon_core::Millis;
use gnomon_core::RunState;
use gnomon_records::AttemptChange;
use gnomon_records::Transition;

/// The most ready runs one dispatch pass looks at.
const MAX_DISPATCH_SCAN: usize = 8192;
/// A worker's prefetch queue stays open only while none of the attempts
/// it holds was assigned longer ago than this (a slot is not stuck on a
/// slow run).
const PREFETCH_MAX_AGE_MS: Millis = 1_000;

/// Assignments chosen by a dispatch pass, not yet persisted.
#[derive(Default)]
pub struct DispatchPlan {
    pub batch: Vec<Transition>,
    /// The worker of each assignment in `batch`.
    pub targets: Vec<String>,
    /// Runs whose job was deleted: cancelled.
    pub dropped: Vec<Transition>,
}

impl Engine {
    /// The workers a job may run on, sorted by id, as routing candidates.
    pub fn candidates_for(&self, job: &JobEntry) -> Vec<Candidate<'_>> {
        let (kind, handler) = match job.executor.as_ref() {
            Executor::Shell(_) => ("shell", None),
            Executor::Http(_) => ("http", None),
            Executor::Handler(h) => ("handler", Some(h.name.as_str())),
        };
        // A run known to be slow never waits in a queue: it stays pending
        // until a slot frees on any worker.
        let job_is_slow = job.recent_ms.is_some_and(|m| m > PREFETCH_SHORT_MS);
        let mut out: Vec<Candidate<'_>> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.takes_work() && s.executors.contains(kind))
            .filter(|(_, s)| handler.is_none_or(|h| s.handlers.contains(h)))
            .filter(|(_, s)| s.serves(&job.record.key.namespace))
            .filter(|(_, s)| job.route.as_ref().is_none_or(|r| r.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v))))
            .map(|(id, s)| {
                let queue = if job_is_slow { 0 } else { s.queue_open };
                Candidate { limit: s.capacity + queue, ..Candidate::new(id.as_str(), self.cache.runs.held_by(id), s.capacity) }
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(b.id));
        out
    }

    pub fn free_slots(&self) -> usize {
        self.room(false)
    }

    /// Free slots plus the prefetch queues dispatch may fill now.
    pub fn dispatch_room(&self) -> usize {
        self.room(true)
    }

    /// What the connected, non-draining workers can take: free slots, and
    /// with `queues` the open part of their prefetch queues.
    pub fn room(&self, queues: bool) -> usize {
        self.sessions.room(queues, &self.cache.runs)
    }

    /// Opens a worker's prefetch queue only while its attempts are short on
    /// average and none it holds is old, and only as deep as lets a queued
    /// run start within about [`PREFETCH_SHORT_MS`]: `capacity` slots
    /// working through attempts of the recent average length empty a queue
    /// of `capacity × PREFETCH_SHORT_MS / average` in that time (runs of a
    /// few milliseconds get the worker's whole `prefetch`). Otherwise runs
    /// wait in `pending`, where whichever worker frees a slot first takes
    /// them. Backpressure above green halves the part of the queue it may
    /// fill.
    pub fn update_prefetch(&mut self, now: Millis) {
        let runs = &self.cache.runs;
        let pressure = self.admission.pressure();
        self.sessions.open_queues(
            runs,
            |id| runs.get(id).is_some_and(|r| now - r.assigned_at <= PREFETCH_MAX_AGE_MS),
            |s, avg| pressure.queue_allowance(s.prefetch.min(queue_depth(s.capacity, avg))),
        );
    }

    /// Picks workers for ready runs and reserves their slots; the caller
    /// persists the plan, then sends what applied (the runtime's `finish_dispatch`).
    pub fn prepare_dispatch(&mut self, now: Millis) -> DispatchPlan {
        self.update_prefetch(now);
        let mut free = self.dispatch_room();
        let mut batch: Vec<Transition> = Vec::new();
        let mut targets: Vec<String> = Vec::new();
        let mut batch_jobs: HashSet<String> = HashSet::default();
        let mut deferred = Vec::new();
        let mut dropped = Vec::new();
        let mut scanned = 0;
        // Each namespace with ready runs may spend its share of the scan on
        // runs that find no place (no eligible worker, overlap); past it, it
        // is passed over for the rest of the pass, so it cannot spend the
        // scan the others' runs need. Alone, it has the whole scan.
        let mut missed: HashMap<String, usize> = HashMap::default();
        let share = MAX_DISPATCH_SCAN / self.cache.runs.ready_namespaces().max(1);
        if free == 0 {
            // Nothing can be placed: say why for the runs at the front.
            let mut reasons = Vec::new();
            for id in self.cache.runs.ready().take(16) {
                let Some(run) = self.cache.runs.get(id) else { continue };
                let Some(job) = self.cache.jobs.get(&run.key.uid) else { continue };
                let strategy = job.route.as_ref().map(|r| r.strategy).unwrap_or_default();
                reasons.push((run.key.uid.clone(), waiting_reason(job, strategy, self.candidates_for(job).is_empty())));
            }
            for (job_uid, why) in reasons {
                self.notes.waiting(job_uid, why);
            }
        }
        while free > 0 && scanned < MAX_DISPATCH_SCAN {
            let Some(id) = self.cache.runs.pop_ready(|ns| missed.get(ns).is_some_and(|n| *n >= share)) else { break };
            scanned += 1;
            let Some(run) = self.cache.runs.get(&id) else { continue };
            if run.state != RunState::Pending || self.cache.runs.holder(&id).is_some() {
                continue;
            }
            let Some(job) = self.cache.jobs.get(&run.key.uid) else {
                // Its job was deleted: it can never run.
                dropped.push(Transition {
                    run_id: id.to_string(),
                    from: RunState::Pending,
                    from_attempt: run.attempt,
                    to: RunState::Cancelled,
                    to_attempt: run.attempt,
                    reason: Some("its job was deleted before it ran".into()),
                    next_attempt_at: None,
                    attempt: None,
                    at: now,
                    notify: Vec::new(),
                });
                continue;
            };
            // forbid / buffer_one / replace: a waiting run starts only after the active one ends.
            if matches!(job.overlap, OverlapPolicy::Forbid | OverlapPolicy::BufferOne | OverlapPolicy::Replace) {
                let (_, _, active) = self.cache.runs.job_counts(&run.key.uid);
                if active > 0 || batch_jobs.contains(&run.key.uid) {
                    *missed.entry(run.key.namespace.clone()).or_default() += 1;
                    deferred.push(id);
                    continue;
                }
            }
            let strategy = job.route.as_ref().map(|r| r.strategy).unwrap_or_default();
            let candidates = self.candidates_for(job);
            let mut rr = self.sessions.round_robin();
            let Some(i) = pick_worker(strategy, &run.key.name, &candidates, &mut rr) else {
                let why = waiting_reason(job, strategy, candidates.is_empty());
                self.notes.waiting(run.key.uid.clone(), why);
                *missed.entry(run.key.namespace.clone()).or_default() += 1;
                deferred.push(id);
                continue;
            };
            let worker = candidates[i].id.to_string();
            drop(candidates);
            let job_uid = run.key.uid.clone();
            self.notes.placed(&job_uid);
            let Some(run) = self.cache.runs.get(&id) else { continue };
            self.sessions.set_round_robin(rr);
            let attempt = run.attempt + 1;
            let job_uid = run.key.uid.clone();
            batch_jobs.insert(job_uid);
            // Reserve the slot now so the rest of this pass sees it taken.
            self.cache.runs.hold(id.clone(), &worker);
            free -= 1;
            batch.push(Transition {
                run_id: id.to_string(),
                from: RunState::Pending,
                from_attempt: attempt - 1,
                to: RunState::Assigned,
                to_attempt: attempt,
                reason: None,
                next_attempt_at: None,
                attempt: Some(AttemptChange::Assign { attempt, worker: worker.clone(), token: self.fence.token }),
                at: now,
                notify: Vec::new(),
            });
            targets.push(worker);
        }
        self.cache.runs.requeue_front(deferred);
        DispatchPlan { batch, targets, dropped }
    }

    pub fn ready_has_dispatchable(&self) -> bool {
        self.cache.runs.ready().take(64).any(|id| {
            self.cache.runs.get(id).is_some_and(|r| {
                r.state == RunState::Pending
                    && self.cache.jobs.get(&r.key.uid).is_none_or(|j| {
                        (j.overlap == OverlapPolicy::Allow || self.cache.runs.job_counts(&r.key.uid).2 == 0)
                            && self.candidates_for(j).iter().any(|c| c.has_room())
                    })
            })
        })
    }
}

/// The queue a worker of `capacity` slots empties within about
/// [`PREFETCH_SHORT_MS`] when its attempts take `avg_ms` each (durations are
/// whole milliseconds, so anything shorter counts as 1 ms).
pub fn queue_depth(capacity: usize, avg_ms: f64) -> usize {
    let depth = capacity as f64 * PREFETCH_SHORT_MS / avg_ms.max(1.0);
    depth.min(usize::MAX as f64) as usize
}

/// Why a run of `job` cannot be placed on any worker now.
pub fn waiting_reason(job: &JobEntry, strategy: gnomon_core::spec::RouteStrategy, no_candidates: bool) -> String {
    if no_candidates {
        let needs = match job.executor.as_ref() {
            Executor::Shell(_) => "the shell executor".to_string(),
            Executor::Http(_) => "the http executor".to_string(),
            Executor::Handler(h) => format!("handler {:?}", h.name),
        };
        let labels = job.route.as_ref().filter(|r| !r.labels.is_empty()).map(|r| format!(" and labels {:?}", r.labels));
        format!(
            "no connected worker offers {needs}{} to namespace {:?} (a worker credential limited to namespaces takes only theirs)",
            labels.unwrap_or_default(),
            job.record.key.namespace
        )
    } else if strategy == gnomon_core::spec::RouteStrategy::ConsistentHash {
        "its consistent-hash worker is at capacity".to_string()
    } else {
        "every eligible worker is at capacity".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_is_as_deep_as_its_slots_empty_in_about_100_ms() {
        assert_eq!(queue_depth(4, 50.0), 8);
        assert_eq!(queue_depth(4, 100.0), 4, "at the gate: one run per slot");
        assert_eq!(queue_depth(1, 99.0), 1);
        assert_eq!(queue_depth(256, 0.0), 25_600, "sub-millisecond runs count as 1 ms");
        assert_eq!(queue_depth(50, 0.4), 5_000);
    }
}
