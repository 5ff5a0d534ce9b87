use gnomon_engine::dispatch::DispatchPlan;

use super::*;

impl LeaderRuntime {
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
}
