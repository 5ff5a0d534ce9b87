use super::*;

pub(super) use gnomon_engine::inbox::WorkerEvent;

pub(super) use gnomon_engine::plan::EventBatch;

impl LeaderRuntime {
    /// The results are persisted: mirror them, then ack (and abort what was
    /// superseded).
    pub(super) async fn finish_events(&mut self, eb: EventBatch, applied: Vec<bool>) -> Result<()> {
        self.settle(&eb.batch, applied).await?;
        for t in &eb.batch {
            if matches!(t.attempt, Some(AttemptChange::End { .. })) {
                self.release(&t.run_id);
                self.engine.cache.runs.forget_cancels(&t.run_id);
            }
        }
        for (worker, run_id, attempt, rejection) in eb.acks {
            if let Some(reason) = rejection {
                tracing::info!(worker = %worker, run = %run_id, attempt, reason, "report rejected");
                self.send_to(
                    &worker,
                    server_message::Msg::Abort(v1::Abort {
                        run_id: run_id.clone(),
                        attempt,
                        token: self.engine.fence.token,
                        reason: reason.into(),
                    }),
                );
            }
            self.send_to(
                &worker,
                server_message::Msg::Ack(v1::Ack {
                    heartbeat_seq: None,
                    report: Some(v1::AttemptRef { run_id, attempt }),
                    rejected_reason: rejection.unwrap_or_default().to_string(),
                }),
            );
        }
        Ok(())
    }
}
