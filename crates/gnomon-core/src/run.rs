//! The run state machine: a run's lifecycle (README "Semantics"; ARCHITECTURE.md invariant 3).
//!
//! `pending → assigned → running → succeeded`; an attempt can end `failed`,
//! `timed_out` or `lost`, and the run then goes `retrying → pending` while
//! attempts remain, else `failed`. `cancelled` and `skipped` are terminal too.
//! A dependency run starts `waiting` for its upstreams and becomes
//! `pending` (or `skipped`) once they have decided it.
//! Terminal states are final.

use serde::{Deserialize, Serialize};

/// Where a run is in its lifecycle: `waiting`, `pending`, `assigned`,
/// `running` and `retrying` are open; `succeeded`, `failed`, `cancelled` and `skipped`
/// are terminal and final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// A dependency run waiting for its upstreams' runs of the same instant
    /// to end (its `waiting_for` names them).
    Waiting,
    /// Waiting for a worker: just fired or triggered, or a retry whose
    /// delay has passed.
    Pending,
    /// An attempt has been handed to a worker, which has not reported its
    /// start yet (it may be queued behind the worker's running attempts).
    Assigned,
    /// An attempt is executing on a worker.
    Running,
    /// An attempt failed, timed out or was lost and attempts remain: the
    /// next one is due at the run's `next_attempt_at`.
    Retrying,
    /// An attempt succeeded.
    Succeeded,
    /// The last allowed attempt failed, timed out or was lost.
    Failed,
    /// Cancelled on request, or by the job's `replace` overlap policy.
    Cancelled,
    /// Never executed: a scheduled time the misfire or overlap policy
    /// skipped; the run's `reason` says why.
    Skipped,
}

/// Every run state, in lifecycle order.
pub const ALL_RUN_STATES: [RunState; 9] = [
    RunState::Waiting,
    RunState::Pending,
    RunState::Assigned,
    RunState::Running,
    RunState::Retrying,
    RunState::Succeeded,
    RunState::Failed,
    RunState::Cancelled,
    RunState::Skipped,
];

impl RunState {
    /// The state's name as the API and the store write it (`pending`,
    /// `succeeded`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Waiting => "waiting",
            RunState::Pending => "pending",
            RunState::Assigned => "assigned",
            RunState::Running => "running",
            RunState::Retrying => "retrying",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
            RunState::Skipped => "skipped",
        }
    }

    /// The state named `text` (as [`as_str`](Self::as_str) writes it);
    /// `None` for any other text.
    pub fn parse(text: &str) -> Option<Self> {
        ALL_RUN_STATES.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether the run has ended: `succeeded`, `failed`, `cancelled` or
    /// `skipped`. A terminal state never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(self, RunState::Succeeded | RunState::Failed | RunState::Cancelled | RunState::Skipped)
    }

    /// A run that occupies (or is about to occupy) a worker slot.
    pub fn is_active(self) -> bool {
        matches!(self, RunState::Assigned | RunState::Running)
    }

    /// Whether `self → to` is a transition of the lifecycle.
    pub fn can_become(self, to: RunState) -> bool {
        use RunState::*;
        match self {
            Waiting => matches!(to, Pending | Cancelled | Skipped),
            Pending => matches!(to, Assigned | Cancelled | Skipped),
            // An attempt may finish before its start is recorded, and an
            // undeliverable assignment goes back to pending.
            Assigned => matches!(to, Running | Succeeded | Failed | Retrying | Cancelled | Pending),
            Running => matches!(to, Succeeded | Failed | Retrying | Cancelled),
            Retrying => matches!(to, Pending | Cancelled),
            Succeeded | Failed | Cancelled | Skipped => false,
        }
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where one attempt of a run (one execution on a worker) is: `assigned`
/// and `running` are live; the others are how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    /// Handed to a worker, not started yet (it may wait in the worker's
    /// prefetch queue).
    Assigned,
    /// The worker started it.
    Running,
    /// It ended well: exit code 0, the expected HTTP status, or a handler
    /// that returned without error.
    Succeeded,
    /// It ended badly: a non-zero exit code or a signal, another HTTP
    /// status or a failed request, a handler error, or it could not start.
    Failed,
    /// It ran past the job's `timeout` and was killed.
    TimedOut,
    /// Its worker stopped holding it: the worker's lease ran out, the
    /// worker drained before the attempt ended or fenced itself, or the
    /// assignment never reached it.
    Lost,
    /// Stopped because its run was cancelled.
    Cancelled,
}

