use super::*;

use gnomon_engine::plan::FirePlan;

impl LeaderRuntime {
    /// Takes in a job's stored record (see [`JobTimeline::upsert`]).
    pub(super) fn upsert_job(&mut self, record: JobRecord) {
        self.engine.cache.jobs.upsert_record(record, self.engine.now);
    }

    /// The job's shared key (see [`JobTimeline::key`]).
    pub(super) fn job_key(&self, uid: &str, name: &str, namespace: &str) -> Arc<JobKey> {
        self.engine.cache.jobs.key(uid, name, namespace)
    }

    /// Loads the jobs into the cache being rebuilt. A job held before at
    /// its stored version keeps its entry (compiled schedule, timeline)
    /// with the stored last fire: what [`Self::upsert_job`] would make of
    /// the same record, without reading and compiling its spec again. The
    /// others are read whole. A job no longer stored is dropped.
    pub(super) async fn reload_jobs(&mut self) -> Result<()> {
        let heads = self.store.job_heads().await?;
        let mut others = Vec::new();
        for head in heads.heads {
            match self.engine.cache.jobs.take_earlier(&head.uid) {
                Some(entry) if entry.record.version == head.version => {
                    self.engine.cache.jobs.reseat(entry, head.last_scheduled_at, self.engine.now);
                }
                Some(entry) => {
                    self.engine.cache.jobs.keep_earlier(head.uid.clone(), entry);
                    others.push(head.uid);
                }
                None => others.push(head.uid),
            }
        }
        if !others.is_empty() {
            for job in self.store.jobs_by_uid(&others).await? {
                self.upsert_job(job);
            }
        }
        self.engine.cache.jobs.set_feed_seq(heads.seq);
        Ok(())
    }

    /// The size of a fire chunk that goes out with dispatch in the same
    /// turn (about what this turn can assign: the free room, plus the slots
    /// the results waiting to be written free, less the runs already
    /// pending), or `None` when a burst should be fired in full chunks back
    /// to back: no worker is connected, or the pending runs already
    /// outnumber what the workers can take at once (their slots plus
    /// prefetch queues).
    pub(super) fn interleaved_fire_chunk(&self) -> Option<usize> {
        let absorb = self.engine.sessions.absorb();
        (absorb > 0 && self.engine.cache.runs.ready_len() < absorb).then(|| {
            let room = (self.engine.dispatch_room() + self.inbox.reports().len()).saturating_sub(self.engine.cache.runs.ready_len());
            room.clamp(MIN_INTERLEAVED_FIRE, MAX_FIRE_BATCH)
        })
    }

