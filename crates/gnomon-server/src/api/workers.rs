//! `/v1/workers/{id}/binding`: the credential a worker id belongs to (the
//! first one that opened a session with it, as the store records it; see
//! `sessions.rs`), released by an admin not limited to namespaces, so that
//! the next credential to open a session with the id binds it.

use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::error::{ApiError, ApiResult};
use super::extract::Caller;
use super::state::ApiState;
use crate::sessions::{valid_worker_id, MAX_WORKER_ID_LEN};

#[utoipa::path(delete, path = "/v1/workers/{id}/binding", tag = "cluster",
    summary = "Release a worker id from the credential it belongs to (an admin not limited to namespaces)",
    description = "A worker id belongs to the first credential that opened a worker session with it; every server refuses it \
        to any other credential. Released, it goes to the next credential that opens a session with it. A session of the id \
        that is open goes on; stop its worker first.",
    params(("id" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The worker id")),
    responses((status = 204, description = "released"),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "the worker id belongs to no credential"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(crate) async fn release_worker(State(state): State<ApiState>, Path(id): Path<String>, Caller(p): Caller) -> ApiResult<StatusCode> {
    if !valid_worker_id(&id) {
        return Err(ApiError::bad(
            "invalid_worker_id",
            format!("worker id {id:?} must be 1-{MAX_WORKER_ID_LEN} characters of letters, digits, '-', '_', '.', ':'"),
        ));
    }
    let owner = state.node.store.worker_owner(&id).await?;
    if !state.node.store.unbind_worker(&id).await? {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "no_binding", format!("worker id {id:?} belongs to no credential")));
    }
    state.worker_owners.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    tracing::info!(target: "gnomon::audit", credential = %p.name, worker = %id, owner = owner.as_deref().unwrap_or("-"),
        "worker id released");
    Ok(StatusCode::NO_CONTENT)
}
