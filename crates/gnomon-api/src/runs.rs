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
    /// The job's name.
    pub job: String,
    /// The job's namespace.
    pub namespace: String,
    /// The scheduled time this run is for. A manual run is given an instant
    /// of its own at or just after the trigger's time (1 ms apart for the
    /// runs of one trigger).
    pub scheduled_at: String,
    /// When the leader created the run (for a skipped run, when it recorded
    /// the skip); later than `scheduled_at` for a time fired late.
    pub fired_at: String,
    /// Where the run is in its lifecycle.
    pub state: RunState,
    /// The current attempt number (0 before the first).
    pub attempt: u32,
    /// Why it ended as it did, or why it is retrying.
    pub reason: Option<String>,
    /// Whether a trigger created the run, rather than the schedule.
    pub manual: bool,
    /// When a retrying run's next attempt is due.
    pub next_attempt_at: Option<String>,
    /// A cancel was requested while an attempt was live (assigned or
    /// running): the leader is having its worker stop it.
    pub cancel_requested: bool,
    /// When the run was last written (a change of state or attempt, a
    /// cancel request).
    pub updated_at: String,
    /// Its attempts, oldest first (on a single run's answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<Attempt>>,
    /// Why a pending run has not been assigned yet, when the leader knows;
    /// for a `waiting` run, the upstreams it still waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// The runs of its instant that it runs after and that run after it
    /// (on a single run's answer, for a job with upstreams or dependents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<RunGraph>,
    /// The notifications its outcomes raised (on a single run's answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<Vec<RunNotification>>,
    /// The values of its params (its job's defaults with what its trigger
    /// set): what every attempt of it runs with. Absent for a job without
    /// params.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub params: Option<serde_json::Value>,
    /// The body of the webhook call that started it, as text (on a single
    /// run's answer; absent for other runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

/// The dependency graph of one run's instant: its upstreams' runs and its
/// dependents' runs of the same `scheduled_at`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunGraph {
    /// One entry per run of an upstream at the instant (an upstream with
    /// none has one entry without a run), in the order the job names them.
    pub upstream: Vec<GraphRun>,
    /// One entry per job that runs after this run's job, with its run of
    /// the instant if it has one.
    pub downstream: Vec<GraphRun>,
}

/// A job's run at the instant of a dependency graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GraphRun {
    /// The job.
    pub job: String,
    /// The outcomes of the upstream's run the edge runs on (`succeeded`,
    /// `failed` or `any`).
    pub on: gnomon_core::deps::On,
    /// The run, if the job has one at the instant.
    pub id: Option<String>,
    /// Its state.
    pub state: Option<RunState>,
}

/// One notification of a run: where it goes and how its delivery stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunNotification {
    /// The notification's id, `<run id>/<outcome>/<target>` (`target` is
    /// the target's index in the job's `notify`, from 0): the `id` of the
    /// body and the `Gnomon-Notification-Id` header of every delivery.
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
    /// When the outcome raised it (written together with the outcome).
    pub created_at: String,
    /// When its state or its delivery count last changed.
    pub updated_at: String,
}

/// One execution of a run on a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Attempt {
    /// Its number within the run, from 1 (`GNOMON_ATTEMPT`).
    pub attempt: u32,
    /// The id of the worker it was assigned to.
    pub worker: String,
    /// The leader's fencing token when it assigned the attempt.
    pub token: u64,
    /// Whether it is live, or how it ended.
    pub state: AttemptState,
    /// When the leader assigned it to the worker.
    pub assigned_at: String,
    /// When the worker reported its start; absent before that, and when
    /// it ended without its start being recorded.
    pub started_at: Option<String>,
    /// When it ended; absent while it is live.
    pub ended_at: Option<String>,
    /// A shell command's exit status (128 + the signal's number when a
    /// signal ended it) or an HTTP request's answer status. Absent while
    /// the attempt is live, and when there is none: a handler, a timeout,
    /// a cancel, a lost attempt, a command that could not start, a request
    /// that got no answer.
    pub exit_code: Option<i32>,
    /// The tail of its output (stdout and stderr, at most 64 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

/// A page of runs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    /// The runs of this page (at most `limit`), without their attempts.
    pub runs: Vec<Run>,
    /// Pass as `cursor=` for the next page; none on the last page.
    pub next_cursor: Option<String>,
}

/// The answer to a trigger with `count` above 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Triggered {
    /// How many runs it created: the request's `count`.
    pub count: usize,
    /// The new runs' ids, in the order of their scheduled instants.
    pub ids: Vec<String>,
}

/// A manual trigger's body (optional): empty, `null` and `{}` all set no
/// params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerBody {
    /// Values of the job's params, by name (each a param the job
    /// declares); the others keep their defaults.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schema(value_type = std::collections::BTreeMap<gnomon_core::schema::ParamName, gnomon_core::schema::ParamValue>)]
    pub params: std::collections::BTreeMap<String, serde_json::Value>,
}

/// A webhook call's answer: the run it started (or its key named), and
/// nothing of the run's params, payload or output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HookRun {
    /// The run's id.
    pub id: String,
    /// The run's state now.
    pub state: RunState,
}

impl<'de> Deserialize<'de> for TriggerBody {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            #[serde(default)]
            params: std::collections::BTreeMap<String, serde_json::Value>,
        }
        Ok(Option::<Fields>::deserialize(d)?.map(|f| TriggerBody { params: f.params }).unwrap_or_default())
    }
}

/// A trigger's answer: the run (one run), or the ids (`count` above 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum TriggerAnswer {
    /// `count` above 1: how many runs were created, and their ids.
    Many(Triggered),
    /// `count` 1 (the default): the new run.
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

/// A piece of an attempt's output: live while the attempt runs (what its
/// worker has streamed so far, read on from `next`), else the output kept
/// with the attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunOutput {
    /// The run's id.
    pub run_id: String,
    /// The attempt (0: the run has had none yet).
    pub attempt: u32,
    /// The run's state now.
    pub state: RunState,
    /// Whether the attempt is running and this is its live output. Once
    /// it is `false` there is nothing more to follow: `text` is the rest
    /// of the live output from `from` when `from` > 0 (asked with `from` >
    /// 0 soon after the attempt ended), else the output kept with the
    /// attempt (its last 64 KiB).
    pub live: bool,
    /// Where `text` starts in the attempt's live output (0: `text` is the
    /// kept output, or the live output from its start).
    #[schema(minimum = 0)]
    pub from: u64,
    /// Pass as `from=` for the next piece while `live`.
    #[schema(minimum = 0)]
    pub next: u64,
    /// Bytes before `from` that are no longer kept (only the newest 64 KiB
    /// of a live attempt are).
    #[schema(minimum = 0)]
    pub skipped: u64,
    /// The output (at most 64 KiB per answer).
    pub text: String,
}
