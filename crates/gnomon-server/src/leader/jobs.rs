use super::*;

/// What the leader keeps of a job's stored record: its metadata, not its spec.
#[derive(Debug, Clone)]
pub(super) struct JobMeta {
    /// uid, name and namespace, shared with every open run of the job.
    pub(super) key: Arc<JobKey>,
    pub(super) version: u64,
    pub(super) paused: bool,
    pub(super) last_scheduled_at: Option<Millis>,
}

/// What the leader keeps of a job: only what scheduling and dispatch read,
/// not the whole spec (descriptions, the original strings). Entries are
/// boxed so the map's table stays small. With 100,000 jobs this is the bulk
/// of the leader's memory, about 400 bytes a job.
#[derive(Debug)]
pub(super) struct JobEntry {
    pub(super) record: JobMeta,
    pub(super) schedule: Schedule,
    pub(super) executor: Arc<Executor>,
    /// The executor as the `Assign` message carries it, serialised once.
    pub(super) executor_json: Arc<str>,
    pub(super) timeout: Option<Duration>,
    pub(super) max_attempts: u32,
    pub(super) backoff: BackoffPolicy,
    pub(super) catchup_window_ms: i64,
    pub(super) overlap: OverlapPolicy,
    pub(super) misfire: MisfirePolicy,
    pub(super) route: Option<Box<RouteSpec>>,
    pub(super) generation: u64,
    /// Moving average of its attempts' durations (ms), once one has ended.
    pub(super) recent_ms: Option<f64>,
    /// The first `scheduled_at` free for its next manual run.
    pub(super) manual_next: Millis,
    /// Identifies the schedule as written (a change of it is a new version
    /// of the timeline).
    pub(super) schedule_key: u64,
    /// Where this version's timeline starts: instants after it and after
    /// `last_scheduled_at` are due.
    pub(super) from: Millis,
    /// Instants the previous version had due when it was changed, still
    /// to be fired under it (see [`LeaderRuntime::upsert_job`]).
    pub(super) carry: Option<Box<Carry>>,
    /// `from` moved past `last_scheduled_at` (a new schedule, a resume) and
    /// is not yet written: the next fire writes it as the job's
    /// `last_scheduled_at`, so a new leader starts there too.
    pub(super) settle: bool,
    /// Who is told of its runs' outcomes.
    pub(super) notify: Option<Box<[super::notify::Target]>>,
}

/// The previous version's timeline up to the change.
#[derive(Debug, Clone)]
pub(super) struct Carry {
    pub(super) schedule: Schedule,
    /// Its instants after this (and after `last_scheduled_at`)…
    pub(super) after: Millis,
    /// …and up to this are fired under the previous version.
    pub(super) until: Millis,
}

fn schedule_key(s: &gnomon_core::spec::ScheduleSpec) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&s.cron, &s.timezone, &s.every, &s.at).hash(&mut h);
    h.finish()
}

/// A job's identity, shared (not copied) by its entry and its open runs.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct JobKey {
    pub(super) uid: String,
    pub(super) name: String,
    pub(super) namespace: String,
}

/// One chunk of due jobs, planned and not yet written.
pub(super) struct FirePlan {
    pub(super) new_runs: Vec<NewRun>,
    pub(super) advances: Vec<JobAdvance>,
    /// Per job: (uid, last scheduled time fired, more due, the previous
    /// version's instants).
    pub(super) plans: Vec<(String, Option<Millis>, bool, bool)>,
    /// A full chunk: more jobs may be due.
    pub(super) full: bool,
    pub(super) now: Millis,
    /// When the write began (each run's `fired_at`).
    pub(super) stamp: Millis,
    /// Pending runs tracked ahead of the write.
    pub(super) tracked: Vec<RunId>,
    /// `replace` jobs whose runs before the given instant are cancelled
    /// once this fire is written.
    pub(super) replace: Vec<(String, Millis)>,
}

