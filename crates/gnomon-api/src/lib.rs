//! The REST API's types: what every `/v1` endpoint takes and answers, shared
//! by the server (which builds them) and the CLI (which reads them). Their
//! OpenAPI schemas are derived from the same definitions, so the document
//! the server publishes cannot drift from what it sends.
//!
//! Timestamps are RFC 3339 strings in UTC with millisecond precision.

#![warn(missing_docs)]

pub mod backfills;
pub mod cluster;
pub mod jobs;
pub mod runs;
pub mod status;

pub use backfills::{Backfill, BackfillList, BackfillRequest};
pub use cluster::{ClusterMember, ClusterStatus, NewLearner, Removed};
pub use jobs::{Job, JobList, JobStatus, PreviewFire, SchedulePreview, SchedulePreviewRequest};
pub use runs::{Attempt, GraphRun, HookRun, Run, RunGraph, RunList, RunNotification, RunOutput, TriggerAnswer, TriggerBody, Triggered};
pub use status::{Backpressure, Caller, ClockInfo, Health, Leader, Ready, Worker, WorkerList, WorkerState};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every error answer: `{"error": {"code", "message"}}` with a 4xx or 5xx
/// status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The content of an error answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable, machine-readable code such as `invalid_cron`, `not_found`
    /// or `not_leader`.
    pub code: String,
    /// What went wrong, for a person; field errors start with the field's
    /// path (`schedule.cron: …`).
    pub message: String,
    /// With `quota_exceeded` (429): which quota of which namespace the
    /// request would have passed, its limit, what is in use and what was
    /// asked. The answer's `Retry-After` says when to ask again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<gnomon_core::quota::QuotaExceeded>,
}

impl ErrorBody {
    /// An error answer with the given code and message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { error: ErrorDetail { code: code.into(), message: message.into(), quota: None } }
    }
}