/// Every attempt state, live ones first.
pub const ALL_ATTEMPT_STATES: [AttemptState; 7] = [
    AttemptState::Assigned,
    AttemptState::Running,
    AttemptState::Succeeded,
    AttemptState::Failed,
    AttemptState::TimedOut,
    AttemptState::Lost,
    AttemptState::Cancelled,
];

impl AttemptState {
    /// The state's name as the API and the store write it (`timed_out`
    /// for [`TimedOut`](Self::TimedOut), snake case throughout).
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptState::Assigned => "assigned",
            AttemptState::Running => "running",
            AttemptState::Succeeded => "succeeded",
            AttemptState::Failed => "failed",
            AttemptState::TimedOut => "timed_out",
            AttemptState::Lost => "lost",
            AttemptState::Cancelled => "cancelled",
        }
    }

    /// The state named `text` (as [`as_str`](Self::as_str) writes it);
    /// `None` for any other text.
    pub fn parse(text: &str) -> Option<Self> {
        ALL_ATTEMPT_STATES.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether the attempt is still held by its worker (`assigned` or
    /// `running`), as opposed to ended.
    pub fn is_live(self) -> bool {
        matches!(self, AttemptState::Assigned | AttemptState::Running)
    }
}

/// What the run becomes once attempt `attempt` ended with `outcome`.
pub fn run_state_after_attempt(outcome: AttemptState, attempt: u32, max_attempts: u32) -> RunState {
    match outcome {
        AttemptState::Succeeded => RunState::Succeeded,
        AttemptState::Cancelled => RunState::Cancelled,
        AttemptState::Failed | AttemptState::TimedOut | AttemptState::Lost if attempt < max_attempts => RunState::Retrying,
        AttemptState::Failed | AttemptState::TimedOut | AttemptState::Lost => RunState::Failed,
        // A live outcome is not an end; keep the run where an attempt runs.
        AttemptState::Assigned => RunState::Assigned,
        AttemptState::Running => RunState::Running,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn terminal_states_are_final() {
        for from in ALL_RUN_STATES.into_iter().filter(|s| s.is_terminal()) {
            for to in ALL_RUN_STATES {
                assert!(!from.can_become(to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn happy_path_and_retry_path() {
        use RunState::*;
        for (a, b) in [(Pending, Assigned), (Assigned, Running), (Running, Succeeded), (Running, Retrying), (Retrying, Pending)] {
            assert!(a.can_become(b));
        }
        assert!(!Pending.can_become(Running));
        assert!(!Retrying.can_become(Running));
        // A waiting run is released, skipped or cancelled; nothing else.
        for to in ALL_RUN_STATES {
            assert_eq!(Waiting.can_become(to), matches!(to, Pending | Skipped | Cancelled), "waiting -> {to}");
        }
        assert!(!Waiting.is_terminal() && !Waiting.is_active());
        assert_eq!(run_state_after_attempt(AttemptState::Failed, 1, 3), Retrying);
        assert_eq!(run_state_after_attempt(AttemptState::Lost, 3, 3), Failed);
        assert_eq!(run_state_after_attempt(AttemptState::TimedOut, 2, 3), Retrying);
        assert_eq!(run_state_after_attempt(AttemptState::Succeeded, 1, 1), Succeeded);
    }

    proptest! {
        /// Any walk through allowed transitions never leaves a terminal state
        /// and strings round-trip.
        #[test]
        fn random_walks_respect_finality(steps in proptest::collection::vec(0usize..9, 0..50)) {
            let mut state = RunState::Pending;
            for i in steps {
                let to = ALL_RUN_STATES[i];
                if state.can_become(to) {
                    prop_assert!(!state.is_terminal());
                    state = to;
                }
                prop_assert_eq!(RunState::parse(state.as_str()), Some(state));
            }
        }
    }
}
