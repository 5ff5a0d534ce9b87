//! Jobs and schedule previews.

use gnomon_core::spec::{JobSpec, ScheduleSpec};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A job: its spec as written (normalised) and its status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Job {
    /// The job's spec, normalised (namespace filled in, durations in
    /// canonical form); its fields sit at the top level of the object.
    #[serde(flatten)]
    pub spec: JobSpec,
    /// What the server keeps about the job besides its spec; ignored when
    /// the job is written back.
    pub status: JobStatus,
}

/// What the server keeps about a job besides its spec (read-only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobStatus {
    /// Bumped by every change; pass it back as `If-Match` or `?version=`.
    pub version: u64,
    /// Whether the job is paused: its schedule fires nothing until it is
    /// resumed, and times that elapse meanwhile are neither fired nor
    /// recorded. A paused job can still be triggered.
    pub paused: bool,
    /// When the job was created.
    pub created_at: String,
    /// When the job was last written: created, changed, paused or resumed
    /// (firing does not change it).
    pub updated_at: String,
    /// The newest scheduled time the leader has fired.
    pub last_scheduled_at: Option<String>,
    /// When it fires next (none when paused, manual or finished).
    pub next_fire_at: Option<String>,
}

/// `GET /v1/jobs`: the jobs the caller may see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    /// The jobs, sorted by namespace, then name.
    pub jobs: Vec<Job>,
}

/// `POST /v1/schedules/preview`: a schedule as a job names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulePreviewRequest {
    /// The schedule to preview, written as a job's `schedule`.
    pub schedule: ScheduleSpec,
    /// How many fire times to list (1 to 100, default 10).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "gnomon_core::int::option")]
    #[schema(minimum = 1, maximum = 100)]
    pub count: Option<u32>,
    /// List the fire times after this instant (RFC 3339; default now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<gnomon_core::schema::Instant>)]
    pub after: Option<String>,
    /// The job whose jitter delays the fires (a jittered schedule's delays
    /// depend on the job's namespace and name); without it, no `fire_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<gnomon_core::schema::Name>)]
    pub job: Option<String>,
    /// The namespace of `job` (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<gnomon_core::schema::Namespace>)]
    pub namespace: Option<String>,
}

/// The next fire times of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SchedulePreview {
    /// The zone wall-clock times are shown in (a cron schedule's own; UTC
    /// for `every` and `at`).
    pub timezone: String,
    /// The instant the listed fire times come after: the request's
    /// `after`, or the time the request was answered.
    pub after: String,
    /// The fire times, earliest first: `count` of them, or fewer when the
    /// schedule fires no more (an `at` schedule fires once, a manual one
    /// never, a bounded one not past its `end_at`).
    pub fires: Vec<PreviewFire>,
    /// The schedule's first possible instant, when it is bounded: none
    /// before it is listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    /// The schedule's last possible instant, when it is bounded: none
    /// after it is listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
}

/// One fire time of a schedule preview.
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
    /// When the instant fires, for a jittered schedule previewed with its
    /// `job`: `at` delayed by the job's jitter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fire_at: Option<String>,
}
