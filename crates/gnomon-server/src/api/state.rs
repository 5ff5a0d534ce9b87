//! What every handler shares: the node, the credentials, the host policy,
//! the cached readiness answer, the raft service, the forwarder and the
//! worker bindings' cache.

use std::sync::Arc;

use crate::auth::Authenticator;
use crate::browser::HostPolicy;
use crate::node::NodeHandle;

use super::error::ApiError;
use super::forwarder::Forwarder;

/// The last readiness answer and when it was made (reused for a second).
pub type ReadyCheck = Option<(std::time::Instant, Result<bool, ApiError>)>;

#[derive(Clone)]
pub struct ApiState {
    pub node: NodeHandle,
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Who may call `/v1`, `/metrics` and the worker protocol.
    pub auth: Authenticator,
    /// The host names requests may be addressed to.
    pub hosts: Arc<HostPolicy>,
    /// The last readiness answer (reused for a second).
    pub ready: Arc<std::sync::Mutex<ReadyCheck>>,
    /// The `gnomon.raft.v1` service, on a member of a `raft://` cluster.
    pub raft: Option<gnomon_backend::raft::Service>,
    /// How leader-only calls made here reach the leader (`None`: answered
    /// `not_leader`).
    pub forward: Option<Forwarder>,
    /// The worker bindings the worker service confirmed in the store, as it
    /// caches them (an id released here leaves the cache at once).
    pub worker_owners: Arc<std::sync::Mutex<crate::sessions::Owners>>,
}

impl ApiState {
    /// A state with one admin token (or none) and the default host policy.
    pub fn new(node: NodeHandle, metrics: Option<metrics_exporter_prometheus::PrometheusHandle>, token: Option<&str>) -> Self {
        Self {
            node,
            metrics,
            auth: Authenticator::with_token(token),
            hosts: Arc::new(HostPolicy::default()),
            ready: Arc::default(),
            raft: None,
            forward: Some(Forwarder::plain()),
            worker_owners: Arc::default(),
        }
    }
}
