use super::*;

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
    /// Takes in a job's stored record (see [`JobTimeline::upsert`]).
    pub(super) fn upsert_job(&mut self, record: JobRecord) {
        self.cache.jobs.upsert_record(record, self.clock.now_millis());
    }

    /// The job's shared key (see [`JobTimeline::key`]).
    pub(super) fn job_key(&self, uid: &str, name: &str, namespace: &str) -> Arc<JobKey> {
        self.cache.jobs.key(uid, name, namespace)
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
            match self.cache.jobs.take_earlier(&head.uid) {
                Some(entry) if entry.record.version == head.version => {
                    self.cache.jobs.reseat(entry, head.last_scheduled_at, self.clock.now_millis());
                }
                Some(entry) => {
                    self.cache.jobs.keep_earlier(head.uid.clone(), entry);
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
        self.cache.jobs.set_feed_seq(heads.seq);
        Ok(())
    }

    /// Creates the manual runs a trigger asks for, with the params it
    /// sets resolved against the job's declaration as stored now: `count`
    /// runs, or the one its idempotency key names.
    pub(super) async fn trigger(
        &mut self,
        namespace: &str,
        name: &str,
        request: TriggerRequest,
    ) -> std::result::Result<Triggered, TriggerError> {
        let Some(job) = self.store.get_job(namespace, name).await? else {
            return Err(StoreError::NotFound(format!("job {namespace}/{name}")).into());
        };
        // Every job written before this call is in the graph its runs'
        // dependency runs are made from (a downstream job created just
        // before the trigger gets its run).
        self.sync_jobs().await?;
        if request.origin == Origin::Webhook && job.spec.triggers.webhook.is_none() {
            return Err(TriggerError::NoWebhook);
        }
        let params = gnomon_core::params::resolve(&job.spec.params, &request.params).map_err(TriggerError::Params)?;
        let params = params.map(|p| serde_json::to_string(&p).unwrap_or_default());
        let template = ManualRun { origin: request.origin, params, payload: request.payload.clone() };
        match request.key.clone() {
            Some(key) => self.trigger_keyed(job, key, template, &request).await,
            None => Ok(Triggered { ids: self.trigger_many(job, request.count, template).await?, existed: false }),
        }
    }

    /// Creates `count` manual runs in one store write. Each gets its own
    /// `scheduled_at` (now, now+1 ms, …, starting past the last instant this
    /// leader gave the job's manual runs, and bumped past any instant the
    /// store already has), so its id stays unique; manual ids never meet a
    /// scheduled fire's.
    async fn trigger_many(&mut self, job: JobRecord, count: u32, template: ManualRun) -> std::result::Result<Vec<String>, TriggerError> {
        let now = self.clock.now_millis();
        let mut created: Vec<String> = Vec::new();
        // Back-to-back triggers of many runs would otherwise collide with the
        // previous call's instants and retry their way past them.
        let mut next = self.manual_start(&job, now);
        for _ in 0..100 {
            let want = count as usize - created.len();
            if want == 0 {
                break;
            }
            // Consecutive instants, 1 ms apart: a manual run's id is apart
            // from the scheduled runs' (`manual_run_id`), so no schedule,
            // now or after a change, can take one.
            let instants = next..next + want as Millis;
            let runs: Vec<NewRun> = instants.clone().map(|at| template.run(&job, at, now, None)).collect();
            next = instants.end;
            let mut all = runs.clone();
            all.extend(self.dependency_runs(&runs, now, &mut HashSet::default()));
            // Refused whole, before anything of it is written.
            self.admit(&job.namespace, &all, runs.len())?;
            let began = std::time::Instant::now();
            let mut outcomes = self.store.fire(&self.fence, &all, &[]).await?;
            self.stats.wrote(all.len(), began);
            self.cache.jobs.manual_taken(&job.uid, next);
            let dep_outcomes = outcomes.split_off(runs.len().min(outcomes.len()));
            self.track_dependency_runs(all.split_off(runs.len()), dep_outcomes, now);
            for (run, outcome) in runs.into_iter().zip(outcomes) {
                if outcome != FireOutcome::Created {
                    continue;
                }
                metrics::counter!("gnomon_runs_total", "state" => "pending").increment(1);
                created.push(self.track_pending(run, now).to_string());
            }
        }
        if created.len() < count as usize {
            return Err(StoreError::Backend("could not find free scheduled_at instants for the manual runs".into()).into());
        }
        Ok(created)
    }

    /// Creates the manual run that the idempotency key `key` names, unless
    /// it exists: its id comes from (job, key) ([`keyed_run_id`]), and the
    /// store inserts a run by id once, so a repeated call, on this leader or
    /// a later one, finds the run the first call made.
    ///
    /// [`keyed_run_id`]: gnomon_backend::keyed_run_id
    ///
    /// A repeat that sets a param to another value than the run has is
    /// another request under the same key, and is refused.
    async fn trigger_keyed(
        &mut self,
        job: JobRecord,
        key: String,
        template: ManualRun,
        request: &TriggerRequest,
    ) -> std::result::Result<Triggered, TriggerError> {
        let key = stored_key(request.origin, key);
        let id = gnomon_backend::keyed_run_id(&job.uid, &key);
        // What the store holds decides, before anything is planned: a
        // repeat writes nothing, its downstream runs included (they were
        // made with the key's run, at its instant as stored).
        if let Some(stored) = self.store.get_run(&id).await? {
            let run = stored.run;
            // The same key with other values, or with another payload, is
            // another request.
            let other_params = !request.params.is_empty() && !sets_the_same(run.params.as_deref(), &request.params);
            let other_payload = request.payload.is_some() && run.payload != request.payload;
            if other_params || other_payload {
                return Err(TriggerError::KeyReused { id });
            }
            return Ok(Triggered { ids: vec![id], existed: true });
        }
        let now = self.clock.now_millis();
        let at = self.manual_start(&job, now);
        let run = template.run(&job, at, now, Some(key));
        debug_assert_eq!(run.id(), id);
        let mut all = vec![run.clone()];
        all.extend(self.dependency_runs(&all[..1], now, &mut HashSet::default()));
        self.admit(&job.namespace, &all, 1)?;
        let began = std::time::Instant::now();
        let mut outcomes = self.store.fire(&self.fence, &all, &[]).await?;
        self.stats.wrote(all.len(), began);
        self.cache.jobs.manual_taken(&job.uid, at + 1);
        let dep_outcomes = outcomes.split_off(1.min(outcomes.len()));
        self.track_dependency_runs(all.split_off(1), dep_outcomes, now);
        if outcomes.first() != Some(&FireOutcome::Created) {
            // The store held the run after all, though it read as absent
            // under this leader's fence: that is not a store this leader
            // can trust its reads of. Rebuild from it.
            return Err(StoreError::Backend(format!("run {id} was absent when read and present when written")).into());
        }
        metrics::counter!("gnomon_runs_total", "state" => "pending").increment(1);
        self.track_pending(run, now);
        Ok(Triggered { ids: vec![id], existed: false })
    }

    /// The first instant free for a manual run of `job` (now, or past the
    /// last one taken), with the job in the timeline.
    fn manual_start(&mut self, job: &JobRecord, now: Millis) -> Millis {
        if !self.cache.jobs.contains(&job.uid) {
            self.upsert_job(job.clone());
        }
        self.cache.jobs.get(&job.uid).map_or(now, |j| j.manual_next.max(now))
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
            let room = (self.dispatch_room() + self.inbox.reports().len()).saturating_sub(self.cache.runs.ready_len());
            room.clamp(MIN_INTERLEAVED_FIRE, MAX_FIRE_BATCH)
        })
    }

    /// Takes up to `limit` due jobs (one chunk) off the timer heap and plans
    /// their runs (`full` when more may be due); nothing is written except
    /// `replace` cancellations.
    pub(super) async fn plan_fire(&mut self, now: Millis, limit: usize) -> Result<Option<FirePlan>> {
        let admission = &self.admission;
        let due_jobs = self.cache.jobs.take_due(now, limit, |ns| admission.defers(ns));
        if due_jobs.is_empty() {
            return Ok(None);
        }
        let full = due_jobs.len() >= limit;
        let mut new_runs = Vec::new();
        let mut advances = Vec::new();
        let mut replace_cancels = Vec::new();
        let mut plans = Vec::new();
        let mut dependency_ids: HashSet<String> = HashSet::default();
        for uid in &due_jobs {
            let Some(entry) = self.cache.jobs.get(uid) else { continue };
            // The previous version's due instants first, then this one's.
            let (schedule, after, until) = match &entry.carry {
                Some(c) => (&c.schedule, entry.record.last_scheduled_at.map_or(c.after, |l| l.max(c.after)), now.min(c.until)),
                None => (&entry.schedule, entry.base(), now),
            };
            let plan = plan_fires(&PlanInput {
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
                    key: None,
                    payload: None,
                    params: (state == RunState::Pending).then(|| entry.default_params.as_deref().map(str::to_string)).flatten(),
                    upstream: None,
                });
            }
            let first = new_runs.len() - plan.times.len();
            let made = self.dependency_runs(&new_runs[first..], now, &mut dependency_ids);
            new_runs.extend(made);
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
        let began = std::time::Instant::now();
        let outcomes = self.store.fire(&self.fence, &plan.new_runs, &plan.advances).await?;
        self.stats.wrote(plan.new_runs.len() + plan.advances.len(), began);
        self.finish_fire(plan, outcomes)
    }

    /// The fire is committed: track its new pending runs and schedule each
    /// job's next fire. A run that already existed is a surprise (a write
    /// whose outcome was unknown did land, or another writer fired): the
    /// store's copy is the truth, so the answer is an error and the caller
    /// rebuilds the cache from the store.
    pub(super) fn finish_fire(&mut self, plan: FirePlan, outcomes: Vec<FireOutcome>) -> Result<()> {
        let FirePlan { new_runs, plans, now, stamp, tracked, replace, .. } = plan;
        self.cache.runs.replace_later(replace);
        let tracked: HashSet<RunId> = tracked.into_iter().collect();
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
                let due = match self.cache.jobs.get(&run.job_uid) {
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
            self.cache.jobs.fired(&uid, last, more, carried, now);
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
    pub(super) fn track_dependency_runs(&mut self, runs: Vec<NewRun>, outcomes: Vec<FireOutcome>, now: Millis) {
        for (run, outcome) in runs.into_iter().zip(outcomes) {
            if outcome == FireOutcome::Created {
                metrics::counter!("gnomon_runs_total", "state" => run.state.as_str()).increment(1);
                self.track_new(run, now);
            }
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

/// The key a run is stored under: a manual trigger's as given, a webhook
/// call's in a space of its own that no manual key can name (an
/// `Idempotency-Key` never starts with a space).
fn stored_key(origin: Origin, key: String) -> String {
    match origin {
        Origin::Api => key,
        Origin::Webhook => format!(" hook {key}"),
    }
}

/// Whether a run's params (a JSON object) hold every value `given` sets.
fn sets_the_same(stored: Option<&str>, given: &gnomon_core::params::Params) -> bool {
    let stored: gnomon_core::params::Params = stored.and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default();
    given.iter().all(|(k, v)| stored.get(k) == Some(v))
}

/// What every manual run of one trigger is created with.
struct ManualRun {
    origin: Origin,
    /// The params' values, resolved (JSON).
    params: Option<String>,
    payload: Option<String>,
}

impl ManualRun {
    /// A pending manual run of `job` at the instant `at`, named by the
    /// idempotency key `key` when it has one.
    fn run(&self, job: &JobRecord, at: Millis, now: Millis, key: Option<String>) -> NewRun {
        let reason = match (self.origin, key.is_some()) {
            (Origin::Webhook, _) => "webhook",
            (Origin::Api, true) => "manual trigger (idempotency key)",
            (Origin::Api, false) => "manual trigger",
        };
        NewRun {
            job_uid: job.uid.clone(),
            namespace: job.namespace.clone(),
            job: job.name.clone(),
            scheduled_at: at,
            fired_at: now,
            state: RunState::Pending,
            reason: Some(reason.into()),
            manual: true,
            key,
            params: self.params.clone(),
            payload: self.payload.clone(),
            upstream: None,
        }
    }
}
