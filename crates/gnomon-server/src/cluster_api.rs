//! `/v1/cluster`: the members of a `raft://` cluster — status for viewers,
//! membership changes (learners, promotion, removal) for unrestricted
//! admins. On other stores there is no cluster to manage (404).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Json, Router};
use gnomon_api::{ClusterStatus, NewLearner, Removed};
use gnomon_backend::raft::{Change, ChangeError, Member};

use crate::api::authz::{delete, get, post, Policy};
use crate::api::error::{ApiError, ApiResult};
use crate::api::state::ApiState;
use crate::api::status::cluster_view;

pub fn routes() -> Router<ApiState> {
    const CHANGE: Policy = Policy::UnrestrictedAdmin("changing the cluster's members");
    Router::new()
        .route("/cluster", get(Policy::viewer("reading"), status))
        .route("/cluster/learners", post(CHANGE, add_learner))
        .route("/cluster/members/{id}/promote", post(CHANGE, promote))
        .route("/cluster/members/{id}", delete(CHANGE, remove))
}

fn member(state: &ApiState) -> ApiResult<Arc<Member>> {
    state.raft.as_ref().map(|s| s.member.clone()).ok_or_else(|| {
        ApiError::new(StatusCode::NOT_FOUND, "not_raft", "this server's store is not raft://; it has no cluster members to manage")
    })
}

fn member_id(raw: &str) -> ApiResult<u64> {
    raw.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "invalid_member", format!("{raw:?} is not a member id (1 or more)")))
}

fn change_error(e: ChangeError) -> ApiError {
    match e {
        ChangeError::Refused(m) => ApiError::new(StatusCode::CONFLICT, "membership_refused", m),
        ChangeError::Unavailable(m) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", m),
    }
}

#[utoipa::path(get, path = "/v1/cluster", tag = "cluster", summary = "The members of a raft:// cluster",
    responses((status = 200, body = ClusterStatus),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource")))]
pub(crate) async fn status(State(state): State<ApiState>) -> ApiResult<Json<ClusterStatus>> {
    let m = member(&state)?;
    Ok(Json(cluster_view(m.status())))
}

#[utoipa::path(post, path = "/v1/cluster/learners", tag = "cluster", summary = "Add a learner; answers once it has caught up",
    request_body = NewLearner,
    responses((status = 200, body = ClusterStatus),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 409, body = gnomon_api::ErrorBody, description = "the call conflicts with what the server holds"),
        (status = 413, body = gnomon_api::ErrorBody, description = "the body is larger than 1 MiB"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(crate) async fn add_learner(
    State(state): State<ApiState>,
    crate::api::extract::BoundedBody(bytes): crate::api::extract::BoundedBody,
) -> ApiResult<Json<ClusterStatus>> {
    let m = member(&state)?;
    let body: NewLearner = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad("invalid_json", format!("a learner is {{\"id\": N, \"address\": \"HOST:PORT\"}}: {e}")))?;
    if body.id == 0 {
        return Err(ApiError::bad("invalid_member", "\"id\" must be a member id (1 or more)"));
    }
    if !gnomon_backend::raft::valid_address(&body.address) {
        return Err(ApiError::bad("invalid_address", "\"address\" must be HOST:PORT of the member's gnomon listener"));
    }
    m.change_membership(Change::AddLearner { id: body.id, addr: body.address }).await.map_err(change_error)?;
    Ok(Json(cluster_view(m.status())))
}

#[utoipa::path(post, path = "/v1/cluster/members/{id}/promote", tag = "cluster", summary = "Make a learner a voter",
    params(("id" = u64, Path, minimum = 1, maximum = 9007199254740991_u64, description = "The member's id")),
    responses((status = 200, body = ClusterStatus),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 409, body = gnomon_api::ErrorBody, description = "the call conflicts with what the server holds"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(crate) async fn promote(State(state): State<ApiState>, Path(id): Path<String>) -> ApiResult<Json<ClusterStatus>> {
    let m = member(&state)?;
    let id = member_id(&id)?;
    m.change_membership(Change::Promote { id }).await.map_err(change_error)?;
    Ok(Json(cluster_view(m.status())))
}

#[utoipa::path(delete, path = "/v1/cluster/members/{id}", tag = "cluster", summary = "Remove a member",
    params(("id" = u64, Path, minimum = 1, maximum = 9007199254740991_u64, description = "The member's id")),
    responses((status = 200, body = Removed),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 409, body = gnomon_api::ErrorBody, description = "the call conflicts with what the server holds"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(crate) async fn remove(State(state): State<ApiState>, Path(id): Path<String>) -> ApiResult<Json<Removed>> {
    let m = member(&state)?;
    let id = member_id(&id)?;
    m.change_membership(Change::Remove { id }).await.map_err(change_error)?;
    Ok(Json(Removed { removed: id, status: cluster_view(m.status()) }))
}
