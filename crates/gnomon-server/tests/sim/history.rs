//! What the simulated workers did, as the checker reads it.

use std::collections::HashMap;

use gnomon_core::Millis;

#[derive(Debug, Default)]
pub struct History {
    /// (run, attempt, worker, when) of every attempt a worker started.
    pub starts: Vec<(String, u32, String, Millis)>,
    /// Intervals in which an attempt was executing on an awake worker.
    pub segments: Vec<(String, u32, Millis, Millis)>,
    open: HashMap<(String, u32), Millis>,
    /// Reports the leader acked as recorded: (run, attempt, outcome).
    pub recorded: Vec<(String, u32, i32)>,
    /// Per job name: when it was paused and resumed.
    pub paused: HashMap<String, Vec<(Millis, Option<Millis>)>>,
    /// Answers to triggers with an idempotency key: (job, key, run, existed).
    pub keyed: Vec<(String, String, String, bool)>,
    /// The idempotency keys triggers were sent with.
    pub keys_tried: Vec<String>,
    /// The runs each answered trigger created and the params they must
    /// record.
    pub trigger_params: Vec<(Vec<String>, Option<String>)>,
    /// The runs each answered trigger created and the payload they must
    /// record (webhook calls have one).
    pub trigger_payloads: Vec<(Vec<String>, Option<String>)>,
    /// Triggers refused for their request (not for a store fault).
    pub refused_triggers: Vec<String>,
    /// The params each started attempt was assigned with: (run, attempt,
    /// params JSON, empty for none).
    pub assigned_params: Vec<(String, u32, String)>,
    /// The payload each started attempt was assigned with (empty for none).
    pub assigned_payloads: Vec<(String, u32, String)>,
    /// (run, attempt, no_retry, retry_after_ms) of every failure reported
    /// with a retry hint.
    pub hints: Vec<(String, u32, bool, u64)>,
    /// What the simulation did, for a replayed seed's report.
    pub log: Vec<(Millis, String)>,
    /// When each worker was crashed, paused or cut off from the leader:
    /// (worker, from, until).
    pub disruptions: Vec<(String, Millis, Millis)>,
    /// When a worker fenced itself (no heartbeat acked within 0.7 × the
    /// lease): (worker, when).
    pub self_fences: Vec<(String, Millis)>,
    /// The tiers (params values) of the triggers their callers withdrew
    /// before the leader planned them: no run may carry one.
    pub withdrawn: Vec<String>,
    /// The outcome each worker decided for an attempt it ran, as first
    /// reported (before any ack): (run, attempt, outcome).
    pub decided: Vec<(String, u32, i32)>,
}

impl History {
    pub fn start(&mut self, run: &str, attempt: u32, worker: &str, now: Millis) {
        self.starts.push((run.to_string(), attempt, worker.to_string(), now));
        self.open.insert((run.to_string(), attempt), now);
    }

    pub fn end_live(&mut self, run: &str, attempt: u32, now: Millis) {
        if let Some(from) = self.open.remove(&(run.to_string(), attempt)) {
            self.segments.push((run.to_string(), attempt, from, now));
        }
    }

    pub fn resume_live(&mut self, run: &str, attempt: u32, now: Millis) {
        self.open.insert((run.to_string(), attempt), now);
    }

    /// The worker was crashed, paused or cut off from `from` to `until`.
    pub fn disrupted(&mut self, worker: &str, from: Millis, until: Millis) {
        self.disruptions.push((worker.to_string(), from, until));
    }

    /// Whether `worker` was crashed, paused, cut off or fenced itself at
    /// some time in `from..=to`.
    pub fn was_disrupted(&self, worker: &str, from: Millis, to: Millis) -> bool {
        self.disruptions.iter().any(|(w, a, b)| w == worker && *a <= to && *b >= from)
            || self.self_fences.iter().any(|(w, t)| w == worker && (from..=to).contains(t))
    }

    pub fn note(&mut self, now: Millis, what: String) {
        self.log.push((now, what));
    }

    pub fn recorded(&mut self, run: &str, attempt: u32, outcome: i32) {
        self.recorded.push((run.to_string(), attempt, outcome));
    }

    /// Closes the segments still open at the end.
    pub fn close(&mut self, now: Millis) {
        for ((run, attempt), from) in std::mem::take(&mut self.open) {
            self.segments.push((run, attempt, from, now));
        }
    }
}
