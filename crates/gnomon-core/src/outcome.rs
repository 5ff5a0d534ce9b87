//! What an attempt ended with, as its executor reports it and the leader
//! records it.

use crate::AttemptState;

/// An attempt's end.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecOutcome {
    /// `Succeeded`, `Failed`, `TimedOut` or `Cancelled`.
    pub state: AttemptState,
    /// Process exit code (shell) or HTTP status (http); `None` when the
    /// attempt never ran to an exit (it could not start, timed out or was
    /// cancelled).
    pub exit_code: Option<i32>,
    /// The attempt's output: the tail of stdout and stderr, an HTTP
    /// response body, or why it failed.
    pub output: String,
    /// What a failed attempt asked of its run's retry policy.
    pub retry: RetryHint,
}

/// What a failed attempt asks of its run's retry policy (a handler's
/// `NonRetryable` or `RetryAfter`). Only a `Failed` attempt's hint counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RetryHint {
    /// The job's retry policy decides.
    #[default]
    Policy,
    /// Do not retry: the run fails now.
    Never,
    /// Retry no sooner than this many milliseconds after the attempt
    /// ended, in place of the job's backoff (still within its
    /// `max_attempts`; capped at [`MAX_RETRY_AFTER_MS`]).
    After(u64),
}

/// The longest delay a [`RetryHint::After`] may ask for: a day.
pub const MAX_RETRY_AFTER_MS: u64 = 24 * 3600 * 1000;

impl RetryHint {
    /// The hint of a worker report's `no_retry` and `retry_after_ms`.
    pub fn from_report(no_retry: bool, retry_after_ms: u64) -> Self {
        match (no_retry, retry_after_ms) {
            (true, _) => RetryHint::Never,
            (false, 0) => RetryHint::Policy,
            (false, ms) => RetryHint::After(ms.min(MAX_RETRY_AFTER_MS)),
        }
    }
}

impl ExecOutcome {
    /// A failure with `message` as its output and no exit code.
    pub fn failed(message: impl Into<String>) -> Self {
        Self { state: AttemptState::Failed, exit_code: None, output: message.into(), retry: RetryHint::Policy }
    }

    /// An end in `state` with `output`, no exit code and no retry hint.
    pub fn ended(state: AttemptState, output: impl Into<String>) -> Self {
        Self { state, exit_code: None, output: output.into(), retry: RetryHint::Policy }
    }
}
