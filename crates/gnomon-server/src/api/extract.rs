//! What handlers take from a request: the caller (as its operation's policy
//! let it through), the namespace it may use, strict query strings, a
//! bounded body, and the store reads go to.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gnomon_core::spec::DEFAULT_NAMESPACE;
use serde::Deserialize;

use crate::auth::{Denied, Principal};

use super::error::{ApiError, ApiResult};
use super::state::ApiState;

/// The largest request body the API reads.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The caller, as its operation's policy let it through ([`authz`]); fails
/// closed on a route that declared none.
pub(crate) fn caller(req: &Request) -> ApiResult<Principal> {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| ApiError::new(StatusCode::FORBIDDEN, "forbidden", "this operation declares no policy; nobody may call it"))
}

/// Refuses a namespace the caller may not use.
pub(crate) fn check_ns(p: &Principal, namespace: &str) -> ApiResult<()> {
    if p.sees(namespace) {
        return Ok(());
    }
    let d = Denied::Namespace {
        name: p.name.to_string(),
        namespace: namespace.to_string(),
        allowed: p.namespaces.as_ref().map(|n| n.to_vec()).unwrap_or_default(),
    };
    Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", d.to_string()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NsQuery {
    pub(crate) namespace: Option<String>,
    pub(crate) version: Option<u64>,
    pub(crate) stale: Option<bool>,
}

/// The store reads go to: with `stale=true`, this replica's copy as it is
/// (on a raft member: no read index, so it answers even without a quorum).
pub(crate) fn reader(state: &ApiState, stale: Option<bool>) -> Arc<dyn gnomon_backend::Store> {
    match stale {
        Some(true) => state.node.store.stale_reads().unwrap_or_else(|| state.node.store.clone()),
        _ => state.node.store.clone(),
    }
}

/// Marks an answer read with `stale=true`.
pub(crate) fn marked(stale: Option<bool>, resp: impl IntoResponse) -> Response {
    let mut resp = resp.into_response();
    if stale == Some(true) {
        resp.headers_mut().insert("gnomon-read", axum::http::HeaderValue::from_static("stale"));
    }
    resp
}

impl NsQuery {
    pub(crate) fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
    }
}

/// Parses a query string strictly: unknown parameters are errors.
pub(crate) fn query<T: serde::de::DeserializeOwned>(raw: Option<&str>) -> ApiResult<T> {
    serde_urlencoded::from_str(raw.unwrap_or("")).map_err(|e| ApiError::bad("invalid_query", e.to_string()))
}

pub(crate) async fn read_body(body: Body) -> ApiResult<Vec<u8>> {
    axum::body::to_bytes(body, MAX_BODY_BYTES).await.map(|b| b.to_vec()).map_err(|_| {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", format!("request body is larger than {MAX_BODY_BYTES} bytes"))
    })
}