impl LeaderRuntime {
    pub(super) fn upsert_job(&mut self, record: JobRecord) {
        let compiled = match record.spec.compile() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(job = %record.name, error = %e, "stored job no longer validates; not scheduling it");
                self.cache.jobs.remove(&record.uid);
                return;
            }
        };
        self.cache.next_generation += 1;
        let generation = self.cache.next_generation;
        // What the previous version learned carries over (from the cache
        // being rebuilt, during a rebuild).
        let previous = self.cache.jobs.get(&record.uid).or_else(|| self.previous_jobs.get(&record.uid));
        let previous_last = previous.and_then(|j| j.record.last_scheduled_at);
        let recent_ms = previous.and_then(|j| j.recent_ms);
        let manual_next = previous.map_or(0, |j| j.manual_next);
        let key = schedule_key(&compiled.spec.schedule);
        // A change takes effect when it was written, by the writer's clock,
        // but never later than this leader's now (a writer whose clock runs
        // ahead cannot drop instants that are not due yet).
        let cut = record.updated_at.min(self.clock.now_millis());
        let last = record.last_scheduled_at.max(previous_last);
        let (from, carry, settle) = match previous {
            Some(p) if p.schedule_key == key && p.record.paused == record.paused => (p.from, p.carry.clone(), p.settle),
            Some(p) => {
                // The schedule changed, or the job was paused or resumed.
                // A new schedule, or a resumed job, starts at the change
                // (times that elapsed while paused are not fired); what the
                // previous version had due up to the change still fires
                // under it (a turn a few milliseconds late loses nothing).
                let from = if p.schedule_key != key || (p.record.paused && !record.paused) { cut } else { p.from };
                // A job resumed (or changed) while paused keeps what its
                // pause left to fire: the times due before the pause.
                let carry = if p.record.paused {
                    p.carry.clone()
                } else {
                    Some(Box::new(Carry { schedule: p.schedule.clone(), after: p.from, until: cut }))
                };
                (from, carry, p.settle || from > last.unwrap_or(Millis::MIN))
            }
            // Not in memory (a new term, or the first sight of a job). A
            // first version starts at its creation. A paused job still fires
            // what was due before its pause, and a resumed one starts at its
            // resumption (both recorded by the store), so a leader that
            // never saw the pause or the resume fires the same as one that
            // did; a changed schedule likewise (the store keeps the previous
            // one). Otherwise the schedule is the one the job was created
            // with: its timeline runs from its creation (and resumes at its
            // last fire), whatever other edits were made.
            None => {
                let now = self.clock.now_millis();
                let created = record.created_at;
                let base = last.unwrap_or(created);
                let before_pause =
                    |until: Millis| Box::new(Carry { schedule: compiled.schedule.clone(), after: created, until: until.min(now) });
                if record.paused {
                    let until = record.paused_at.unwrap_or(cut);
                    // Paused again after a resume: only the times between
                    // the resume and this pause were due while active (the
                    // ones before the resume fell in the earlier pause).
                    match record.resumed_at.filter(|r| *r > base && *r <= until) {
                        Some(resumed) => (
                            created,
                            Some(Box::new(Carry { schedule: compiled.schedule.clone(), after: resumed, until: until.min(now) })),
                            false,
                        ),
                        None => (created, (until > base).then(|| before_pause(until)), false),
                    }
                } else if let Some(resumed) = record.resumed_at.filter(|r| *r > base) {
                    let paused = record.paused_at.filter(|p| *p > base && *p <= resumed);
                    (resumed.min(now), paused.map(before_pause), true)
                } else if let Some((changed, previous)) =
                    record.schedule_changed_at.filter(|c| *c > base).zip(record.previous_schedule.as_ref().and_then(|s| s.compile().ok()))
                {
                    // The schedule changed after the last fire: the old one's
                    // due times up to the change fire under it, the new one
                    // starts at the change (as a leader that saw it does).
                    (changed.min(now), Some(Box::new(Carry { schedule: previous, after: created, until: changed.min(now) })), true)
                } else {
                    (created, None, false)
                }
            }
        };
        let record = JobMeta {
            last_scheduled_at: last,
            key: Arc::new(JobKey { uid: record.uid, name: record.name, namespace: record.namespace }),
            version: record.version,
            paused: record.paused,
        };
        let entry = Box::new(JobEntry {
            record,
            schedule: compiled.schedule,
            executor_json: serde_json::to_string(&compiled.spec.executor).unwrap_or_default().into(),
            executor: Arc::new(compiled.spec.executor),
            timeout: compiled.timeout,
            max_attempts: compiled.max_attempts,
            backoff: compiled.backoff,
            catchup_window_ms: compiled.catchup_window_ms,
            overlap: compiled.spec.overlap,
            misfire: compiled.spec.misfire,
            route: compiled.spec.route.map(Box::new),
            notify: super::notify::targets(&compiled.spec.notify),
            generation,
            recent_ms,
            manual_next,
            schedule_key: key,
            from,
            carry,
            settle,
        });
        self.seat(entry);
    }

    /// Puts a job's entry in the cache and its next due time on the timer.
    fn seat(&mut self, entry: Box<JobEntry>) {
        let generation = entry.generation;
        let due = if entry.carry.is_some() || (entry.settle && !entry.record.paused) {
            Some(self.clock.now_millis())
        } else if !entry.record.paused {
            entry.schedule.next_after(self.base_of(&entry))
        } else {
            None
        };
        if let Some(due) = due {
            self.cache.fire_heap.push(Reverse((due, entry.record.key.uid.clone(), generation)));
        }
        self.cache.jobs.insert(entry.record.key.uid.clone(), entry);
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
            match self.previous_jobs.remove(&head.uid) {
                Some(mut entry) if entry.record.version == head.version => {
                    self.cache.next_generation += 1;
                    entry.generation = self.cache.next_generation;
                    entry.record.last_scheduled_at = head.last_scheduled_at.max(entry.record.last_scheduled_at);
                    self.seat(entry);
                }
                Some(entry) => {
                    self.previous_jobs.insert(head.uid.clone(), entry);
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
        self.cache.job_feed_seq = heads.seq;
        Ok(())
    }

    /// The time after which a job's schedule is considered: its persisted
    /// `last_scheduled_at`, but never before its timeline starts (`from`:
    /// its creation, or the change of its schedule or its resumption).
    pub(super) fn base_of(&self, entry: &JobEntry) -> Millis {
        entry.record.last_scheduled_at.map_or(entry.from, |last| last.max(entry.from))
    }

    /// The job's shared key (from its entry), or a new one for a run of a
    /// job the leader does not schedule (deleted, or no longer valid).
    pub(super) fn job_key(&self, uid: &str, name: &str, namespace: &str) -> Arc<JobKey> {
        match self.cache.jobs.get(uid) {
            Some(j) => j.record.key.clone(),
            None => Arc::new(JobKey { uid: uid.into(), name: name.into(), namespace: namespace.into() }),
        }
    }

    /// Creates `count` manual runs in one store write. Each gets its own
    /// `scheduled_at` (now, now+1 ms, …, starting past the last instant this
    /// leader gave the job's manual runs, and bumped past any instant the
    /// store already has), so its id stays unique; manual ids never meet a
    /// scheduled fire's.
    pub(super) async fn trigger(&mut self, namespace: &str, name: &str, count: u32) -> Result<Vec<String>> {
        let Some(job) = self.store.get_job(namespace, name).await? else {
            return Err(StoreError::NotFound(format!("job {namespace}/{name}")));
        };
        let now = self.clock.now_millis();
        let mut created: Vec<String> = Vec::new();
        // Back-to-back triggers of many runs would otherwise collide with the
        // previous call's instants and retry their way past them.
        if !self.cache.jobs.contains_key(&job.uid) {
            self.upsert_job(job.clone());
        }
        let mut next = self.cache.jobs.get(&job.uid).map_or(now, |j| j.manual_next.max(now));
        for _ in 0..100 {
            let want = count as usize - created.len();
            if want == 0 {
                break;
            }
            // Consecutive instants, 1 ms apart: a manual run's id is apart
            // from the scheduled runs' (`manual_run_id`), so no schedule,
            // now or after a change, can take one.
            let instants = next..next + want as Millis;
            let runs: Vec<NewRun> = instants
                .clone()
                .map(|at| NewRun {
                    job_uid: job.uid.clone(),
                    namespace: job.namespace.clone(),
                    job: job.name.clone(),
                    scheduled_at: at,
                    fired_at: now,
                    state: RunState::Pending,
                    reason: Some("manual trigger".into()),
                    manual: true,
                })
                .collect();
            next = instants.end;
            let outcomes = self.store.fire(&self.fence, &runs, &[]).await?;
            if let Some(j) = self.cache.jobs.get_mut(&job.uid) {
                j.manual_next = j.manual_next.max(next);
            }
            for (run, outcome) in runs.into_iter().zip(outcomes) {
                if outcome != FireOutcome::Created {
                    continue;
                }
                metrics::counter!("gnomon_runs_total", "state" => "pending").increment(1);
                created.push(self.track_pending(run, now).to_string());
            }
        }
        if created.len() < count as usize {
            return Err(StoreError::Backend("could not find free scheduled_at instants for the manual runs".into()));
        }
        Ok(created)
    }

    /// The size of a fire chunk that goes out with dispatch in the same
    /// turn (about what this turn can assign: the free room, plus the slots
    /// the results waiting to be written free, less the runs already
    /// pending), or `None` when a burst should be fired in full chunks back
    /// to back: no worker is connected, or the pending runs already
    /// outnumber what the workers can take at once (their slots plus
    /// prefetch queues).
    pub(super) fn interleaved_fire_chunk(&self) -> Option<usize> {
        let absorb = self.sessions.absorb();
        (absorb > 0 && self.cache.runs.ready_len() < absorb).then(|| {
            let room = (self.dispatch_room() + self.unwritten_events.len()).saturating_sub(self.cache.runs.ready_len());
            room.clamp(MIN_INTERLEAVED_FIRE, MAX_FIRE_BATCH)
        })
    }

    /// Takes up to `limit` due jobs (one chunk) off the timer heap and plans
    /// their runs (`full` when more may be due); nothing is written except
    /// `replace` cancellations.
    pub(super) async fn plan_fire(&mut self, now: Millis, limit: usize) -> Result<Option<FirePlan>> {
        let mut due_jobs = Vec::new();
        while let Some(Reverse((due, uid, generation))) = self.cache.fire_heap.peek().cloned() {
            if due > now || due_jobs.len() >= limit {
                break;
            }
            self.cache.fire_heap.pop();
            if self.cache.jobs.get(&uid).is_some_and(|j| j.generation == generation && (!j.record.paused || j.carry.is_some())) {
                due_jobs.push(uid);
            }
        }
        if due_jobs.is_empty() {
            return Ok(None);
        }
        let full = due_jobs.len() >= limit;
        let mut new_runs = Vec::new();
        let mut advances = Vec::new();
        let mut replace_cancels = Vec::new();
        let mut plans = Vec::new();
        for uid in &due_jobs {
            let Some(entry) = self.cache.jobs.get(uid) else { continue };
            // The previous version's due instants first, then this one's.
            let (schedule, after, until) = match &entry.carry {
                Some(c) => (&c.schedule, entry.record.last_scheduled_at.map_or(c.after, |l| l.max(c.after)), now.min(c.until)),
                None => (&entry.schedule, self.base_of(entry), now),
            };
            let plan = plan_fires(&PlanInput {
                schedule,
                after,
                now,
                until,
                misfire: entry.misfire,
                catchup_window_ms: entry.catchup_window_ms,
                grace_ms: self.config.misfire_grace_ms,
            });
            let (mut open, mut waiting, _) = self.cache.runs.job_counts(uid);
            for planned in &plan.times {
                let (state, reason) = match &planned.decision {
                    Decision::Skip(reason) => (RunState::Skipped, Some(reason.clone())),
                    Decision::Fire => match decide_overlap(entry.overlap, open, waiting) {
                        OverlapDecision::Fire => (RunState::Pending, None),
                        OverlapDecision::FireAndCancelOpen => {
                            replace_cancels.push((uid.clone(), planned.scheduled_at));
                            (RunState::Pending, Some("overlap: replaced the previous run".into()))
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
                });
            }
            // A timeline that starts at a change is written with the fire.
            let settled = (entry.settle && entry.carry.is_none()).then_some(entry.from);
            let last = plan.last_scheduled_at.max(settled);
            if let Some(last) = last {
                advances.push(JobAdvance { job_uid: uid.clone(), last_scheduled_at: last });
            }
            plans.push((uid.clone(), last, plan.more, entry.carry.is_some()));
        }
        // Replace: what is open is cancelled once the new run is written.
        let replace = replace_cancels;
        // Stamp fired_at as late as possible: when the write begins, not when
        // the turn began (planning a large batch takes time).
        let stamp = self.clock.now_millis();
        for run in &mut new_runs {
            run.fired_at = stamp;
        }
        Ok(Some(FirePlan { new_runs, advances, plans, full, now, stamp, tracked: Vec::new(), replace }))
    }

    /// Writes a fire chunk on its own.
    pub(super) async fn write_fire(&mut self, plan: FirePlan) -> Result<()> {
        let outcomes = self.store.fire(&self.fence, &plan.new_runs, &plan.advances).await?;
        self.finish_fire(plan, outcomes)
    }

    /// The fire is committed: track its new pending runs and schedule each
    /// job's next fire. A run that already existed is a surprise (a write
    /// whose outcome was unknown did land, or another writer fired): the
    /// store's copy is the truth, so the answer is an error and the caller
    /// rebuilds the cache from the store.
    pub(super) fn finish_fire(&mut self, plan: FirePlan, outcomes: Vec<FireOutcome>) -> Result<()> {
        let FirePlan { new_runs, plans, now, stamp, tracked, replace, .. } = plan;
        self.cache.replace_due.extend(replace);
        let tracked: HashSet<RunId> = tracked.into_iter().collect();
        let committed = self.clock.now_millis();
        metrics::histogram!("gnomon_store_fire_seconds").record((committed - stamp).max(0) as f64 / 1000.0);
        // Metric handles looked up once per chunk, not once per run.
        let lateness = metrics::histogram!("gnomon_fire_lateness_seconds");
        let mut created: HashMap<&'static str, u64> = HashMap::default();
        let mut existed = None;
        for (run, outcome) in new_runs.into_iter().zip(outcomes) {
            if outcome != FireOutcome::Created {
                existed.get_or_insert(run.id());
                continue;
            }
            *created.entry(run.state.as_str()).or_default() += 1;
            if run.state == RunState::Pending {
                // Lateness up to the commit: when the run became durable.
                lateness.record((committed - run.scheduled_at).max(0) as f64 / 1000.0);
                if !tracked.contains(run.id().as_str()) {
                    self.track_pending(run, now);
                }
            }
        }
        for (state, n) in created {
            metrics::counter!("gnomon_runs_total", "state" => state).increment(n);
        }
        for (uid, last, more, carried) in plans {
            let Some(entry) = self.cache.jobs.get_mut(&uid) else { continue };
            if let Some(last) = last {
                entry.record.last_scheduled_at = Some(entry.record.last_scheduled_at.map_or(last, |l| l.max(last)));
            }
            if !carried {
                entry.settle = false;
            }
            let generation = entry.generation;
            let next = if more {
                Some(now)
            } else if carried {
                // The previous version is done: plan this one's now.
                entry.carry = None;
                (!entry.record.paused).then_some(now)
            } else {
                entry.schedule.next_after(entry.record.last_scheduled_at.unwrap_or(now).max(now))
            };
            if let Some(next) = next {
                self.cache.fire_heap.push(Reverse((next, uid, generation)));
            }
        }
        match existed {
            None => Ok(()),
            Some(id) => Err(StoreError::Backend(format!("run {id} existed before this leader fired it; reloading from the store"))),
        }
    }

    /// `replace`: cancels the job's open runs scheduled before `before`
    /// (the run that replaces them is written already).
    pub(super) async fn cancel_open_runs_of(&mut self, job_uid: &str, before: Millis, now: Millis) -> Result<()> {
        let ids = self.cache.runs.of_job(job_uid);
        let mut batch = Vec::new();
        for id in ids {
            let Some(run) = self.cache.runs.get(&id).filter(|r| r.scheduled_at < before) else { continue };
            match run.state {
                RunState::Pending | RunState::Retrying => batch.push(Transition {
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
                RunState::Assigned | RunState::Running => {
                    let attempt = run.attempt;
                    self.send_cancel(&id, attempt);
                }
                _ => {}
            }
        }
        self.apply(batch).await
    }
}
