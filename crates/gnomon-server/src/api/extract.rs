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

/// The caller, as its operation's policy let it through ([`authz`]): a
/// handler that takes it cannot run on a route that declared no policy.
///
/// [`authz`]: super::authz
pub(crate) struct Caller(pub(crate) Principal);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .map(Caller)
            .ok_or_else(|| ApiError::new(StatusCode::FORBIDDEN, "forbidden", "this operation declares no policy; nobody may call it"))
    }
}

/// A strict query string: an unknown or malformed parameter is refused
/// (400 `invalid_query`) before the handler runs.
pub(crate) struct Query<T>(pub(crate) T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        query(parts.uri.query()).map(Query)
    }
}

/// A request body of at most [`MAX_BODY_BYTES`] (413 `payload_too_large`
/// past it), as bytes.
pub(crate) struct BoundedBody(pub(crate) Vec<u8>);

impl<S: Send + Sync> axum::extract::FromRequest<S> for BoundedBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, Self::Rejection> {
        read_body(req.into_body()).await.map(BoundedBody)
    }
}

/// A JSON body: malformed JSON is 400 `invalid_json`, a field of the
/// wrong shape 400 `invalid_body` naming its path; an empty body (or JSON
/// `null`) is `T::default()`.
pub(crate) fn json_body<T: serde::de::DeserializeOwned + Default>(bytes: &[u8]) -> ApiResult<T> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| ApiError::bad("invalid_json", format!("body: {e}")))?;
    if value.is_null() {
        return Ok(T::default());
    }
    serde_path_to_error::deserialize(value).map_err(|e| ApiError::bad("invalid_body", format!("{}: {}", e.path(), e.inner())))
}

/// The version an `If-Match` header asks for (a job's version, quoted or
/// not); 400 `invalid_header` for anything else.
pub(crate) struct IfMatch(pub(crate) Option<u64>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for IfMatch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        match parts.headers.get(axum::http::header::IF_MATCH) {
            None => Ok(IfMatch(None)),
            Some(v) => v
                .to_str()
                .ok()
                .map(|s| s.trim().trim_matches('"'))
                .and_then(|s| s.parse().ok())
                .map(|v| IfMatch(Some(v)))
                .ok_or_else(|| ApiError::bad("invalid_header", "If-Match must be a job version number")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct B {
        #[serde(default)]
        n: u32,
    }

    #[test]
    fn a_json_body_is_refused_in_the_api_shape() {
        assert_eq!(json_body::<B>(b"").unwrap(), B::default());
        assert_eq!(json_body::<B>(b" null ").unwrap(), B::default());
        assert_eq!(json_body::<B>(br#"{"n":3}"#).unwrap(), B { n: 3 });
        assert_eq!(json_body::<B>(b"{").unwrap_err().code, "invalid_json");
        let e = json_body::<B>(br#"{"n":"x"}"#).unwrap_err();
        assert_eq!(e.code, "invalid_body");
        assert!(e.message.starts_with("n:"), "{}", e.message);
        assert_eq!(json_body::<B>(br#"{"m":1}"#).unwrap_err().code, "invalid_body");
    }
}
