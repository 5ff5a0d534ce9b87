//! The REST API (`/v1`), health, readiness, metrics, OpenAPI and the UI.
//!
//! Every error is `{"error":{"code","message"}}` with a 4xx/5xx status. Job
//! bodies are read with a 1 MiB limit, must be UTF-8 JSON with no unknown
//! fields, and are fully validated before anything is written.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use gnomon_backend::StoreError;
use gnomon_core::spec::DEFAULT_NAMESPACE;
use gnomon_core::SpecError;
use serde::Deserialize;

use crate::auth::{Authenticator, Denied, Principal};
use crate::browser::HostPolicy;
use crate::node::NodeHandle;

pub mod authz;
pub mod forward;
pub(crate) mod jobs;
pub(crate) mod runs;
pub(crate) mod status;

pub use jobs::{job_view, MAX_TRIGGER_COUNT};
pub use runs::run_view;
pub use status::{cluster_view, ReadyCheck};

pub const MAX_BODY_BYTES: usize = 1024 * 1024;

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
    pub forward: Option<forward::Forwarder>,
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
            forward: Some(forward::Forwarder::plain()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }
    pub(crate) fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(gnomon_api::ErrorBody::new(self.code, self.message))).into_response()
    }
}

impl From<SpecError> for ApiError {
    fn from(e: SpecError) -> Self {
        let status = if e.code == "payload_too_large" { StatusCode::PAYLOAD_TOO_LARGE } else { StatusCode::BAD_REQUEST };
        Self::new(status, e.code, format!("{}: {}", e.field, e.message))
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let (status, code) = match &e {
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

/// Every `/v1` operation with the policy its caller must meet.
fn v1_routes() -> Router<ApiState> {
    use authz::{delete, get, post, put, Policy};
    const READ: Policy = Policy::viewer("reading");
    Router::new()
        .route("/jobs", post(Policy::admin("creating a job"), jobs::create_job).merge(get(READ, jobs::list_jobs)))
        .route(
            "/jobs/{name}",
            get(READ, jobs::get_job)
                .merge(put(Policy::admin("creating or updating a job"), jobs::put_job))
                .merge(delete(Policy::admin("deleting a job"), jobs::delete_job)),
        )
        .route("/jobs/{name}/trigger", post(Policy::operator("triggering a job"), jobs::trigger_job))
        .route("/jobs/{name}/pause", post(Policy::operator("pausing a job"), jobs::pause_job))
        .route("/jobs/{name}/resume", post(Policy::operator("resuming a job"), jobs::resume_job))
        .route("/schedules/preview", post(Policy::viewer("previewing a schedule"), jobs::preview_schedule))
        .route("/runs", get(READ, runs::list_runs))
        .route("/runs/{id}", get(READ, runs::get_run))
        .route("/runs/{id}/cancel", post(Policy::operator("cancelling a run"), runs::cancel_run))
        .route("/workers", get(READ, status::list_workers))
        .route("/whoami", get(READ, status::whoami))
        .route("/leader", get(READ, status::leader))
}

pub fn router(state: ApiState) -> Router {
    use authz::Policy;
    let v1 = v1_routes()
        .merge(crate::cluster_api::routes())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .layer(axum::middleware::from_fn_with_state(state.clone(), authz::authenticate));
    let grpc =
        gnomon_proto::v1::worker_server::WorkerServer::new(crate::sessions::WorkerService::new(state.node.clone(), state.auth.clone()))
            .max_decoding_message_size(8 << 20);
    let mut app = Router::new()
        .nest("/v1", v1)
        // The worker protocol (gRPC over HTTP/2) shares the listener.
        .route_service("/gnomon.worker.v1.Worker/Session", grpc);
    if let Some(svc) = state.raft.clone() {
        // So do the members of a raft cluster, with a member credential
        // (no client role, however high, speaks for a member).
        let auth = state.auth.clone();
        let server = gnomon_proto::raft::raft_server::RaftServer::new(svc).max_decoding_message_size(usize::MAX);
        #[allow(clippy::result_large_err)] // tonic's interceptor signature
        let raft = tonic::service::interceptor::InterceptedService::new(server, move |req: tonic::Request<()>| {
            let given = req.metadata().get("authorization").map(|v| v.to_str().unwrap_or(""));
            let refused = match auth.authenticate_as(given, crate::auth::Role::Member) {
                Ok(p) if p.role == crate::auth::Role::Member => return Ok(req),
                Ok(p) => tonic::Status::permission_denied(
                    Denied::Role {
                        name: p.name.to_string(),
                        have: p.role,
                        need: crate::auth::Role::Member,
                        what: "speaking for a raft member".into(),
                    }
                    .to_string(),
                ),
                Err(d) => tonic::Status::unauthenticated(d.to_string()),
            };
            let peer = crate::listener::ClientAddr::shown(req.extensions().get());
            tracing::warn!(target: "gnomon::audit", %peer, "raft call refused: {}", refused.message());
            Err(refused)
        });
        app = app.route_service("/gnomon.raft.v1.Raft/{method}", raft);
    }
    app.route("/healthz", get(status::healthz))
        .route("/readyz", get(status::readyz))
        // The API's description is the same for every server: no credential.
        .route("/v1/openapi.json", get(|| async { Json(crate::openapi::document()) }))
        .route(
            "/metrics",
            authz::get(Policy::viewer("reading metrics"), status::metrics_text)
                .route_layer(axum::middleware::from_fn_with_state(state.clone(), authz::authenticate)),
        )
        .merge(crate::ui::routes())
        .layer(axum::middleware::from_fn_with_state(state.hosts.clone(), crate::browser::guard))
        .layer(axum::middleware::from_fn(json_errors))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the server hit a bug handling this request").into_response()
        }))
        .with_state(state)
}

