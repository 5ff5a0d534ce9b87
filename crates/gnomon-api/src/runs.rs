//! Runs and their attempts.

use gnomon_core::{AttemptState, RunState};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One run: a job's firing for one scheduled time (or one manual trigger).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Run {
    /// Derived from the job and the scheduled time: the idempotency key
    /// handed to the job.
    pub id: String,
    pub job: String,
    pub namespace: String,
    pub scheduled_at: String,
    pub fired_at: String,
    pub state: RunState,
    /// The current attempt number (0 before the first).
    pub attempt: u32,
    /// Why it ended as it did, or why it is retrying.
    pub reason: Option<String>,
    pub manual: bool,
    /// When a retrying run's next attempt is due.
    pub next_attempt_at: Option<String>,
    pub cancel_requested: bool,
    pub updated_at: String,
    /// Its attempts, oldest first (on a single run's answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<Attempt>>,
    /// Why a pending run has not been assigned yet, when the leader knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// The notifications its outcomes raised (on a single run's answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<Vec<RunNotification>>,
}

/// One notification of a run: where it goes and how its delivery stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunNotification {
    pub id: String,
    /// `failed`, `succeeded`, `late` or `recovered`.
    pub outcome: String,
    /// `webhook` or `slack`.
    pub kind: String,
    /// Where it goes: the target URL's origin only (scheme, host, port;
    /// its path may hold a credential).
    pub destination: String,
    /// `pending`, `sent`, `failed` (given up) or `skipped` (not due).
    pub state: String,
    /// Deliveries tried so far.
    pub attempts: u32,
    /// When a pending one is tried next.
    pub next_at: Option<String>,
    /// The last failed delivery's error, or why it was skipped.
    pub last_error: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// One execution of a run on a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Attempt {
    pub attempt: u32,
    pub worker: String,
    /// The leader's fencing token when it assigned the attempt.
    pub token: u64,
    pub state: AttemptState,
    pub assigned_at: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    pub exit_code: Option<i32>,
    /// The tail of its output (stdout and stderr, at most 64 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

/// A page of runs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    pub runs: Vec<Run>,
    /// Pass as `cursor=` for the next page; none on the last page.
    pub next_cursor: Option<String>,
}

/// The answer to a trigger with `count` above 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Triggered {
    pub count: usize,
    pub ids: Vec<String>,
}

/// A trigger's answer: the run (one run), or the ids (`count` above 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum TriggerAnswer {
    Many(Triggered),
    One(Box<Run>),
}

impl TriggerAnswer {
    /// The ids of the runs it created.
    pub fn ids(&self) -> Vec<String> {
        match self {
            TriggerAnswer::Many(t) => t.ids.clone(),
            TriggerAnswer::One(r) => vec![r.id.clone()],
        }
    }
}
