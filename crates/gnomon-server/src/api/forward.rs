//! Leader-only calls made to a follower are forwarded to the leader, so a
//! client behind a load balancer never sees `not_leader` while a leader
//! exists. The request goes on as it came (method, path, query, the
//! caller's credential or a webhook's signature, body); the leader checks the caller again. A
//! forwarded request is marked, and a server that is not the leader either
//! answers `not_leader` rather than forwarding it again.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ApiResult};
use super::extract::read_body;
use super::state::ApiState;

/// Marks a request one server forwarded to another (its value: the
/// forwarding node).
pub const FORWARDED_BY: &str = "gnomon-forwarded-by";

/// A `not_leader` answer: this server does not lead, and `why` it cannot
/// help further.
pub(super) fn not_leader(state: &ApiState, why: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "not_leader",
        format!("node {} does not lead right now and {why}; see GET /v1/leader", state.node.config.node_id),
    )
}

/// Sends `req` to the leader and answers with the leader's answer.
pub async fn to_leader(state: &ApiState, req: Request) -> ApiResult<Response> {
    if req.headers().contains_key(FORWARDED_BY) {
        return Err(not_leader(state, "the request was already forwarded once"));
    }
    let (parts, body) = req.into_parts();
    let body = read_body(body).await?;
    with_body(state, &parts, body).await
}

/// Sends a request whose body was read already to the leader.
pub(super) async fn with_body(state: &ApiState, req: &axum::http::request::Parts, body: Vec<u8>) -> ApiResult<Response> {
    if req.headers.contains_key(FORWARDED_BY) {
        return Err(not_leader(state, "the request was already forwarded once"));
    }
    let Some(forwarder) = state.forward.as_ref() else {
        return Err(not_leader(state, "does not forward calls"));
    };
    let Some(leader) = state.node.leader_address().await else {
        return Err(not_leader(state, "knows no leader to forward to"));
    };
    let path = req.extensions.get::<axum::extract::OriginalUri>().map(|u| u.0.clone()).unwrap_or_else(|| req.uri.clone());
    let url = format!("{}://{leader}{}", forwarder.scheme, path.path_and_query().map(|p| p.as_str()).unwrap_or("/"));
    let method = reqwest::Method::from_bytes(req.method.as_str().as_bytes()).map_err(|_| ApiError::bad("bad_request", "method"))?;
    let mut out = forwarder.client.request(method, &url).header(FORWARDED_BY, state.node.config.node_id.as_str());
    for name in [
        header::AUTHORIZATION,
        header::CONTENT_TYPE,
        header::IF_MATCH,
        header::HeaderName::from_static(super::trigger::IDEMPOTENCY_KEY),
        header::HeaderName::from_static(crate::signing::TIMESTAMP_HEADER),
        header::HeaderName::from_static(crate::signing::SIGNATURE_HEADER),
    ] {
        if let Some(v) = req.headers.get(&name) {
            out = out.header(name.as_str(), v.as_bytes());
        }
    }
    let answer = out.body(body).send().await.map_err(|e| {
        ApiError::new(StatusCode::BAD_GATEWAY, "leader_unreachable", format!("cannot forward to the leader at {leader}: {e}"))
    })?;
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = answer.headers().get(reqwest::header::CONTENT_TYPE).map(|v| v.as_bytes().to_vec());
    let retry_after = answer.headers().get(reqwest::header::RETRY_AFTER).map(|v| v.as_bytes().to_vec());
    let bytes = answer.bytes().await.map_err(|e| {
        ApiError::new(StatusCode::BAD_GATEWAY, "leader_unreachable", format!("the leader at {leader} did not finish its answer: {e}"))
    })?;
    metrics::counter!("gnomon_api_forwarded_total").increment(1);
    let mut resp = (status, Body::from(bytes)).into_response();
    if let Some(ct) = content_type.and_then(|c| HeaderValue::from_bytes(&c).ok()) {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    if let Some(v) = retry_after.and_then(|v| HeaderValue::from_bytes(&v).ok()) {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    if let Ok(v) = HeaderValue::from_str(&leader) {
        resp.headers_mut().insert("gnomon-answered-by-leader", v);
    }
    Ok(resp)
}