/// Every error answer is `{"error":{"code","message"}}`: the ones the
/// framework makes itself (a method not allowed, a path segment that is not
/// UTF-8, …) are rewritten to that form, keeping their status and headers.
async fn json_errors(request: Request, next: Next) -> Response {
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

/// The caller, as its operation's policy let it through ([`authz`]); fails
/// closed on a route that declared none.
pub(crate) fn caller(req: &Request) -> ApiResult<Principal> {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| ApiError::new(StatusCode::FORBIDDEN, "forbidden", "this operation declares no policy; nobody may call it"))
}

/// Refuses a namespace the caller may not use.
fn check_ns(p: &Principal, namespace: &str) -> ApiResult<()> {
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
struct NsQuery {
    namespace: Option<String>,
    version: Option<u64>,
    stale: Option<bool>,
}

/// The store reads go to: with `stale=true`, this replica's copy as it is
/// (on a raft member: no read index, so it answers even without a quorum).
fn reader(state: &ApiState, stale: Option<bool>) -> Arc<dyn gnomon_backend::Store> {
    match stale {
        Some(true) => state.node.store.stale_reads().unwrap_or_else(|| state.node.store.clone()),
        _ => state.node.store.clone(),
    }
}

/// Marks an answer read with `stale=true`.
fn marked(stale: Option<bool>, resp: impl IntoResponse) -> Response {
    let mut resp = resp.into_response();
    if stale == Some(true) {
        resp.headers_mut().insert("gnomon-read", axum::http::HeaderValue::from_static("stale"));
    }
    resp
}

impl NsQuery {
    fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
    }
}

/// Parses a query string strictly: unknown parameters are errors.
fn query<T: serde::de::DeserializeOwned>(raw: Option<&str>) -> ApiResult<T> {
    serde_urlencoded::from_str(raw.unwrap_or("")).map_err(|e| ApiError::bad("invalid_query", e.to_string()))
}

pub(crate) async fn read_body(body: Body) -> ApiResult<Vec<u8>> {
    axum::body::to_bytes(body, MAX_BODY_BYTES).await.map(|b| b.to_vec()).map_err(|_| {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", format!("request body is larger than {MAX_BODY_BYTES} bytes"))
    })
}
