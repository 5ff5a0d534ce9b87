use super::*;

impl LeaderRuntime {
    /// Loads jobs and open runs into an empty cache: at the start of a
    /// term, and after any store error (the crash-only rule). A live
    /// attempt whose worker has a session here stays that worker's; one
    /// whose worker has none waits for it to reconnect and reclaim it (its
    /// `Hello` lists it) until it cannot be running any more, then it is
    /// `lost`.
    pub(super) async fn recover(&mut self) -> Result<()> {
        // Subscribe before the first read, so no write falls in between.
        if self.job_signal.is_none() {
            self.job_signal = self.store.job_change_signal();
        }
        if !self.engine.cache.jobs.has_earlier() {
            let changes = self.store.job_changes(0).await?;
            self.engine.cache.jobs.set_feed_seq(changes.seq);
            for job in changes.upserted {
                self.engine.upsert_job(job);
            }
        } else {
            self.reload_jobs().await?;
        }
        let now = self.engine.now;
        let started = self.engine.cadence.term_started(now);
        // Keyed runs that ended and are still held count in their
        // namespace's quotas (read before the open runs: a run that ends in
        // between is counted at most once).
        for kept in self.store.kept_keyed_runs(now.saturating_sub(gnomon_backend::KEYED_RUN_HOLD_MS)).await? {
            self.engine.cache.runs.keep(&kept.namespace, kept.fired_at, kept.bytes);
        }
        let mut live = Vec::new();
        for run in self.store.open_runs().await? {
            let id = self.engine.track_stored(&run, now, now);
            if matches!(run.state, RunState::Assigned | RunState::Running) {
                live.push(id);
            }
        }
        self.load_backfills().await?;
        if let Some(leases) = &self.leases {
            if self.lease_deletions.is_none() {
                self.lease_deletions = Some(leases.deletions());
            }
        }
        if live.is_empty() {
            self.engine.cadence.polled(now);
            return Ok(());
        }
        let stored: HashMap<String, gnomon_backend::LiveAttempt> =
            self.store.live_attempts().await?.into_iter().map(|a| (a.run_id.clone(), a)).collect();
        // Store-kept session leases (etcd): adopt the live ones.
        let leased: HashMap<String, (i64, i64)> = match self.leases.clone() {
            Some(leases) => leases.live().await?.into_iter().map(|l| (l.worker, (l.lease, l.remaining_ms))).collect(),
            None => HashMap::default(),
        };
        let ttl = self.engine.config.lease_ttl_ms;
        for id in live {
            let Some(run) = self.engine.cache.runs.get(&id) else { continue };
            let attempt = stored.get(&*id).filter(|a| a.attempt == run.attempt);
            // The attempt as it was: its timeout counts from when it began,
            // never from this term.
            if let Some(a) = attempt {
                self.engine.cache.runs.restore_attempt_times(&id, a.assigned_at, a.assigned_at.max(a.started_at.unwrap_or(0)));
            }
            let worker = attempt.map(|a| a.worker.clone());
            let held_here = worker.as_ref().is_some_and(|w| self.engine.sessions.contains(w));
            match worker {
                Some(w) if held_here => {
                    // A rebuild under the same sessions: heartbeat
                    // reconciliation goes on judging from the stored
                    // assignment (a rebuild that restarted its clock would
                    // keep an attempt its worker never got from being found
                    // for as long as rebuilds come faster than heartbeats;
                    // seed 705).
                    self.engine.cache.runs.hold(id, &w);
                }
                worker => {
                    // When it can no longer be running: its worker's lease
                    // ran out under this leader (and it has fenced itself);
                    // otherwise the worker's last acknowledgement came at
                    // the latest when this term began (the previous leader
                    // had stopped), so one lease from then, plus the worker's
                    // longest reconnect backoff; or what is left of a live
                    // store lease, if that is longer.
                    let mut deadline = started + ttl + RECONNECT_SLACK_MS;
                    if let Some(w) = &worker {
                        if let Some(at) = self.engine.sessions.expired_at(w) {
                            deadline = at;
                        }
                        if let Some((lease, remaining)) = leased.get(w) {
                            self.engine.sessions.adopt(w, *lease);
                            deadline = deadline.max(now + remaining + RECONNECT_SLACK_MS);
                        }
                    }
                    self.engine.cache.runs.orphan(id, deadline, worker);
                }
            }
        }
        if self.engine.sessions.adopted_count() > 0 {
            tracing::info!(adopted = self.engine.sessions.adopted_count(), "adopted live worker session leases from the store");
        }
        self.engine.cadence.polled(now);
        Ok(())
    }

    /// Drops a run from the cache, freeing the slot of its attempt; one
    /// that `ended` is counted as kept if it is keyed.
    pub(super) fn untrack(&mut self, id: &str, ended: bool) {
        if ended {
            self.engine.cache.runs.ended(id);
        } else {
            self.engine.cache.runs.untrack(id);
        }
        self.live.end(id, self.engine.now);
    }

    /// Forgets which worker holds `id`'s attempt, freeing its slot (and
    /// its live output).
    pub(super) fn release(&mut self, id: &str) {
        self.engine.cache.runs.release(id);
        self.live.end(id, self.engine.now);
    }

    /// A compare-and-swap did not apply: someone else moved the run (a user
    /// cancel), or a write whose outcome was unknown did land. The store's
    /// copy is the truth: the run is dropped from the cache and loaded
    /// again as recovery would load it.
    pub(super) async fn reload_run(&mut self, id: &str) -> Result<()> {
        let detail = self.store.get_run(id).await?;
        self.untrack(id, detail.as_ref().is_some_and(|d| d.run.state.is_terminal()));
        let Some(detail) = detail.filter(|d| !d.run.state.is_terminal()) else { return Ok(()) };
        let now = self.engine.now;
        let run = &detail.run;
        let rid = self.engine.track_stored(run, now, now);
        match run.state {
            RunState::Assigned | RunState::Running => {
                let attempt = detail.attempts.iter().find(|a| a.attempt == run.attempt);
                if let Some(a) = attempt {
                    self.engine.cache.runs.restore_attempt_times(&rid, a.assigned_at, a.assigned_at.max(a.started_at.unwrap_or(0)));
                }
                let worker = attempt.map(|a| a.worker.clone());
                match worker {
                    Some(w) if self.engine.sessions.contains(&w) => {
                        self.engine.cache.runs.hold(rid, &w);
                    }
                    worker => {
                        let ttl = self.engine.config.lease_ttl_ms;
                        let mut deadline = self.engine.cadence.started().unwrap_or(now) + ttl + RECONNECT_SLACK_MS;
                        if let Some(at) = worker.as_deref().and_then(|w| self.engine.sessions.expired_at(w)) {
                            deadline = at;
                        }
                        self.engine.cache.runs.orphan(rid, deadline, worker);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}
