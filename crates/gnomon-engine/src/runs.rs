//! runs

use gnomon_core::outcome::RetryHint;
use gnomon_core::outcome::MAX_RETRY_AFTER_MS;
use gnomon_core::run::run_state_after_attempt;

use crate::plan::TurnPlan;
use crate::runbook::OpenRun;
use crate::runbook::RunBook;
use crate::runbook::RunId;
use crate::Engine;
use gnomon_core::AttemptState;
use gnomon_core::Millis;
use gnomon_core::RunState;
use gnomon_records::AttemptChange;
use gnomon_records::NewRun;
use gnomon_records::Transition;
use std::sync::Arc;

impl Engine {
    /// The shared id of an open run (a new one if the run is not open).
    pub fn rid(&self, id: &str) -> RunId {
        self.cache.runs.rid(id)
    }

    /// Tracks a newly created run: a pending one is queued for dispatch, a
    /// waiting one is indexed under its upstreams; one created ended (a
    /// skip record) is not open, but may decide waiting runs.
    pub fn track_new(&mut self, run: NewRun, now: Millis) -> Option<RunId> {
        let id: RunId = Arc::from(run.id().as_str());
        if run.state.is_terminal() {
            self.cache.runs.upstream_ended(&id, Some(run.state));
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
        self.cache.runs.track(id.clone(), open);
        if run.state == RunState::Pending {
            self.cache.runs.queue(id.clone());
        }
        Some(id)
    }

    /// Tracks a newly created pending run and queues it for dispatch.
    pub fn track_pending(&mut self, run: NewRun, now: Millis) -> RunId {
        debug_assert_eq!(run.state, RunState::Pending);
        let id = run.id();
        self.track_new(run, now).unwrap_or_else(|| Arc::from(id.as_str()))
    }

    /// Retrying runs whose time has come go back to pending.
    pub fn plan_retries<A>(&mut self, now: Millis, plan: &mut TurnPlan<A>) {
        for id in self.cache.runs.take_due_retries(now) {
            let Some(run) = self.cache.runs.get(&id) else { continue };
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
    pub fn mirror_state(&mut self, t: &Transition) {
        self.cache.runs.mirror(t);
    }

    /// Tracks an open run as the store has it: queued for dispatch when
    /// pending, on the retry heap when retrying (the caller places a live
    /// attempt).
    pub fn track_stored(&mut self, run: &gnomon_records::RunRecord, assigned_at: Millis, now: Millis) -> RunId {
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
        self.cache.runs.track(id.clone(), open);
        // A `replace` run: the job's older open runs are cancelled (again,
        // if a store error came between its write and their cancels).
        if run.reason.as_deref() == Some(RunBook::REPLACING_REASON) && run.state != RunState::Waiting {
            self.cache.runs.replace_later([(run.job_uid.clone(), run.scheduled_at)]);
        }
        match run.state {
            RunState::Pending => self.cache.runs.queue(id.clone()),
            RunState::Retrying => self.cache.runs.schedule_retry(run.next_attempt_at.unwrap_or(now), id.clone()),
            _ => {}
        }
        id
    }

    /// The transition that ends `attempt`'s run attempt with `outcome`.
    pub fn end_attempt(
        &mut self,
        id: &str,
        outcome: AttemptState,
        exit_code: Option<i32>,
        output: String,
        hint: RetryHint,
        now: Millis,
    ) -> Option<Transition> {
        let run = self.cache.runs.get(id)?;
        if !run.state.is_active() {
            return None;
        }
        let (max_attempts, backoff) =
            self.cache.jobs.get(&run.key.uid).map(|j| (j.max_attempts, j.backoff)).unwrap_or((1, Default::default()));
        // Only a failed attempt's hint counts (a worker cannot turn a lost
        // or timed-out attempt into a final failure).
        let hint = if outcome == AttemptState::Failed { hint } else { RetryHint::Policy };
        let to = match (run_state_after_attempt(outcome, run.attempt, max_attempts), hint) {
            (RunState::Retrying, RetryHint::Never) => RunState::Failed,
            (to, _) => to,
        };
        // The jitter's sample is drawn from the leader's own seeded RNG: the
        // same inputs give the same retry times.
        let sample = if to == RunState::Retrying { rand::Rng::gen::<f64>(&mut self.rng) } else { 0.0 };
        let run = self.cache.runs.get(id)?;
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
