use super::*;

impl LeaderRuntime {
    /// Registers a worker session (answering `Welcome`), reclaiming the
    /// attempts it still runs, or refuses it.
    #[allow(clippy::result_large_err)] // tonic::Status is what the service returns
    pub(super) fn open_session(
        &mut self,
        hello: v1::Hello,
        namespaces: Option<Arc<[String]>>,
        outbound: Outbound,
    ) -> std::result::Result<String, tonic::Status> {
        let now = self.engine.now;
        let worker = hello.worker_id.clone();
        self.check_stream(&worker);
        if let Some(old) = self.engine.sessions.get(&worker) {
            if old.stream == Stream::Up && now - old.last_heartbeat < 2 * self.engine.config.heartbeat_ms {
                return Err(tonic::Status::already_exists(format!("worker id {worker:?} already has a live session")));
            }
        }
        let session_id = format!("{worker}-{:08x}", rand::Rng::gen::<u32>(&mut self.engine.rng));
        if let Some(old) = self.engine.sessions.take(&worker) {
            // Its stream ends: dropping the sender closes it.
            self.outlets.remove(&old.session_id);
        }
        let attempts = self.engine.cache.runs.runs_held_by(&worker);
        let listed: HashSet<&str> = hello.running.iter().map(|r| r.run_id.as_str()).collect();
        // Attempts it held but no longer lists: its report may still be
        // spooled; give it one lease to arrive, then they are lost.
        for id in attempts.iter().filter(|id| !listed.contains(&id.as_ref())) {
            self.engine.cache.runs.orphan(id.clone(), now + self.engine.config.lease_ttl_ms, Some(worker.clone()));
        }
        // So do the orphans the store says it holds (a new term, or a
        // rebuild while it was away): ended while it was disconnected,
        // their reports follow the Welcome. Judged at the old deadline,
        // one that passed in this turn would end `lost` a report that is
        // one round trip away.
        self.engine.cache.runs.await_reports_of(&worker, |id| listed.contains(id), now + self.engine.config.lease_ttl_ms);
        let mut reclaimed = Vec::new();
        let mut superseded = Vec::new();
        for r in &hello.running {
            // Only attempts of namespaces its credential covers: another's
            // attempt is left alone, for its own worker to reclaim.
            let namespace = self.engine.cache.runs.get(r.run_id.as_str()).map(|run| run.key.namespace.clone());
            if let (Some(ns), Some(allowed)) = (&namespace, &namespaces) {
                if !allowed.iter().any(|a| a == ns) {
                    tracing::warn!(target: "gnomon::audit", worker = %worker, run = %r.run_id, attempt = r.attempt, namespace = %ns,
                        "reclaim refused: the session's credential does not cover the attempt's namespace; the attempt is left alone");
                    metrics::counter!("gnomon_reclaims_refused_total").increment(1);
                    continue;
                }
            }
            let current =
                self.engine.cache.runs.get(r.run_id.as_str()).is_some_and(|run| run.state.is_active() && run.attempt == r.attempt);
            let ours = self.engine.cache.runs.may_report(&r.run_id, &worker);
            if current && ours {
                self.engine.cache.runs.hold(self.engine.rid(&r.run_id), &worker);
                reclaimed.push(r.clone());
            } else {
                superseded.push(r.clone());
            }
        }
        let welcome = v1::Welcome {
            session_id: session_id.clone(),
            lease_ttl_ms: u64::try_from(self.engine.config.lease_ttl_ms).unwrap_or(10_000),
            heartbeat_interval_ms: u64::try_from(self.engine.config.heartbeat_ms).unwrap_or(2_000),
            leader_token: self.engine.fence.token,
            reclaimed,
            superseded,
        };
        if outbound.send(Ok(v1::ServerMessage { msg: Some(server_message::Msg::Welcome(welcome)) })).is_err() {
            return Err(tonic::Status::unavailable("the session closed during Hello"));
        }
        tracing::info!(worker = %worker, session = %session_id, capacity = hello.capacity, labels = ?hello.labels, "worker session opened");
        let session = Session::new(session_id.clone(), hello, namespaces, now, self.engine.config.lease_ttl_ms);
        self.outlets.insert(session_id.clone(), outbound);
        self.engine.sessions.insert(worker.clone(), session);
        Ok(session_id)
    }

