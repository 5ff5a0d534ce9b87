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
}

impl ExecOutcome {
    /// A failure with `message` as its output and no exit code.
    pub fn failed(message: impl Into<String>) -> Self {
        Self { state: AttemptState::Failed, exit_code: None, output: message.into() }
    }
}
