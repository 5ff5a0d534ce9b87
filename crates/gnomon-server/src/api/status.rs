//! Workers, leadership, health, readiness, metrics and the API document.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gnomon_api::{Backpressure, ClockInfo, ClusterMember, ClusterStatus, Health, Leader, Ready, Worker, WorkerList, WorkerState};
use gnomon_core::format_millis;
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::extract::{marked, query, reader};
use super::state::ApiState;
use crate::node::SCOPE;

#[utoipa::path(get, path = "/v1/whoami", tag = "cluster", summary = "The credential this call was made with, and its role",
    responses((status = 200, body = gnomon_api::Caller),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call")))]
pub(super) async fn whoami(super::extract::Caller(p): super::extract::Caller) -> Json<gnomon_api::Caller> {
    Json(gnomon_api::Caller {
        name: p.name.to_string(),
        role: p.role.as_str().to_string(),
        namespaces: p.namespaces.as_ref().map(|n| n.to_vec()),
    })
}

#[utoipa::path(get, path = "/v1/workers", tag = "cluster", summary = "List worker sessions (as the leader sees them)",
    responses((status = 200, body = WorkerList),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 502, body = gnomon_api::ErrorBody, description = "the leader could not be reached"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable")))]
pub(super) async fn list_workers(State(state): State<ApiState>, req: axum::extract::Request) -> ApiResult<Response> {
    if state.node.leading_token().is_none() {
        // Worker sessions live on the leader: a follower asks it.
        return super::forward::to_leader(&state, req).await;
    }
    let workers = state
        .node
        .workers()
        .into_iter()
        .map(|w| Worker {
            state: if !w.connected {
                WorkerState::Disconnected
            } else if w.draining {
                WorkerState::Draining
            } else {
                WorkerState::Live
            },
            lease_expires_at: format_millis(w.lease_expires_at),
            id: w.id,
            session: w.session,
            labels: w.labels,
            namespaces: w.namespaces,
            capacity: w.capacity,
            prefetch: w.prefetch,
            running: w.running,
            load: w.load,
            executors: w.executors,
            handlers: w.handlers,
        })
        .collect();
    Ok(Json(WorkerList { workers }).into_response())
}

/// A raft member's view of its cluster, as the API shows it.
pub fn cluster_view(st: gnomon_backend::raft::Status) -> ClusterStatus {
    ClusterStatus {
        this: st.this,
        state: st.state,
        term: st.term,
        leader: st.leader,
        last_log: st.last_log,
        applied: st.applied,
        snapshot: st.snapshot,
        members: st.members.into_iter().map(|m| ClusterMember { id: m.id, address: m.address, role: m.role, matched: m.matched }).collect(),
        degraded: st.degraded,
    }
}

/// A raft member that cannot serve: its state, said plainly.
fn degraded(st: &gnomon_backend::raft::Status, why: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "degraded",
        format!(
            "this member of the raft cluster is {} in term {} and {}: it serves no reads and takes no writes ({why})",
            st.state,
            st.term,
            if st.leader.is_some() { "cannot confirm reads with the leader" } else { "knows no leader" }
        ),
    )
}

#[utoipa::path(get, path = "/v1/leader", tag = "cluster", summary = "Who leads the scheduler now, as this server sees it",
    params(("stale" = Option<bool>, Query, nullable = false, description = "Read this replica's copy without confirming it with the leader")),
    responses((status = 200, body = Leader),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable")))]
pub(super) async fn leader(State(state): State<ApiState>, uri: axum::http::Uri) -> ApiResult<impl IntoResponse> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Q {
        stale: Option<bool>,
    }
    let q: Q = query(uri.query())?;
    let raft = state.raft.as_ref().map(|s| s.member.status());
    let record = match reader(&state, q.stale).leadership(SCOPE).await {
        Ok(r) => r,
        Err(e) => return Err(raft.as_ref().map_or_else(|| ApiError::from(e.clone()), |st| degraded(st, &e))),
    };
    let me = state.node.leading_token();
    let clock = state.node.clock_status();
    let clock = ClockInfo {
        skew_ms: clock.skew_ms,
        verdict: clock.verdict.map(|v| v.as_str().to_string()),
        stepped_down_at: clock.stepped_down_at.map(format_millis),
    };
    let backpressure = state.node.pressure().map(|p| Backpressure { state: p.state, pending: p.pending, max_pending: p.max_pending });
    let answer = match record {
        Some(r) => Leader {
            is_self: me == Some(r.token) && r.holder == state.node.config.node_id,
            scope: r.scope,
            backend: r.backend,
            holder: Some(r.holder),
            token: Some(r.token),
            address: Some(r.address),
            since: Some(format_millis(r.since)),
            leader_time: (r.leader_time > 0).then(|| format_millis(r.leader_time)),
            answered_by: state.node.config.node_id.clone(),
            backpressure,
            clock,
            raft: raft.map(cluster_view),
        },
        None => Leader {
            scope: SCOPE.to_string(),
            backend: state.node.elector_backend.to_string(),
            holder: None,
            token: None,
            address: None,
            since: None,
            leader_time: None,
            is_self: false,
            answered_by: state.node.config.node_id.clone(),
            backpressure: None,
            clock,
            raft: raft.map(cluster_view),
        },
    };
    Ok(marked(q.stale, Json(answer)))
}

/// How long a readiness answer is reused: `/readyz` needs no credential,
/// so a flood of probes must not become a flood of store queries.
const READY_CACHE: std::time::Duration = std::time::Duration::from_secs(1);

#[utoipa::path(get, path = "/healthz", tag = "operations", summary = "The process answers (no credential)",
    security(()), responses((status = 200, body = Health),
        (status = 403, body = gnomon_api::ErrorBody, description = "the Host or Origin is refused (a defence against DNS rebinding and cross-site requests)")))]
pub(super) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into() })
}

#[utoipa::path(get, path = "/readyz", tag = "operations", summary = "A leader is recorded and this server can reach the store (no credential)",
    security(()), responses((status = 200, body = Ready), (status = 503, body = gnomon_api::ErrorBody),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the Host or Origin is refused (a defence against DNS rebinding and cross-site requests)")))]
pub(super) async fn readyz(State(state): State<ApiState>) -> Response {
    if let Some(st) = state.raft.as_ref().map(|s| s.member.status()).filter(|st| st.degraded) {
        return degraded(&st, "no leader").into_response();
    }
    let cached = state.ready.lock().ok().and_then(|c| c.clone()).filter(|(at, _)| at.elapsed() < READY_CACHE).map(|(_, r)| r);
    let result = match cached {
        Some(r) => r,
        None => {
            let r = match state.node.store.leadership(SCOPE).await {
                Ok(record) => Ok(record.is_some()),
                Err(e) => Err(ApiError::from(e)),
            };
            if let Ok(mut c) = state.ready.lock() {
                *c = Some((std::time::Instant::now(), r.clone()));
            }
            r
        }
    };
    match result {
        Ok(true) => Json(Ready { status: "ready".into(), leading: state.node.leading_token().is_some() }).into_response(),
        Ok(false) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "no_leader", "no leader has been elected yet").into_response(),
        Err(e) => match state.raft.as_ref().map(|s| s.member.status()) {
            Some(st) => degraded(&st, &e.message).into_response(),
            None => e.into_response(),
        },
    }
}

pub(super) async fn metrics_text(State(state): State<ApiState>) -> Response {
    match &state.metrics {
        Some(h) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.render()).into_response(),
        None => ApiError::new(StatusCode::NOT_FOUND, "not_found", "metrics are not enabled").into_response(),
    }
}
