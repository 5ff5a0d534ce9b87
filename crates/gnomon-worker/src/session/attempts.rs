//! Starting an attempt the leader assigned (refused while the fence has
//! lapsed, or past capacity and prefetch), running it to its outcome, and
//! stopping one (superseded, cancelled or lost).

use super::*;

impl WorkerRuntime {
    pub(super) fn start_attempt(&self, a: v1::Assign) {
        let refuse = |a: v1::Assign, why: String| {
            let now = now_ms();
            self.spool_report(v1::Report {
                run_id: a.run_id,
                attempt: a.attempt,
                outcome: v1::Outcome::Failed as i32,
                output: why,
                started_at_ms: now,
                ended_at_ms: now,
                token: a.token,
                ..Default::default()
            });
        };
        let executor: Executor = match serde_json::from_str(&a.executor_json) {
            Ok(e) => e,
            Err(e) => return refuse(a, format!("worker cannot read the executor spec: {e}")),
        };
        let params = match a.params_json.as_str() {
            "" => None,
            json => match serde_json::from_str(json) {
                Ok(p) => Some(p),
                Err(e) => return refuse(a, format!("worker cannot read the run's params: {e}")),
            },
        };
        if !self.runs_kind(executor.kind()) {
            let why = format!("worker {} does not run {} jobs (its --executors leave them out)", self.config.id, executor.kind());
            return refuse(a, why);
        }
        let key = (a.run_id.clone(), a.attempt);
        let (cancel_tx, cancel_rx) = watch::channel(false);
        let live = crate::live::LiveSink::default();
        {
            let mut inner = self.lock();
            if inner.running.contains_key(&key) || inner.spool.contains_key(&key) {
                return; // a duplicate Assign: already running or done
            }
            inner
                .running
                .insert(key.clone(), Running { cancel: cancel_tx, token: a.token, aborted: false, lost: false, live: live.clone() });
        }
        let request = ExecRequest {
            run_id: a.run_id.clone(),
            attempt: a.attempt,
            job: a.job.clone(),
            namespace: a.namespace.clone(),
            scheduled_at: a.scheduled_at_ms,
            token: a.token,
            worker_id: self.config.id.clone(),
            executor,
            timeout: (a.timeout_ms > 0).then(|| Duration::from_millis(a.timeout_ms)),
            isolation: self.config.isolation.clone(),
            egress: Arc::new(self.config.egress.clone()),
            params,
            payload: (!a.payload.is_empty()).then(|| a.payload.clone()),
            live: Some(live),
        };
        let rt = self.clone();
        let mut cancel_rx = cancel_rx;
        tokio::spawn(async move {
            // Wait for a slot (FIFO); a Cancel, Abort or self-fence while
            // queued ends the attempt without running it.
            let permit = tokio::select! {
                biased;
                _ = cancel_rx.wait_for(|c| *c) => None,
                p = rt.slots.clone().acquire_owned() => p.ok(),
            };
            // Stopped while it waited (a slot may have freed at that moment),
            // or the fence lapsed meanwhile: it never starts.
            let permit = permit.filter(|_| !*cancel_rx.borrow());
            let permit = match permit {
                Some(p) if rt.fence_lapsed() => {
                    drop(p);
                    if let Some(r) = rt.lock().running.get_mut(&key) {
                        r.lost = true;
                    }
                    None
                }
                p => p,
            };
            let started = now_ms();
            let outcome = match permit.as_ref() {
                Some(_) => {
                    // `Started` goes out once the attempt has run for a
                    // moment; one that ends sooner is reported by its
                    // `Report` alone (which carries its start time), so a
                    // short attempt costs one message, not two.
                    let run = execute(&request, &rt.http, &rt.handlers, cancel_rx);
                    tokio::pin!(run);
                    tokio::select! {
                        biased;
                        outcome = &mut run => outcome,
                        _ = tokio::time::sleep(STARTED_AFTER) => {
                            if let Some(tx) = rt.lock().outbound.clone() {
                                let _ = tx.send(msg(worker_message::Msg::Started(v1::Started {
                                    run_id: key.0.clone(),
                                    attempt: key.1,
                                    started_at_ms: started,
                                })));
                            }
                            run.await
                        }
                    }
                }
                None => ExecOutcome::ended(AttemptState::Cancelled, "cancelled before it started"),
            };
            // Stamped before the slot is given back, so the next attempt's
            // start never precedes this one's end.
            let ended = now_ms();
            drop(permit);
            let mut inner = rt.lock();
            let Some(state) = inner.running.remove(&key) else { return };
            if state.aborted {
                drop(inner);
                tracing::info!(run = %key.0, attempt = key.1, "superseded attempt stopped; not reported");
                return;
            }
            let outcome_state = if state.lost { AttemptState::Lost } else { outcome.state };
            // What is left of the live stream goes ahead of the report.
            if let Some(tx) = &inner.outbound {
                for (offset, data) in state.live.take_all() {
                    let piece = v1::Output { run_id: key.0.clone(), attempt: key.1, token: state.token, offset, data };
                    let _ = tx.send(msg(worker_message::Msg::Output(piece)));
                }
            }
            let (no_retry, retry_after_ms) = match (outcome_state, outcome.retry) {
                (AttemptState::Failed, RetryHint::Never) => (true, 0),
                (AttemptState::Failed, RetryHint::After(ms)) => (false, ms),
                _ => (false, 0),
            };
            let http_status = matches!(request.executor, Executor::Http(_)).then_some(outcome.exit_code).flatten();
            // Out of `running` and into the spool (and the stream) at once.
            Self::spool_locked(
                &mut inner,
                v1::Report {
                    run_id: key.0.clone(),
                    attempt: key.1,
                    outcome: outcome_of(outcome_state) as i32,
                    exit_code: if http_status.is_some() { None } else { outcome.exit_code },
                    http_status: http_status.and_then(|s| u32::try_from(s).ok()),
                    output: outcome.output,
                    started_at_ms: started,
                    ended_at_ms: ended,
                    token: state.token,
                    no_retry,
                    retry_after_ms,
                },
            );
        });
    }

    /// Sends the attempt's next live piece, if a session is up.
    pub(super) fn send_live(inner: &Inner, key: &(String, u32), r: &Running) {
        let Some(tx) = &inner.outbound else { return };
        if let Some((offset, data)) = r.live.take_piece() {
            let _ = tx.send(msg(worker_message::Msg::Output(v1::Output {
                run_id: key.0.clone(),
                attempt: key.1,
                token: r.token,
                offset,
                data,
            })));
        }
    }

    /// Sends each running attempt's next live piece.
    pub(super) fn flush_live(&self) {
        let inner = self.lock();
        for (key, r) in &inner.running {
            if !r.aborted && !r.lost {
                Self::send_live(&inner, key, r);
            }
        }
    }

    /// Stops an attempt. `report_as`: `None` aborts it silently (superseded),
    /// `Some(lost)` reports it cancelled (`false`) or lost (`true`).
    pub(super) fn stop_attempt(&self, run: &str, attempt: u32, report_as: Option<bool>) {
        let mut inner = self.lock();
        if let Some(r) = inner.running.get_mut(&(run.to_string(), attempt)) {
            match report_as {
                None => r.aborted = true,
                // Once lost (self-fenced), a later cancel does not make it
                // a cancellation: it still ended because of the fence.
                Some(lost) => r.lost |= lost,
            }
            let _ = r.cancel.send(true);
        }
    }
}
