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
                self.upsert_job(job);
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
            let id = self.track_stored(&run, now, now);
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

    /// The shared id of an open run (a new one if the run is not open).
    pub(super) fn rid(&self, id: &str) -> RunId {
        self.engine.cache.runs.rid(id)
    }

    /// Tracks a newly created run: a pending one is queued for dispatch, a
    /// waiting one is indexed under its upstreams; one created ended (a
    /// skip record) is not open, but may decide waiting runs.
    pub(super) fn track_new(&mut self, run: NewRun, now: Millis) -> Option<RunId> {
        let id: RunId = Arc::from(run.id().as_str());
        if run.state.is_terminal() {
            self.engine.cache.runs.upstream_ended(&id, Some(run.state));
            return None;
        }
        let open = OpenRun {
            key: self.job_key(&run.job_uid, &run.job, &run.namespace),
            scheduled_at: run.scheduled_at,
            state: run.state,
            attempt: 0,
            ready_since: now,
            assigned_at: 0,
            began_at: 0,
            params: run.params.map(Arc::from),
            payload: run.payload.map(Arc::from),
            after: run.upstream,
        };
        self.engine.cache.runs.track(id.clone(), open);
        if run.state == RunState::Pending {
            self.engine.cache.runs.queue(id.clone());
        }
        Some(id)
    }

    /// Tracks a newly created pending run and queues it for dispatch.
    pub(super) fn track_pending(&mut self, run: NewRun, now: Millis) -> RunId {
        debug_assert_eq!(run.state, RunState::Pending);
        let id = run.id();
        self.track_new(run, now).unwrap_or_else(|| Arc::from(id.as_str()))
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

    /// Retrying runs whose time has come go back to pending.
    pub(super) fn plan_retries(&mut self, now: Millis, plan: &mut super::plan::TurnPlan) {
        for id in self.engine.cache.runs.take_due_retries(now) {
            let Some(run) = self.engine.cache.runs.get(&id) else { continue };
            plan.retries.push(Transition {
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

    /// Mirrors a transition the store applied (the caller counts it in
    /// `gnomon_runs_total`).
    pub(super) fn mirror_state(&mut self, t: &Transition) {
        self.engine.cache.runs.mirror(t);
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
            began_at: assigned_at,
            params: run.params.as_deref().map(Arc::from),
            payload: run.payload.as_deref().map(Arc::from),
            after: run.upstream.clone(),
        };
        let id: RunId = Arc::from(run.id.as_str());
        self.engine.cache.runs.track(id.clone(), open);
        // A `replace` run: the job's older open runs are cancelled (again,
        // if a store error came between its write and their cancels).
        if run.reason.as_deref() == Some(RunBook::REPLACING_REASON) && run.state != RunState::Waiting {
            self.engine.cache.runs.replace_later([(run.job_uid.clone(), run.scheduled_at)]);
        }
        match run.state {
            RunState::Pending => self.engine.cache.runs.queue(id.clone()),
            RunState::Retrying => self.engine.cache.runs.schedule_retry(run.next_attempt_at.unwrap_or(now), id.clone()),
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
        self.untrack(id, detail.as_ref().is_some_and(|d| d.run.state.is_terminal()));
        let Some(detail) = detail.filter(|d| !d.run.state.is_terminal()) else { return Ok(()) };
        let now = self.engine.now;
        let run = &detail.run;
        let rid = self.track_stored(run, now, now);
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

    /// The transition that ends `attempt`'s run attempt with `outcome`.
    pub(super) fn end_attempt(
        &mut self,
        id: &str,
        outcome: AttemptState,
        exit_code: Option<i32>,
        output: String,
        hint: RetryHint,
        now: Millis,
    ) -> Option<Transition> {
        let run = self.engine.cache.runs.get(id)?;
        if !run.state.is_active() {
            return None;
        }
        let (max_attempts, backoff) =
            self.engine.cache.jobs.get(&run.key.uid).map(|j| (j.max_attempts, j.backoff)).unwrap_or((1, Default::default()));
        // Only a failed attempt's hint counts (a worker cannot turn a lost
        // or timed-out attempt into a final failure).
        let hint = if outcome == AttemptState::Failed { hint } else { RetryHint::Policy };
        let to = match (run_state_after_attempt(outcome, run.attempt, max_attempts), hint) {
            (RunState::Retrying, RetryHint::Never) => RunState::Failed,
            (to, _) => to,
        };
        // The jitter's sample is drawn from the leader's own seeded RNG: the
        // same inputs give the same retry times.
        let sample = if to == RunState::Retrying { rand::Rng::gen::<f64>(&mut self.engine.rng) } else { 0.0 };
        let run = self.engine.cache.runs.get(id)?;
        let delay_ms = match hint {
            RetryHint::After(ms) => i64::try_from(ms.min(MAX_RETRY_AFTER_MS)).unwrap_or(i64::MAX / 2),
            _ => i64::try_from(backoff.delay(run.attempt, sample).as_millis()).unwrap_or(i64::MAX / 2),
        };
        let next_attempt_at = (to == RunState::Retrying).then(|| now.saturating_add(delay_ms));
        let reason = match (to, hint) {
            (RunState::Failed, RetryHint::Never) => {
                Some(format!("attempt {} of {max_attempts} ended {} and asked not to be retried", run.attempt, outcome.as_str()))
            }
            (RunState::Failed, _) => Some(format!("attempt {} of {max_attempts} ended {}", run.attempt, outcome.as_str())),
            (RunState::Retrying, RetryHint::After(_)) => Some(format!(
                "attempt {} ended {}; retrying in {}, as it asked",
                run.attempt,
                outcome.as_str(),
                gnomon_core::duration::format_duration(std::time::Duration::from_millis(u64::try_from(delay_ms).unwrap_or(0)))
            )),
            (RunState::Retrying, _) => Some(format!("attempt {} ended {}; retrying", run.attempt, outcome.as_str())),
            (RunState::Cancelled, _) => Some("cancelled".into()),
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
