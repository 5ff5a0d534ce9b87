//! Workers, leadership, health and readiness.

use std::collections::BTreeMap;

use gnomon_core::backpressure::Pressure;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::cluster::ClusterStatus;

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
    pub id: String,
    pub session: String,
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
    pub state: WorkerState,
    pub lease_expires_at: String,
    /// Executor kinds it runs (`shell`, `http`, `handler`).
    pub executors: Vec<String>,
    /// Handler names it has registered.
    pub handlers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkerList {
    pub workers: Vec<Worker>,
}

/// The leader's admission state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Backpressure {
    pub state: Pressure,
    /// Runs waiting for a worker.
    pub pending: usize,
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
    pub scope: String,
    /// The election backend (`sqlite`, `mysql`, `postgres`, `etcd`, `raft`, `local`).
    pub backend: String,
    /// The leading node's id (none: no leader recorded).
    pub holder: Option<String>,
    /// The leader's fencing token.
    pub token: Option<u64>,
    /// The leader's advertised address.
    pub address: Option<String>,
    pub since: Option<String>,
    /// The newest committed leader time: firing never goes below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_time: Option<String>,
    pub is_self: bool,
    /// The node that answered.
    pub answered_by: String,
    /// The leader's admission state (on the leader only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backpressure: Option<Backpressure>,
    pub clock: ClockInfo,
    /// The raft cluster, on a `raft://` member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raft: Option<ClusterStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok`: the process answers.
    pub status: String,
}

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