    pub(super) fn on_worker_message(&mut self, session: &str, msg: worker_message::Msg) {
        let Some(worker) = self.engine.sessions.worker_of(session).cloned() else { return };
        let now = self.engine.now;
        match msg {
            worker_message::Msg::Heartbeat(hb) => {
                // A session whose send side is closed (the worker stopped
                // reading and was cut off) renews nothing: its lease runs
                // out unless the worker reconnects.
                self.check_stream(&worker);
                if self.engine.sessions.is_cut_off(&worker) {
                    return;
                }
                // The store lease: refreshed at 0.7×TTL, with one retry at
                // 0.95×TTL if that fails.
                let ttl = self.engine.config.lease_ttl_ms;
                if let (Some(lease), Some(leases)) = (self.engine.sessions.heartbeat(&worker, now, ttl, hb.draining), self.leases.clone()) {
                    tokio::spawn(async move {
                        if !matches!(leases.refresh(lease).await, Ok(true)) {
                            tokio::time::sleep(Duration::from_millis(u64::try_from(ttl / 4).unwrap_or(0))).await;
                            let _ = leases.refresh(lease).await;
                        }
                    });
                }
                if !self.engine.freshness.is_stale() {
                    self.engine.reconcile_held(&worker, &hb.attempts, now);
                }
                self.send_to(&worker, server_message::Msg::Ack(v1::Ack { heartbeat_seq: Some(hb.seq), ..Default::default() }));
            }
            worker_message::Msg::Started(st) => {
                self.take_report(WorkerEvent::Started { worker, run_id: st.run_id, attempt: st.attempt, at: st.started_at_ms });
            }
            worker_message::Msg::Report(r) => {
                let state = match v1::Outcome::try_from(r.outcome).unwrap_or(v1::Outcome::Failed) {
                    v1::Outcome::Succeeded => AttemptState::Succeeded,
                    v1::Outcome::TimedOut => AttemptState::TimedOut,
                    v1::Outcome::Cancelled => AttemptState::Cancelled,
                    v1::Outcome::Lost => AttemptState::Lost,
                    v1::Outcome::Failed | v1::Outcome::Unspecified => AttemptState::Failed,
                };
                let exit_code = r.exit_code.or(r.http_status.and_then(|s| i32::try_from(s).ok()));
                let mut output = r.output;
                if output.len() > gnomon_proto::limits::MAX_OUTPUT_BYTES {
                    let cut = output.len() - gnomon_proto::limits::MAX_OUTPUT_BYTES;
                    let cut = (cut..output.len()).find(|i| output.is_char_boundary(*i)).unwrap_or(output.len());
                    output = output[cut..].to_string();
                }
                self.take_report(WorkerEvent::Finished {
                    worker,
                    run_id: r.run_id,
                    attempt: r.attempt,
                    outcome: ExecOutcome { state, exit_code, output, retry: RetryHint::from_report(r.no_retry, r.retry_after_ms) },
                    started_at: r.started_at_ms,
                    at: r.ended_at_ms.max(r.started_at_ms),
                });
            }
            worker_message::Msg::Output(o) => {
                // Only from the worker holding the run's current attempt.
                let current = self.engine.cache.runs.get(o.run_id.as_str()).is_some_and(|r| r.attempt == o.attempt && r.state.is_active());
                if current && self.engine.cache.runs.may_report(&o.run_id, &worker) {
                    self.live.start(&o.run_id, o.attempt, now);
                    self.live.append(&o.run_id, o.attempt, o.offset, &o.data, now);
                }
            }
            worker_message::Msg::Hello(_) => {}
        }
    }

