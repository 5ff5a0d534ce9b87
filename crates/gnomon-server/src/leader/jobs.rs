use super::*;

use gnomon_engine::plan::FirePlan;

impl LeaderRuntime {
    /// Loads the jobs into the cache being rebuilt. A job held before at
    /// its stored version keeps its entry (compiled schedule, timeline)
    /// with the stored last fire: what [`Engine::upsert_job`] would make of
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
                self.engine.upsert_job(job);
            }
        }
        self.engine.cache.jobs.set_feed_seq(heads.seq);
        Ok(())
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
                    self.engine.track_pending(run, now);
                }
            } else {
                self.engine.track_new(run, now);
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
}
