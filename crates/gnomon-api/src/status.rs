//! Workers, leadership, health and readiness.

use std::collections::BTreeMap;

use gnomon_core::backpressure::Pressure;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::cluster::ClusterStatus;

/// Whether a worker session takes work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Connected and taking work.
    Live,
    /// Finishing what it holds; takes no new work.
    Draining,
    /// Its stream is gone; its lease has not expired yet.
    Disconnected,
}

/// One worker session, as the leader sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Worker {
    /// The worker's id, stable across its restarts (`--id`, or one it
    /// generated once and keeps in its data dir).
    pub id: String,
    /// This session's id, given by the leader when the worker connected
    /// (`<worker id>-<8 hex digits>`); every new connection gets a new one.
    pub session: String,
    /// The labels it announced (`--label KEY=VALUE`), which a job's
    /// `route.labels` select on.
    pub labels: BTreeMap<String, String>,
    /// The namespaces whose runs it may be given (its credential's);
    /// absent: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
    /// Attempts it runs at once.
    pub capacity: usize,
    /// Assignments it queues beyond its capacity.
    pub prefetch: usize,
    /// Attempts it holds now (executing or queued).
    pub running: usize,
    /// `running / capacity`.
    pub load: f64,
    /// Whether it takes work.
    pub state: WorkerState,
    /// When its lease runs out unless a heartbeat renews it: its attempts
    /// are then `lost` and retried elsewhere.
    pub lease_expires_at: String,
    /// Executor kinds it runs (`shell`, `http`, `handler`).
    pub executors: Vec<String>,
    /// Handler names it has registered.
    pub handlers: Vec<String>,
}

/// `GET /v1/workers`: the worker sessions the leader holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkerList {
    /// The sessions, sorted by worker id; a disconnected one is listed
    /// until its lease runs out.
    pub workers: Vec<Worker>,
}

/// The leader's admission state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Backpressure {
    /// The current state: `green`, `yellow` (dispatch throttled) or `red`
    /// (new fires deferred).
    pub state: Pressure,
    /// Runs waiting for a worker.
    pub pending: usize,
    /// The leader's `--max-pending`: yellow from 70 % of it, red from 90 %.
    pub max_pending: usize,
}

/// How this server's clock compares with the leader's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClockInfo {
    /// This server's wall clock minus the leader's, in ms (none: unknown).
    pub skew_ms: Option<i64>,
    /// `ok`, `warn` (past `--max-clock-skew`) or `step_down`.
    pub verdict: Option<String>,
    /// When this server last gave up or refused leadership for its clock.
    pub stepped_down_at: Option<String>,
}

/// `GET /v1/leader`: who leads the scheduler now, as this server sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Leader {
    /// The leadership scope: `scheduler`.
    pub scope: String,
    /// The election backend (`sqlite`, `mysql`, `postgres`, `etcd`, `raft`, `local`).
    pub backend: String,
    /// The leading node's id (none: no leader recorded).
    pub holder: Option<String>,
    /// The leader's fencing token.
    pub token: Option<u64>,
    /// The leader's advertised address.
    pub address: Option<String>,
    /// When the leader's term began (when it fenced the store with its
    /// token); absent: no leader recorded.
    pub since: Option<String>,
    /// The newest committed leader time: firing never goes below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_time: Option<String>,
    /// Whether the server that answered is the leader.
    pub is_self: bool,
    /// The node that answered.
    pub answered_by: String,
    /// The leader's admission state (on the leader only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backpressure: Option<Backpressure>,
    /// How the answering server's clock compares with the leader's.
    pub clock: ClockInfo,
    /// The raft cluster, on a `raft://` member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raft: Option<ClusterStatus>,
}

/// `GET /healthz`: the process is up (no credential needed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok`: the process answers.
    pub status: String,
}

/// `GET /readyz`: this server can serve (no credential needed); it
/// answers 503 with an error instead when it cannot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Ready {
    /// `ready`: a leader is recorded and the store answers.
    pub status: String,
    /// Whether this server is the leader.
    pub leading: bool,
}

/// `GET /v1/whoami`: the credential a call was made with, and what it may do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Caller {
    /// The credential's name (`anonymous` on a server without credentials).
    pub name: String,
    /// `viewer` (reads), `operator` (also triggers, pause, resume, cancel) or
    /// `admin` (also jobs and the cluster).
    pub role: String,
    /// The namespaces it may see and touch; none: all.
    pub namespaces: Option<Vec<String>>,
}
