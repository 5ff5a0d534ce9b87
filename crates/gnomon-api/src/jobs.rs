//! Jobs and schedule previews.

use gnomon_core::spec::{JobSpec, ScheduleSpec};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A job: its spec as written (normalised) and its status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Job {
    #[serde(flatten)]
    pub spec: JobSpec,
    pub status: JobStatus,
}

/// What the server keeps about a job besides its spec (read-only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobStatus {
    /// Bumped by every change; pass it back as `If-Match` or `?version=`.
    pub version: u64,
    pub paused: bool,
    pub created_at: String,
    pub updated_at: String,
    /// The newest scheduled time the leader has fired.
    pub last_scheduled_at: Option<String>,
    /// When it fires next (none when paused, manual or finished).
    pub next_fire_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    pub jobs: Vec<Job>,
}

/// `POST /v1/schedules/preview`: a schedule as a job names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulePreviewRequest {
    pub schedule: ScheduleSpec,
    /// How many fire times to list (1 to 100, default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// List the fire times after this instant (RFC 3339; default now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// The next fire times of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SchedulePreview {
    /// The zone wall-clock times are shown in (a cron schedule's own; UTC
    /// for `every` and `at`).
    pub timezone: String,
    pub after: String,
    pub fires: Vec<PreviewFire>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PreviewFire {
    /// The instant, in UTC.
    pub at: String,
    /// The same instant on the zone's wall clock, with its offset.
    pub local: String,
    /// The zone's offset from UTC then, e.g. `+02:00`.
    pub offset: String,
    /// The offset at the previous fire when it differs: the clocks changed
    /// between the two.
    pub offset_changed_from: Option<String>,
    /// What the daylight-saving policy did to this fire, when it did anything.
    pub note: Option<String>,
}
