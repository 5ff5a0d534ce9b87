//! Worker results on their way to the store: the batch that records the
//! reports received since the last write.

use crate::inbox::WorkerEvent;
use crate::plan::EventBatch;
use crate::timeline::JobKey;
use crate::Engine;
use crate::HashMap;
use crate::HashSet;
use gnomon_core::AttemptState;
use gnomon_core::RunState;
use gnomon_records::AttemptChange;
use gnomon_records::Transition;
use std::sync::Arc;

impl Engine {
    /// Builds the batch that records the worker results received since the
    /// last write. The slots of finished attempts are freed at once, so this
    /// turn's dispatch can refill them in the same store write; [`Self::requeue_events`]
    /// puts them back if that write fails.
    pub fn prepare_worker_events(&mut self) -> EventBatch {
        let events = self.reports.take_reports();
        // Build the batch against a scratch copy of the states so that a
        // start and an end of the same attempt in one batch chain correctly.
        let mut scratch: HashMap<String, (RunState, u32)> = HashMap::default();
        let mut batch = Vec::new();
        // Reports to ack once the batch is written: (worker, run, attempt, rejection).
        let mut acks: Vec<(String, String, u32, Option<&'static str>)> = Vec::new();
        // How long the ended attempts took: (worker, job, ms), for prefetch.
        let mut durations: Vec<(String, Arc<JobKey>, f64)> = Vec::new();
        // A start whose end is in the same batch is not written on its own:
        // the end carries the start time (one attempt write instead of two).
        let ending: HashSet<(&str, u32)> = events
            .iter()
            .filter_map(|e| match e {
                WorkerEvent::Finished { run_id, attempt, .. } => Some((run_id.as_str(), *attempt)),
                WorkerEvent::Started { .. } => None,
            })
            .collect();
        for e in &events {
            match e {
                WorkerEvent::Started { worker, run_id, attempt, at } => {
                    if ending.contains(&(run_id.as_str(), *attempt)) {
                        continue;
                    }
                    let Some(run) = self.cache.runs.get(run_id.as_str()) else { continue };
                    // Only the holder of the attempt may say it started.
                    if !self.cache.runs.may_report(run_id, worker) {
                        continue;
                    }
                    let (state, current) = scratch.get(run_id).copied().unwrap_or((run.state, run.attempt));
                    if state == RunState::Assigned && current == *attempt {
                        batch.push(Transition {
                            run_id: run_id.clone(),
                            from: state,
                            from_attempt: current,
                            to: RunState::Running,
                            to_attempt: current,
                            reason: None,
                            next_attempt_at: None,
                            attempt: Some(AttemptChange::Start { attempt: *attempt }),
                            at: *at,
                            notify: Vec::new(),
                        });
                        scratch.insert(run_id.clone(), (RunState::Running, current));
                    }
                }
                WorkerEvent::Finished { worker, run_id, attempt, outcome, started_at, at } => {
                    let Some(run) = self.cache.runs.get(run_id.as_str()) else {
                        acks.push((worker.clone(), run_id.clone(), *attempt, Some("unknown run, or its result is already recorded")));
                        continue;
                    };
                    let (state, current) = scratch.get(run_id).copied().unwrap_or((run.state, run.attempt));
                    let key = run.key.clone();
                    if current != *attempt || !state.is_active() || !self.cache.runs.may_report(run_id, worker) {
                        acks.push((worker.clone(), run_id.clone(), *attempt, Some("superseded attempt: the run has moved on")));
                        continue;
                    }
                    let Some(mut t) =
                        self.end_attempt(run_id, outcome.state, outcome.exit_code, outcome.output.clone(), outcome.retry, *at)
                    else {
                        acks.push((worker.clone(), run_id.clone(), *attempt, Some("the attempt is no longer live")));
                        continue;
                    };
                    t.from = state;
                    if let Some(AttemptChange::End { started_at: st, .. }) = t.attempt.as_mut() {
                        *st = Some(*started_at);
                    }
                    scratch.insert(run_id.clone(), (t.to, current));
                    batch.push(t);
                    acks.push((worker.clone(), run_id.clone(), *attempt, None));
                    if matches!(outcome.state, AttemptState::Succeeded | AttemptState::Failed | AttemptState::TimedOut) {
                        durations.push((worker.clone(), key, (*at - *started_at).max(0) as f64));
                    }
                }
            }
        }
        for (worker, job, ms) in durations {
            self.sessions.record_duration(&worker, ms);
            self.cache.jobs.record_duration(&job.uid, ms);
        }
        // The worker no longer runs these: their slots are free for the
        // dispatch planned with this write (should the write fail, the
        // state is rebuilt from the store).
        for t in &batch {
            if matches!(t.attempt, Some(AttemptChange::End { .. })) {
                self.cache.runs.release(&t.run_id);
            }
        }
        EventBatch { events, batch, acks }
    }

    /// The write failed: the results go back to the inbox, ahead of what
    /// arrived since (persist, then act: nothing was acked).
    pub fn requeue_events(&mut self, eb: EventBatch) {
        self.reports.put_back(eb.events);
    }
}