    /// Takes up to one chunk of due jobs off the timer heap and plans their
    /// runs into the turn. The chunk's
    /// pending runs are tracked ahead of the write, so this turn's dispatch
    /// may place them; should the write fail, the cache is rebuilt.
    pub(super) fn plan_fire(&mut self, now: Millis, turn: &mut super::plan::TurnPlan) {
        let limit = self.interleaved_fire_chunk().unwrap_or(MAX_FIRE_BATCH);
        let admission = &self.engine.admission;
        let due_jobs = self.engine.cache.jobs.take_due(now, limit, |ns| admission.defers(ns));
        if due_jobs.is_empty() {
            return;
        }
        let mut new_runs = Vec::new();
        let mut advances = Vec::new();
        let mut replace_cancels = Vec::new();
        let mut plans = Vec::new();
        for uid in &due_jobs {
            let Some(entry) = self.engine.cache.jobs.get(uid) else { continue };
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
                grace_ms: self.engine.config.misfire_grace_ms,
                // What a previous version left due fires at once.
                jittered: entry.carry.is_none(),
            });
            let (mut open, mut waiting, _) = self.engine.cache.runs.job_counts(uid);
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
        let stamp = self.engine.now;
        for run in &mut new_runs {
            run.fired_at = stamp;
        }
        let mut tracked = Vec::new();
        for run in &new_runs {
            if run.state == RunState::Pending && !self.engine.cache.runs.contains(run.id().as_str()) {
                tracked.push(self.track_pending(run.clone(), now));
            }
        }
        turn.fire = Some(FirePlan { new_runs, advances, plans, now, stamp, tracked, replace });
    }

    /// The fire is committed: track its new pending runs and schedule each
    /// job's next fire. A run that already existed is a surprise (a write
    /// whose outcome was unknown did land, or another writer fired): the
    /// store's copy is the truth, so the answer is an error and the caller
    /// rebuilds the cache from the store.
    pub(super) fn finish_fire(&mut self, plan: FirePlan, outcomes: Vec<FireOutcome>) -> Result<()> {
        let FirePlan { new_runs, plans, now, stamp, tracked, replace, .. } = plan;
        self.engine.cache.runs.replace_later(replace);
        let tracked: HashSet<RunId> = tracked.into_iter().collect();
        // Metrics only (no decision reads it): when the commit came back.
        let committed = self.clock.now_millis();
        metrics::histogram!("gnomon_store_fire_seconds").record((committed - stamp).max(0) as f64 / 1000.0);
        // Metric handles looked up once per chunk, not once per run.
        let lateness = metrics::histogram!("gnomon_fire_lateness_seconds");
        let mut created: HashMap<&'static str, u64> = HashMap::default();
        let mut existed = None;
        for (run, outcome) in new_runs.into_iter().zip(outcomes) {
            if outcome != FireOutcome::Created {
                // A dependency run is made by every upstream run of its
                // instant (a fan-in): the first one made it.
                if run.upstream.is_none() {
                    existed.get_or_insert(run.id());
                }
                continue;
            }
            *created.entry(run.state.as_str()).or_default() += 1;
            if run.state == RunState::Pending {
                // Lateness up to the commit (when the run became durable),
                // from the instant's fire time (its jitter included).
                let due = match self.engine.cache.jobs.get(&run.job_uid) {
                    Some(entry) if !run.manual && run.upstream.is_none() => entry.schedule.fire_at(run.scheduled_at),
                    _ => run.scheduled_at,
                };
                lateness.record((committed - due).max(0) as f64 / 1000.0);
                if !tracked.contains(run.id().as_str()) {
                    self.track_pending(run, now);
                }
            } else {
                self.track_new(run, now);
            }
        }
        for (state, n) in created {
            metrics::counter!("gnomon_runs_total", "state" => state).increment(n);
        }
        for (uid, last, more, carried) in plans {
            self.engine.cache.jobs.fired(&uid, last, more, carried, now);
        }
        match existed {
            None => Ok(()),
            Some(id) => Err(StoreError::Backend(format!("run {id} existed before this leader fired it; reloading from the store"))),
        }
    }

    /// The dependency runs that `roots` (runs of one write) make, less those
    /// already open here or made by an earlier root (`seen`).
    pub(super) fn dependency_runs(&self, roots: &[NewRun], now: Millis, seen: &mut HashSet<String>) -> Vec<NewRun> {
        let mut out = Vec::new();
        if self.engine.cache.jobs.has_no_edges() {
            return out;
        }
        for root in roots {
            let id = root.id();
            for run in self.engine.cache.jobs.closure(&root.job_uid, root.scheduled_at, &id, root.params.as_deref(), now) {
                let dep = run.id();
                if !self.engine.cache.runs.contains(&dep) && seen.insert(dep) {
                    out.push(run);
                }
            }
        }
        out
    }

    /// Tracks the dependency runs a trigger's write created.
    pub(super) fn track_dependency_runs(&mut self, runs: Vec<NewRun>, outcomes: Vec<FireOutcome>, now: Millis) {
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
    pub(super) fn plan_cancels(&mut self, now: Millis, plan: &mut super::plan::TurnPlan) {
        for (job_uid, before) in self.engine.cache.runs.take_replace_due() {
            for id in self.engine.cache.runs.of_job(&job_uid) {
                let Some(run) = self.engine.cache.runs.get(&id).filter(|r| r.scheduled_at < before) else { continue };
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
