//! `/v1/namespaces`: each namespace's use of its quotas and its own
//! backpressure, as the leader counts them (a follower asks the leader).

use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::error::ApiResult;
use super::extract::{check_ns, Caller};
use super::state::ApiState;
use crate::leader::NamespaceUsage;

/// The namespaces a caller sees, with their usage.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NamespaceUsageList {
    /// Every namespace with open runs, running backfills or quotas of its
    /// own that the caller's credential covers, by name.
    pub namespaces: Vec<NamespaceUsage>,
}

/// Namespace `ns`'s usage on this leader (an empty one when it holds
/// nothing).
fn usage_of(state: &ApiState, ns: &str) -> NamespaceUsage {
    state
        .node
        .namespace_usage(ns)
        .unwrap_or_else(|| NamespaceUsage { namespace: ns.to_string(), ..NamespaceUsage::empty(state.node.config.leader.quotas.of(ns)) })
}

#[utoipa::path(get, path = "/v1/namespaces", tag = "cluster", summary = "Each namespace's use of its quotas",
    description = "The namespaces the credential covers that hold open runs or running backfills, or have quotas of their own: \
        their open runs by state, what counts against `open_runs` (open runs plus the instants running backfills have still to \
        create), running backfills, their own backpressure and their quotas, as the leader counts them.",
    responses((status = 200, body = NamespaceUsageList),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 502, body = gnomon_api::ErrorBody, description = "the leader could not be reached"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable")))]
pub(super) async fn list_usage(State(state): State<ApiState>, Caller(p): Caller, req: Request) -> ApiResult<Response> {
    if state.node.leading_token().is_none() {
        return super::forward::to_leader(&state, req).await;
    }
    let mut names: std::collections::BTreeSet<String> = state.node.namespace_usages().into_keys().collect();
    names.extend(state.node.config.leader.quotas.namespaces().map(str::to_string));
    let namespaces = names.iter().filter(|ns| p.sees(ns)).map(|ns| usage_of(&state, ns)).collect();
    Ok(Json(NamespaceUsageList { namespaces }).into_response())
}

#[utoipa::path(get, path = "/v1/namespaces/{namespace}", tag = "cluster", summary = "One namespace's use of its quotas",
    params(("namespace" = gnomon_core::schema::Namespace, Path, description = "The namespace")),
    responses((status = 200, body = NamespaceUsage),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 502, body = gnomon_api::ErrorBody, description = "the leader could not be reached"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable")))]
pub(super) async fn get_usage(
    State(state): State<ApiState>,
    Path(ns): Path<String>,
    Caller(p): Caller,
    req: Request,
) -> ApiResult<Response> {
    gnomon_core::spec::validate_name("namespace", &ns, gnomon_core::spec::MAX_NAMESPACE_LEN)?;
    check_ns(&p, &ns)?;
    if state.node.leading_token().is_none() {
        return super::forward::to_leader(&state, req).await;
    }
    Ok(Json(usage_of(&state, &ns)).into_response())
}