    /// Sessions whose lease ran out lose their attempts (retried elsewhere
    /// per the job's policy); recovered attempts nobody reclaimed likewise.
    pub(super) fn plan_expiries(&mut self, now: Millis, plan: &mut super::plan::TurnPlan) {
        // With a store lease, the store's deletion of the session key decides
        // (`on_lease_deleted`); the in-memory lease is the fallback, a little
        // later, for when the store cannot be heard.
        let (mut batch, mut aborts) = (Vec::new(), Vec::new());
        for (worker, s) in self.engine.sessions.expire(now, STORE_LEASE_SLACK_MS, self.engine.config.lease_ttl_ms + RECONNECT_SLACK_MS) {
            self.outlets.remove(&s.session_id);
            if let (Some(leases), Some(lease)) = (self.leases.clone(), s.store_lease) {
                tokio::spawn(async move { leases.release(lease).await });
            }
            let held = self.engine.cache.runs.runs_held_by(&worker);
            tracing::warn!(worker = %worker, attempts = held.len(), "worker lease expired; its attempts are lost");
            metrics::counter!("gnomon_worker_leases_expired_total").increment(1);
            for id in held {
                if self.engine.cache.runs.holder(&id) == Some(&worker) {
                    self.engine.cache.runs.release(&id);
                    // Its report is in (read later this turn): the attempt
                    // ended on its worker, so it waits for that report as
                    // an orphan of that worker instead.
                    if self
                        .engine
                        .reports
                        .reports()
                        .iter()
                        .any(|e| matches!(e, WorkerEvent::Finished { worker: w, run_id, .. } if *w == worker && **run_id == *id))
                    {
                        self.engine.cache.runs.orphan(id, now, Some(worker.clone()));
                        continue;
                    }
                    if let Some(t) = self.engine.end_attempt(
                        &id,
                        AttemptState::Lost,
                        None,
                        format!("worker {worker} lease expired"),
                        RetryHint::Policy,
                        now,
                    ) {
                        batch.push(t);
                    }
                }
            }
        }
        // Attempts a live worker does not hold (`reconcile_held`), unless
        // their report came in since.
        for (worker, id) in self.engine.reports.take_unheld() {
            let reported = self
                .engine
                .reports
                .reports()
                .iter()
                .any(|e| matches!(e, WorkerEvent::Finished { worker: w, run_id, .. } if *w == worker && **run_id == *id));
            if reported || self.engine.cache.runs.holder(&id) != Some(&worker) {
                continue;
            }
            let Some(attempt) = self.engine.cache.runs.get(&id).map(|r| r.attempt) else { continue };
            tracing::warn!(worker = %worker, run = %id, attempt, "the worker does not hold an attempt assigned to it; ending it lost");
            metrics::counter!("gnomon_attempts_unheld_total").increment(1);
            // Its slot frees when the transition is mirrored; if the write
            // fails, the next heartbeats find it again.
            let why = format!("worker {worker} did not hold the attempt (its assignment never reached it)");
            if let Some(t) = self.engine.end_attempt(&id, AttemptState::Lost, None, why, RetryHint::Policy, now) {
                batch.push(t);
                aborts.push((worker, id.to_string(), attempt, "the attempt was ended lost: the worker did not hold it".to_string()));
            }
        }
        self.engine.expire_overruns(now, &mut batch, &mut aborts);
        // An orphan whose report is in (its worker reconnected with it
        // spooled, and the turn reads it after this) waits for it.
        let reports = self.engine.reports.reports();
        let reported = |id: &str, worker: Option<&str>| {
            reports
                .iter()
                .any(|e| matches!(e, WorkerEvent::Finished { worker: w, run_id, .. } if **run_id == *id && worker.is_none_or(|k| k == w)))
        };
        for (id, _) in self.engine.cache.runs.take_overdue_orphans(now, reported) {
            if let Some(t) = self.engine.end_attempt(
                &id,
                AttemptState::Lost,
                None,
                "no worker reclaimed the attempt within its lease".into(),
                RetryHint::Policy,
                now,
            ) {
                batch.push(t);
            }
        }
        plan.ends.append(&mut batch);
        // Should the assignment still turn up, the worker drops it (told
        // once the ends are written).
        plan.aborts.append(&mut aborts);
    }

    /// Sends a message on the worker's stream; whether it went.
    pub(super) fn send_to(&self, worker: &str, msg: server_message::Msg) -> bool {
        let Some(s) = self.engine.sessions.get(worker).filter(|s| s.stream != Stream::Down) else { return false };
        self.outlets.get(&s.session_id).is_some_and(|tx| tx.send(Ok(v1::ServerMessage { msg: Some(msg) })).is_ok())
    }

    /// Tells the sessions when the worker's send side has closed (it
    /// stopped reading and was cut off).
    pub(super) fn check_stream(&mut self, worker: &str) {
        let closed = self
            .engine
            .sessions
            .get(worker)
            .filter(|s| s.stream == Stream::Up)
            .map(|s| self.outlets.get(&s.session_id).is_none_or(|tx| tx.is_closed()));
        if closed == Some(true) {
            self.engine.sessions.cut_off(worker);
        }
    }

    /// Asks the worker holding the run's attempt to stop it.
    pub(super) fn send_cancel(&mut self, run_id: &str, attempt: u32) {
        if let Some(worker) = self.engine.cache.runs.holder(run_id).cloned() {
            self.send_to(
                &worker,
                server_message::Msg::Cancel(v1::Cancel { run_id: run_id.into(), attempt, token: self.engine.fence.token }),
            );
        }
        self.engine.cache.runs.note_cancel(run_id, attempt);
    }

    /// Takes a worker's report into the inbox. Past its bound the report is
    /// not taken and not acknowledged: the worker keeps it spooled and
    /// sends it again.
    fn take_report(&mut self, event: WorkerEvent) {
        if !self.engine.reports.report(event) {
            metrics::counter!("gnomon_leader_inbox_refused_total", "bound" => "reports").increment(1);
        }
    }
}
