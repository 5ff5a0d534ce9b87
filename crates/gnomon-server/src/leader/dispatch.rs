use super::*;

/// Assignments chosen by a dispatch pass, not yet persisted.
#[derive(Default)]
pub(super) struct DispatchPlan {
    pub(super) batch: Vec<Transition>,
    /// The worker of each assignment in `batch`.
    pub(super) targets: Vec<String>,
    /// Runs whose job was deleted: cancelled.
    pub(super) dropped: Vec<Transition>,
}

impl LeaderRuntime {
    /// The workers a job may run on, sorted by id, as routing candidates.
    pub(super) fn candidates_for(&self, job: &JobEntry) -> Vec<Candidate<'_>> {
        let (kind, handler) = match job.executor.as_ref() {
            Executor::Shell(_) => ("shell", None),
            Executor::Http(_) => ("http", None),
            Executor::Handler(h) => ("handler", Some(h.name.as_str())),
        };
        // A run known to be slow never waits in a queue: it stays pending
        // until a slot frees on any worker.
        let job_is_slow = job.recent_ms.is_some_and(|m| m > PREFETCH_SHORT_MS);
        let mut out: Vec<Candidate<'_>> = self
            .engine
            .sessions
            .iter()
            .filter(|(_, s)| s.takes_work() && s.executors.contains(kind))
            .filter(|(_, s)| handler.is_none_or(|h| s.handlers.contains(h)))
            .filter(|(_, s)| s.serves(&job.record.key.namespace))
            .filter(|(_, s)| job.route.as_ref().is_none_or(|r| r.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v))))
            .map(|(id, s)| {
                let queue = if job_is_slow { 0 } else { s.queue_open };
                Candidate { limit: s.capacity + queue, ..Candidate::new(id.as_str(), self.engine.cache.runs.held_by(id), s.capacity) }
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(b.id));
        out
    }

    pub(super) fn free_slots(&self) -> usize {
        self.room(false)
    }

    /// Free slots plus the prefetch queues dispatch may fill now.
    pub(super) fn dispatch_room(&self) -> usize {
        self.room(true)
    }

    /// What the connected, non-draining workers can take: free slots, and
    /// with `queues` the open part of their prefetch queues.
    pub(super) fn room(&self, queues: bool) -> usize {
        self.engine.sessions.room(queues, &self.engine.cache.runs)
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
    pub(super) fn update_prefetch(&mut self, now: Millis) {
        let runs = &self.engine.cache.runs;
        let pressure = self.engine.admission.pressure();
        self.engine.sessions.open_queues(
            runs,
            |id| runs.get(id).is_some_and(|r| now - r.assigned_at <= PREFETCH_MAX_AGE_MS),
            |s, avg| pressure.queue_allowance(s.prefetch.min(queue_depth(s.capacity, avg))),
        );
    }

    /// Picks workers for ready runs and reserves their slots; the caller
    /// persists the plan, then [`Self::finish_dispatch`] sends it.
    pub(super) fn prepare_dispatch(&mut self, now: Millis) -> DispatchPlan {
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
        let share = MAX_DISPATCH_SCAN / self.engine.cache.runs.ready_namespaces().max(1);
        if free == 0 {
            // Nothing can be placed: say why for the runs at the front.
            let mut reasons = Vec::new();
            for id in self.engine.cache.runs.ready().take(16) {
                let Some(run) = self.engine.cache.runs.get(id) else { continue };
                let Some(job) = self.engine.cache.jobs.get(&run.key.uid) else { continue };
                let strategy = job.route.as_ref().map(|r| r.strategy).unwrap_or_default();
                reasons.push((run.key.uid.clone(), waiting_reason(job, strategy, self.candidates_for(job).is_empty())));
            }
            for (job_uid, why) in reasons {
                self.engine.notes.waiting(job_uid, why);
            }
        }
        while free > 0 && scanned < MAX_DISPATCH_SCAN {
            let Some(id) = self.engine.cache.runs.pop_ready(|ns| missed.get(ns).is_some_and(|n| *n >= share)) else { break };
            scanned += 1;
            let Some(run) = self.engine.cache.runs.get(&id) else { continue };
            if run.state != RunState::Pending || self.engine.cache.runs.holder(&id).is_some() {
                continue;
            }
            let Some(job) = self.engine.cache.jobs.get(&run.key.uid) else {
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
                let (_, _, active) = self.engine.cache.runs.job_counts(&run.key.uid);
                if active > 0 || batch_jobs.contains(&run.key.uid) {
                    *missed.entry(run.key.namespace.clone()).or_default() += 1;
                    deferred.push(id);
                    continue;
                }
            }
            let strategy = job.route.as_ref().map(|r| r.strategy).unwrap_or_default();
            let candidates = self.candidates_for(job);
            let mut rr = self.engine.sessions.round_robin();
            let Some(i) = pick_worker(strategy, &run.key.name, &candidates, &mut rr) else {
                let why = waiting_reason(job, strategy, candidates.is_empty());
                self.engine.notes.waiting(run.key.uid.clone(), why);
                *missed.entry(run.key.namespace.clone()).or_default() += 1;
                deferred.push(id);
                continue;
            };
            let worker = candidates[i].id.to_string();
            drop(candidates);
            let job_uid = run.key.uid.clone();
            self.engine.notes.placed(&job_uid);
            let Some(run) = self.engine.cache.runs.get(&id) else { continue };
            self.engine.sessions.set_round_robin(rr);
            let attempt = run.attempt + 1;
            let job_uid = run.key.uid.clone();
            batch_jobs.insert(job_uid);
            // Reserve the slot now so the rest of this pass sees it taken.
            self.engine.cache.runs.hold(id.clone(), &worker);
            free -= 1;
            batch.push(Transition {
                run_id: id.to_string(),
                from: RunState::Pending,
                from_attempt: attempt - 1,
                to: RunState::Assigned,
                to_attempt: attempt,
                reason: None,
                next_attempt_at: None,
                attempt: Some(AttemptChange::Assign { attempt, worker: worker.clone(), token: self.engine.fence.token }),
                at: now,
                notify: Vec::new(),
            });
            targets.push(worker);
        }
        self.engine.cache.runs.requeue_front(deferred);
        DispatchPlan { batch, targets, dropped }
    }

    /// The assignments are persisted: send them.
    pub(super) async fn finish_dispatch(&mut self, plan: DispatchPlan, applied: Vec<bool>, now: Millis) -> Result<()> {
        let DispatchPlan { batch, targets, .. } = plan;
        if batch.is_empty() {
            return Ok(());
        }
        self.engine.notes.touch();
        let (assigned, latency) =
            (metrics::counter!("gnomon_runs_total", "state" => "assigned"), metrics::histogram!("gnomon_dispatch_latency_seconds"));
        for ((t, ok), worker) in batch.into_iter().zip(applied).zip(targets) {
            if !ok {
                self.release(&t.run_id);
                self.reload_run(&t.run_id).await?;
                continue;
            }
            assigned.increment(1);
            let Some(run) = self.engine.cache.runs.assigned(&t.run_id, t.to_attempt, t.at) else { continue };
            latency.record((now - run.ready_since).max(0) as f64 / 1000.0);
            let Some(job) = self.engine.cache.jobs.get(&run.key.uid) else { continue };
            let assign = v1::Assign {
                run_id: t.run_id.clone(),
                attempt: t.to_attempt,
                token: self.engine.fence.token,
                job: run.key.name.clone(),
                namespace: run.key.namespace.clone(),
                scheduled_at_ms: run.scheduled_at,
                executor_json: job.executor_json.to_string(),
                timeout_ms: job.timeout.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0),
                idempotency_key: t.run_id.clone(),
                params_json: run.params.as_deref().unwrap_or_default().to_string(),
                payload: run.payload.as_deref().unwrap_or_default().to_string(),
            };
            if !self.send_to(&worker, server_message::Msg::Assign(assign)) {
                tracing::warn!(worker = %worker, run = %t.run_id, "assignment persisted but not deliverable; its lease decides");
            }
        }
        Ok(())
    }

    pub(super) fn ready_has_dispatchable(&self) -> bool {
        self.engine.cache.runs.ready().take(64).any(|id| {
            self.engine.cache.runs.get(id).is_some_and(|r| {
                r.state == RunState::Pending
                    && self.engine.cache.jobs.get(&r.key.uid).is_none_or(|j| {
                        (j.overlap == OverlapPolicy::Allow || self.engine.cache.runs.job_counts(&r.key.uid).2 == 0)
                            && self.candidates_for(j).iter().any(|c| c.has_room())
                    })
            })
        })
    }
}

/// The queue a worker of `capacity` slots empties within about
/// [`PREFETCH_SHORT_MS`] when its attempts take `avg_ms` each (durations are
/// whole milliseconds, so anything shorter counts as 1 ms).
pub(super) fn queue_depth(capacity: usize, avg_ms: f64) -> usize {
    let depth = capacity as f64 * PREFETCH_SHORT_MS / avg_ms.max(1.0);
    depth.min(usize::MAX as f64) as usize
}

/// Why a run of `job` cannot be placed on any worker now.
pub(super) fn waiting_reason(job: &JobEntry, strategy: gnomon_core::spec::RouteStrategy, no_candidates: bool) -> String {
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
