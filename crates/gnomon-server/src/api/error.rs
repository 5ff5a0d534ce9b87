//! The API's error answer, `{"error":{"code","message"}}`, what store and
//! spec errors become, and the layer that rewrites the framework's own
//! error answers to that form.

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gnomon_backend::StoreError;
use gnomon_core::quota::QuotaExceeded;
use gnomon_core::SpecError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub(super) status: StatusCode,
    pub(super) code: &'static str,
    pub(super) message: String,
    /// A refusal by a quota: said in the body, with `Retry-After`.
    pub(super) quota: Option<Box<QuotaExceeded>>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), quota: None }
    }
    pub(crate) fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
    /// The same error as a conflict with what the server holds (409): the
    /// request is well formed, and what it names does not fit the state it
    /// finds (an upstream job that does not exist, a schedule without the
    /// asked instants).
    pub(crate) fn conflict(self) -> Self {
        Self { status: StatusCode::CONFLICT, ..self }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = gnomon_api::ErrorBody::new(self.code, self.message);
        let retry_after = self.quota.as_ref().map(|q| q.quota.retry_after_secs());
        body.error.quota = self.quota.map(|q| *q);
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        response
    }
}

impl From<QuotaExceeded> for ApiError {
    /// 429 `quota_exceeded`, naming the quota, with `Retry-After`.
    fn from(e: QuotaExceeded) -> Self {
        Self { status: StatusCode::TOO_MANY_REQUESTS, code: "quota_exceeded", message: e.to_string(), quota: Some(Box::new(e)) }
    }
}

impl From<SpecError> for ApiError {
    fn from(e: SpecError) -> Self {
        // Values a trigger, a webhook call or a backfill sets for the job's
        // params are checked against the job as it is: a name it does not
        // declare, or a required one left out, conflicts with the job.
        let against_job = matches!(e.code, "unknown_param" | "missing_param") && e.field.starts_with("params.");
        let status = match e.code {
            "payload_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            _ if against_job => StatusCode::CONFLICT,
            _ => StatusCode::BAD_REQUEST,
        };
        Self::new(status, e.code, format!("{}: {}", e.field, e.message))
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let (status, code) = match &e {
            // A job's edges refused by the store's check in the write's own
            // transaction: the spec's error, as the API gives it.
            // A conflict with the jobs the namespace holds (an upstream it
            // lacks, a cycle through them), as the document states.
            StoreError::Graph(spec) => return ApiError::from(spec.clone()).conflict(),
            StoreError::HasDependents { .. } => (StatusCode::CONFLICT, "has_dependents"),
            StoreError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            StoreError::AlreadyExists(_) => (StatusCode::CONFLICT, "already_exists"),
            StoreError::VersionConflict { .. } => (StatusCode::CONFLICT, "version_conflict"),
            StoreError::Terminal(_) => (StatusCode::CONFLICT, "run_terminal"),
            StoreError::Fenced { .. } => (StatusCode::SERVICE_UNAVAILABLE, "not_leader"),
            StoreError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        Self::new(status, code, e.to_string())
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// Every error answer is `{"error":{"code","message"}}`: the ones the
/// framework makes itself (a method not allowed, a path segment that is not
/// UTF-8, …) are rewritten to that form, keeping their status and headers.
pub(super) async fn json_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let content_type = response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if content_type.starts_with("application/json") || content_type.starts_with("application/grpc") {
        return response;
    }
    let code = match status {
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::REQUEST_TIMEOUT => "timeout",
        s if s.is_server_error() => "internal",
        _ => "bad_request",
    };
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.map(|b| String::from_utf8_lossy(&b).trim().to_string()).unwrap_or_default();
    let message = if !text.is_empty() {
        text
    } else if status == StatusCode::METHOD_NOT_ALLOWED {
        let allow = parts.headers.get(header::ALLOW).and_then(|v| v.to_str().ok()).unwrap_or("");
        format!("this method is not allowed here (allowed: {allow})")
    } else {
        status.canonical_reason().unwrap_or("error").to_string()
    };
    let mut out = ApiError::new(status, code, message).into_response();
    for name in [header::ALLOW, header::WWW_AUTHENTICATE, header::RETRY_AFTER] {
        if let Some(v) = parts.headers.get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}
