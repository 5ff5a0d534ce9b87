use super::*;

/// A run id, allocated once and shared by every index that names the run.
pub(super) type RunId = Arc<str>;

#[derive(Debug, Clone)]
pub(super) struct OpenRun {
    pub(super) key: Arc<JobKey>,
    pub(super) scheduled_at: Millis,
    pub(super) state: RunState,
    pub(super) attempt: u32,
    pub(super) ready_since: Millis,
    /// When its live attempt was assigned (0: unknown, recovered).
    pub(super) assigned_at: Millis,
}

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
        if self.previous_jobs.is_empty() {
            let changes = self.store.job_changes(0).await?;
            self.cache.job_feed_seq = changes.seq;
            for job in changes.upserted {
                self.upsert_job(job);
            }
        } else {
            self.reload_jobs().await?;
        }
        let now = self.clock.now_millis();
        let started = *self.term_started.get_or_insert(now);
        let mut live = Vec::new();
        for run in self.store.open_runs().await? {
            let id = self.track_stored(&run, 0, now);
            if matches!(run.state, RunState::Assigned | RunState::Running) {
                live.push(id);
            }
        }
        if let Some(leases) = &self.leases {
            if self.lease_deletions.is_none() {
                self.lease_deletions = Some(leases.deletions());
            }
        }
        if live.is_empty() {
            self.last_poll = now;
            return Ok(());
        }
        let workers: HashMap<String, (u32, String)> =
            self.store.live_attempts().await?.into_iter().map(|a| (a.run_id, (a.attempt, a.worker))).collect();
        // Store-kept session leases (etcd): adopt the live ones.
        let leased: HashMap<String, (i64, i64)> = match self.leases.clone() {
            Some(leases) => leases.live().await?.into_iter().map(|l| (l.worker, (l.lease, l.remaining_ms))).collect(),
            None => HashMap::default(),
        };
        let ttl = self.config.lease_ttl_ms;
        for id in live {
            let Some(run) = self.cache.runs.get(&id) else { continue };
            let worker = workers.get(&*id).filter(|(attempt, _)| *attempt == run.attempt).map(|(_, w)| w.clone());
            let held_here = worker.as_ref().is_some_and(|w| self.sessions.contains(w));
            match worker {
                Some(w) if held_here => {
                    self.sessions.hold(&w, id.clone());
                    if let Some(r) = self.cache.runs.get_mut(&id) {
                        // Heartbeat reconciliation may judge it only after a
                        // full heartbeat from now.
                        r.assigned_at = now;
                    }
                    self.cache.in_flight.insert(id, w);
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
                        if let Some(at) = self.sessions.expired_at(w) {
                            deadline = at;
                        }
                        if let Some((lease, remaining)) = leased.get(w) {
                            self.sessions.adopt(w, *lease);
                            deadline = deadline.max(now + remaining + RECONNECT_SLACK_MS);
                        }
                        self.cache.orphan_workers.insert(id.clone(), w.clone());
                    }
                    self.cache.orphans.insert(id, deadline);
                }
            }
        }
        if self.sessions.adopted_count() > 0 {
            tracing::info!(adopted = self.sessions.adopted_count(), "adopted live worker session leases from the store");
        }
        self.last_poll = now;
        Ok(())
    }

    /// The shared id of an open run (a new one if the run is not open).
    pub(super) fn rid(&self, id: &str) -> RunId {
        self.cache.runs.get_key_value(id).map(|(k, _)| k.clone()).unwrap_or_else(|| Arc::from(id))
    }

    /// Tracks a newly created pending run and queues it for dispatch.
    pub(super) fn track_pending(&mut self, run: NewRun, now: Millis) -> RunId {
        let id: RunId = Arc::from(run.id().as_str());
        let open = OpenRun {
            key: self.job_key(&run.job_uid, &run.job, &run.namespace),
            scheduled_at: run.scheduled_at,
            state: RunState::Pending,
            attempt: 0,
            ready_since: now,
            assigned_at: 0,
        };
        self.track(id.clone(), open);
        self.cache.ready.push_back(id.clone());
        id
    }

    pub(super) fn track(&mut self, id: RunId, run: OpenRun) {
        match self.cache.runs_by_job.get_mut(run.key.uid.as_str()) {
            Some(set) => {
                set.insert(id.clone());
            }
            None => {
                self.cache.runs_by_job.insert(run.key.uid.clone(), HashSet::from_iter([id.clone()]));
            }
        }
        self.cache.runs.insert(id, run);
    }

    pub(super) fn untrack(&mut self, id: &str) {
        if let Some(run) = self.cache.runs.remove(id) {
            if let Some(set) = self.cache.runs_by_job.get_mut(run.key.uid.as_str()) {
                set.remove(id);
                if set.is_empty() {
                    self.cache.runs_by_job.remove(run.key.uid.as_str());
                }
            }
        }
        self.release(id);
    }

    /// Forgets which worker holds `id`'s attempt.
    pub(super) fn release(&mut self, id: &str) {
        self.cache.orphans.remove(id);
        if let Some(worker) = self.cache.in_flight.remove(id) {
            self.sessions.unhold(&worker, id);
        }
    }

    pub(super) fn job_counts(&self, job_uid: &str) -> (usize, usize, usize) {
        let Some(ids) = self.cache.runs_by_job.get(job_uid) else { return (0, 0, 0) };
        let mut open = 0;
        let mut waiting = 0;
        let mut active = 0;
        for id in ids {
            if let Some(r) = self.cache.runs.get(id) {
                open += 1;
                if matches!(r.state, RunState::Pending | RunState::Retrying) {
                    waiting += 1;
                }
                if r.state.is_active() {
                    active += 1;
                }
            }
        }
        (open, waiting, active)
    }

    pub(super) async fn release_retries(&mut self, now: Millis) -> Result<()> {
        let mut batch = Vec::new();
        while let Some(Reverse((at, id))) = self.cache.retry_heap.peek().cloned() {
            if at > now {
                break;
            }
            self.cache.retry_heap.pop();
            if let Some(run) = self.cache.runs.get(&id).filter(|r| r.state == RunState::Retrying) {
                batch.push(Transition {
                    run_id: id.to_string(),
                    from: RunState::Retrying,
                    from_attempt: run.attempt,
                    to: RunState::Pending,
                    to_attempt: run.attempt,
                    reason: None,
                    next_attempt_at: None,
                    attempt: None,
                    at: now,
                    notify: Vec::new(),
                });
            }
        }
        self.apply(batch).await
    }

    /// Writes a batch of transitions and mirrors the applied ones in memory.
    pub(super) async fn apply(&mut self, mut batch: Vec<Transition>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.attach_notifications(&mut batch);
        let applied = self.store.transition(&self.fence, &batch).await?;
        for (t, ok) in batch.into_iter().zip(applied) {
            if !ok {
                self.reload_run(&t.run_id).await?;
                continue;
            }
            self.mirror(&t);
        }
        Ok(())
    }

    pub(super) fn mirror(&mut self, t: &Transition) {
        metrics::counter!("gnomon_runs_total", "state" => t.to.as_str()).increment(1);
        self.mirror_state(t);
    }

    /// [`Self::mirror`] without counting it in `gnomon_runs_total` (for a
    /// batch that counts its transitions once per state).
    pub(super) fn mirror_state(&mut self, t: &Transition) {
        if t.to.is_terminal() {
            self.untrack(&t.run_id);
            return;
        }
        let Some(run) = self.cache.runs.get_mut(t.run_id.as_str()) else { return };
        run.state = t.to;
        run.attempt = t.to_attempt;
        match t.to {
            RunState::Pending => {
                run.ready_since = t.at;
                self.cache.ready.push_back(self.rid(&t.run_id));
            }
            RunState::Retrying => {
                self.release(&t.run_id);
                self.cache.retry_heap.push(Reverse((t.next_attempt_at.unwrap_or(t.at), self.rid(&t.run_id))));
            }
            _ => {}
        }
    }

    /// Tracks an open run as the store has it: queued for dispatch when
    /// pending, on the retry heap when retrying (the caller places a live
    /// attempt).
    fn track_stored(&mut self, run: &gnomon_backend::RunRecord, assigned_at: Millis, now: Millis) -> RunId {
        let open = OpenRun {
            key: self.job_key(&run.job_uid, &run.job, &run.namespace),
            scheduled_at: run.scheduled_at,
            state: run.state,
            attempt: run.attempt,
            ready_since: run.next_attempt_at.unwrap_or(run.fired_at),
            assigned_at,
        };
        let id: RunId = Arc::from(run.id.as_str());
        self.track(id.clone(), open);
        match run.state {
            RunState::Pending => self.cache.ready.push_back(id.clone()),
            RunState::Retrying => self.cache.retry_heap.push(Reverse((run.next_attempt_at.unwrap_or(now), id.clone()))),
            _ => {}
        }
        id
    }

    /// A compare-and-swap did not apply: someone else moved the run (a user
    /// cancel), or a write whose outcome was unknown did land. The store's
    /// copy is the truth: the run is dropped from the cache and loaded
    /// again as recovery would load it.
    pub(super) async fn reload_run(&mut self, id: &str) -> Result<()> {
        let detail = self.store.get_run(id).await?;
        self.untrack(id);
        let Some(detail) = detail.filter(|d| !d.run.state.is_terminal()) else { return Ok(()) };
        let now = self.clock.now_millis();
        let run = &detail.run;
        let rid = self.track_stored(run, now, now);
        match run.state {
            RunState::Assigned | RunState::Running => {
                let worker = detail.attempts.iter().find(|a| a.attempt == run.attempt).map(|a| a.worker.clone());
                match worker {
                    Some(w) if self.sessions.contains(&w) => {
                        self.sessions.hold(&w, rid.clone());
                        self.cache.in_flight.insert(rid, w);
                    }
                    worker => {
                        let ttl = self.config.lease_ttl_ms;
                        let mut deadline = self.term_started.unwrap_or(now) + ttl + RECONNECT_SLACK_MS;
                        if let Some(w) = worker {
                            if let Some(at) = self.sessions.expired_at(&w) {
                                deadline = at;
                            }
                            self.cache.orphan_workers.insert(rid.clone(), w);
                        }
                        self.cache.orphans.insert(rid, deadline);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The transition that ends `attempt`'s run attempt with `outcome`.
    pub(super) fn end_attempt(
        &self,
        id: &str,
        outcome: AttemptState,
        exit_code: Option<i32>,
        output: String,
        now: Millis,
    ) -> Option<Transition> {
        let run = self.cache.runs.get(id)?;
        if !run.state.is_active() {
            return None;
        }
        let (max_attempts, backoff) =
            self.cache.jobs.get(&run.key.uid).map(|j| (j.max_attempts, j.backoff)).unwrap_or((1, Default::default()));
        let to = run_state_after_attempt(outcome, run.attempt, max_attempts);
        let next_attempt_at =
            (to == RunState::Retrying).then(|| now + i64::try_from(backoff.delay_random(run.attempt).as_millis()).unwrap_or(i64::MAX / 2));
        let reason = match to {
            RunState::Failed => Some(format!("attempt {} of {max_attempts} ended {}", run.attempt, outcome.as_str())),
            RunState::Retrying => Some(format!("attempt {} ended {}; retrying", run.attempt, outcome.as_str())),
            RunState::Cancelled => Some("cancelled".into()),
            _ => None,
        };
        Some(Transition {
            run_id: id.to_string(),
            from: run.state,
            from_attempt: run.attempt,
            to,
            to_attempt: run.attempt,
            reason,
            next_attempt_at,
            attempt: Some(AttemptChange::End { attempt: run.attempt, state: outcome, exit_code, output, started_at: None }),
            at: now,
            notify: Vec::new(),
        })
    }
}
