//! The REST API (`/v1`), health, readiness, metrics, OpenAPI and the UI.
//!
//! Every error is `{"error":{"code","message"}}` with a 4xx/5xx status. Job
//! bodies are read with a 1 MiB limit, must be UTF-8 JSON with no unknown
//! fields, and are fully validated before anything is written.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use gnomon_backend::{CancelOutcome, JobRecord, Precondition, RunDetail, RunFilter, RunRecord, StoreError};
use gnomon_core::spec::{parse_job_json, JobSpec, DEFAULT_NAMESPACE};
use gnomon_core::{format_millis, RunState, SpecError};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::auth::{Authenticator, Denied, Principal, Role};
use crate::browser::HostPolicy;
use crate::leader::LeaderCommand;
use crate::node::{NodeHandle, SCOPE};

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
        (self.status, Json(json!({"error": {"code": self.code, "message": self.message}}))).into_response()
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

pub fn router(state: ApiState) -> Router {
    let v1 = Router::new()
        .route("/jobs", post(create_job).get(list_jobs))
        .route("/jobs/{name}", get(get_job).put(put_job).delete(delete_job))
        .route("/jobs/{name}/trigger", post(trigger_job))
        .route("/jobs/{name}/pause", post(pause_job))
        .route("/jobs/{name}/resume", post(resume_job))
        .route("/runs", get(list_runs))
        .route("/runs/{id}", get(get_run))
        .route("/runs/{id}/cancel", post(cancel_run))
        .route("/workers", get(list_workers))
        .route("/leader", get(leader))
        .route("/openapi.json", get(openapi))
        .merge(crate::cluster_api::routes())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .layer(axum::middleware::from_fn_with_state(state.clone(), authorize));
    let grpc =
        gnomon_proto::v1::worker_server::WorkerServer::new(crate::sessions::WorkerService::new(state.node.clone(), state.auth.clone()))
            .max_decoding_message_size(8 << 20);
    let mut app = Router::new()
        .nest("/v1", v1)
        // The worker protocol (gRPC over HTTP/2) shares the listener.
        .route_service("/gnomon.worker.v1.Worker/Session", grpc);
    if let Some(svc) = state.raft.clone() {
        // So do the members of a raft cluster, with an admin credential.
        let auth = state.auth.clone();
        let server = gnomon_proto::raft::raft_server::RaftServer::new(svc).max_decoding_message_size(usize::MAX);
        #[allow(clippy::result_large_err)] // tonic's interceptor signature
        let raft = tonic::service::interceptor::InterceptedService::new(server, move |req: tonic::Request<()>| {
            let given = req.metadata().get("authorization").map(|v| v.to_str().unwrap_or(""));
            match auth.authenticate(given) {
                Ok(p) if p.role == crate::auth::Role::Admin => Ok(req),
                Ok(p) => Err(tonic::Status::permission_denied(format!(
                    "credential {:?} ({}) may not speak for a raft member; members use an admin credential",
                    p.name,
                    p.role.as_str()
                ))),
                Err(d) => Err(tonic::Status::unauthenticated(d.to_string())),
            }
        });
        app = app.route_service("/gnomon.raft.v1.Raft/{method}", raft);
    }
    app.route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text).route_layer(axum::middleware::from_fn_with_state(state.clone(), authorize)))
        .route("/ui", get(|| async { Html(crate::ui::PAGE) }))
        .route("/", get(|| async { axum::response::Redirect::temporary("/ui") }))
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

/// The role a `/v1` call needs (paths as seen inside `/v1`), and what the
/// call is, for the refusal.
fn required_role(method: &axum::http::Method, path: &str) -> (Role, &'static str) {
    use axum::http::Method;
    if matches!(*method, Method::GET | Method::HEAD) {
        return (Role::Viewer, "reading");
    }
    if path.starts_with("/jobs/") && path.ends_with("/trigger") {
        return (Role::Operator, "triggering a job");
    }
    if path.starts_with("/jobs/") && (path.ends_with("/pause") || path.ends_with("/resume")) {
        return (Role::Operator, "pausing or resuming a job");
    }
    if path.starts_with("/runs/") && path.ends_with("/cancel") {
        return (Role::Operator, "cancelling a run");
    }
    if path.starts_with("/cluster") {
        return (Role::Admin, "changing the cluster's members");
    }
    (Role::Admin, "creating, updating or deleting a job")
}

fn denied(d: &Denied) -> Response {
    let status = if d.is_unauthenticated() { StatusCode::UNAUTHORIZED } else { StatusCode::FORBIDDEN };
    let mut resp = ApiError::new(status, d.code(), d.to_string()).into_response();
    if d.is_unauthenticated() {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
    }
    resp
}

/// Authenticates the caller, checks its role, hands it to the handler (a
/// [`Principal`] extension) and writes an audit line for every write.
async fn authorize(State(state): State<ApiState>, mut request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let write = !matches!(method, axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS);
    let full = request.extensions().get::<axum::extract::OriginalUri>().map(|u| u.0.path().to_string()).unwrap_or_else(|| path.clone());
    let given = request.headers().get(header::AUTHORIZATION).map(|v| v.to_str().unwrap_or(""));
    let principal = match state.auth.authenticate(given) {
        Ok(p) => p,
        Err(d) => {
            if write {
                tracing::warn!(target: "gnomon::audit", credential = "-", %method, path = %full, status = 401, "refused: {d}");
            }
            return denied(&d);
        }
    };
    let (need, what) = if full == "/metrics" { (Role::Viewer, "reading metrics") } else { required_role(&method, &path) };
    if !principal.role.covers(need) {
        let d = Denied::Role { name: principal.name.to_string(), have: principal.role, need, what: what.to_string() };
        if write {
            tracing::warn!(target: "gnomon::audit", credential = %principal.name, role = %principal.role, %method, path = %full, status = 403, "refused: {d}");
        }
        return denied(&d);
    }
    request.extensions_mut().insert(principal.clone());
    let response = next.run(request).await;
    if write {
        tracing::info!(
            target: "gnomon::audit",
            credential = %principal.name,
            role = %principal.role,
            %method,
            path = %full,
            status = response.status().as_u16(),
            "api write"
        );
    }
    response
}

/// The caller, as [`authorize`] left it (fails closed if it is missing).
pub(crate) fn caller(req: &Request) -> ApiResult<Principal> {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", "no credential was checked for this request"))
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

pub fn job_json(job: &JobRecord, next_fire_at: Option<i64>) -> Value {
    let mut v = serde_json::to_value(&job.spec).unwrap_or_else(|_| json!({}));
    if let Some(obj) = v.as_object_mut() {
        obj.insert(
            "status".into(),
            json!({
                "version": job.version,
                "paused": job.paused,
                "created_at": format_millis(job.created_at),
                "updated_at": format_millis(job.updated_at),
                "last_scheduled_at": job.last_scheduled_at.map(format_millis),
                "next_fire_at": next_fire_at.map(format_millis),
            }),
        );
    }
    v
}

fn next_fire(state: &ApiState, job: &JobRecord) -> Option<i64> {
    if job.paused {
        return None;
    }
    let compiled = job.spec.compile().ok()?;
    let now = state.node.clock.now_millis();
    let base = job.last_scheduled_at.unwrap_or(job.created_at).max(now - 1);
    compiled.schedule.next_after(base)
}

fn check_name(name: &str) -> ApiResult<()> {
    gnomon_core::spec::validate_name("name", name, gnomon_core::spec::MAX_NAME_LEN).map_err(ApiError::from)
}

async fn create_job(State(state): State<ApiState>, req: Request) -> ApiResult<impl IntoResponse> {
    let p = caller(&req)?;
    let q: NsQuery = query(req.uri().query())?;
    let bytes = read_body(req.into_body()).await?;
    let mut spec = parse_job_json(&bytes)?;
    if spec.namespace.is_none() && q.namespace.is_some() {
        spec.namespace = q.namespace.clone();
    }
    let compiled = spec.compile()?;
    check_ns(&p, compiled.spec.namespace())?;
    let job = state.node.store.put_job(&compiled.spec, Precondition::DoesNotExist, state.node.clock.now_millis()).await?;
    state.node.nudge();
    let next = next_fire(&state, &job);
    Ok((StatusCode::CREATED, Json(job_json(&job, next))))
}

async fn put_job(State(state): State<ApiState>, Path(name): Path<String>, req: Request) -> ApiResult<impl IntoResponse> {
    check_name(&name)?;
    let p = caller(&req)?;
    let q: NsQuery = query(req.uri().query())?;
    let if_match = version_from_headers(req.headers())?;
    let bytes = read_body(req.into_body()).await?;
    let mut spec: JobSpec = parse_job_json(&bytes)?;
    if spec.name != name {
        return Err(ApiError::bad("name_mismatch", format!("name: body says {:?} but the path says {name:?}", spec.name)));
    }
    if spec.namespace.is_none() {
        spec.namespace = Some(q.namespace().to_string());
    }
    let compiled = spec.compile()?;
    check_ns(&p, compiled.spec.namespace())?;
    let precondition = match q.version.or(if_match) {
        Some(v) => Precondition::MatchesVersion(v),
        None => Precondition::None,
    };
    let existed = state.node.store.get_job(compiled.spec.namespace(), &name).await?.is_some();
    let job = state.node.store.put_job(&compiled.spec, precondition, state.node.clock.now_millis()).await?;
    state.node.nudge();
    let next = next_fire(&state, &job);
    Ok((if existed { StatusCode::OK } else { StatusCode::CREATED }, Json(job_json(&job, next))))
}

fn version_from_headers(headers: &HeaderMap) -> ApiResult<Option<u64>> {
    match headers.get(header::IF_MATCH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .map(|s| s.trim().trim_matches('"'))
            .and_then(|s| s.parse().ok())
            .map(Some)
            .ok_or_else(|| ApiError::bad("invalid_header", "If-Match must be a job version number")),
    }
}

async fn list_jobs(State(state): State<ApiState>, req: Request) -> ApiResult<impl IntoResponse> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Q {
        namespace: Option<String>,
        stale: Option<bool>,
    }
    let p = caller(&req)?;
    let q: Q = query(req.uri().query())?;
    if let Some(ns) = &q.namespace {
        check_ns(&p, ns)?;
    }
    let mut jobs = reader(&state, q.stale).list_jobs(q.namespace.as_deref()).await?;
    jobs.retain(|j| p.sees(&j.namespace));
    let items: Vec<Value> = jobs.iter().map(|j| job_json(j, next_fire(&state, j))).collect();
    Ok(marked(q.stale, Json(json!({"jobs": items}))))
}

async fn load_job(state: &ApiState, ns: &str, name: &str) -> ApiResult<JobRecord> {
    load_job_from(state.node.store.as_ref(), ns, name).await
}

async fn load_job_from(store: &dyn gnomon_backend::Store, ns: &str, name: &str) -> ApiResult<JobRecord> {
    check_name(name)?;
    store
        .get_job(ns, name)
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("job {ns}/{name} does not exist")))
}

async fn get_job(State(state): State<ApiState>, Path(name): Path<String>, req: Request) -> ApiResult<impl IntoResponse> {
    let q: NsQuery = query(req.uri().query())?;
    check_ns(&caller(&req)?, q.namespace())?;
    let job = load_job_from(reader(&state, q.stale).as_ref(), q.namespace(), &name).await?;
    Ok(marked(q.stale, Json(job_json(&job, next_fire(&state, &job)))))
}

async fn delete_job(State(state): State<ApiState>, Path(name): Path<String>, req: Request) -> ApiResult<impl IntoResponse> {
    let q: NsQuery = query(req.uri().query())?;
    check_name(&name)?;
    check_ns(&caller(&req)?, q.namespace())?;
    let precondition = match q.version.or(version_from_headers(req.headers())?) {
        Some(v) => Precondition::MatchesVersion(v),
        None => Precondition::None,
    };
    state.node.store.delete_job(q.namespace(), &name, precondition).await?;
    state.node.nudge();
    Ok(StatusCode::NO_CONTENT)
}

async fn set_paused(state: ApiState, name: String, req: Request, paused: bool) -> ApiResult<Json<Value>> {
    let q: NsQuery = query(req.uri().query())?;
    check_name(&name)?;
    check_ns(&caller(&req)?, q.namespace())?;
    let job = state.node.store.set_job_paused(q.namespace(), &name, paused, state.node.clock.now_millis()).await?;
    state.node.nudge();
    Ok(Json(job_json(&job, next_fire(&state, &job))))
}

async fn pause_job(State(state): State<ApiState>, Path(name): Path<String>, req: Request) -> ApiResult<impl IntoResponse> {
    set_paused(state, name, req, true).await
}

async fn resume_job(State(state): State<ApiState>, Path(name): Path<String>, req: Request) -> ApiResult<impl IntoResponse> {
    set_paused(state, name, req, false).await
}

fn not_leader(state: &ApiState) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "not_leader",
        format!("node {} does not lead scope {SCOPE} right now; see GET /v1/leader", state.node.config.node_id),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TriggerQuery {
    namespace: Option<String>,
    /// How many manual runs to create at once (1 to 10,000).
    count: Option<u32>,
}

/// Most runs one trigger call may create.
pub const MAX_TRIGGER_COUNT: u32 = 10_000;

async fn trigger_job(State(state): State<ApiState>, Path(name): Path<String>, req: Request) -> ApiResult<impl IntoResponse> {
    let q: TriggerQuery = query(req.uri().query())?;
    let ns = q.namespace.clone().unwrap_or_else(|| gnomon_core::spec::DEFAULT_NAMESPACE.to_string());
    check_ns(&caller(&req)?, &ns)?;
    let count = q.count.unwrap_or(1);
    if !(1..=MAX_TRIGGER_COUNT).contains(&count) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_count", format!("count must be between 1 and {MAX_TRIGGER_COUNT}")));
    }
    load_job(&state, &ns, &name).await?;
    let tx = state.node.leader_commands().ok_or_else(|| not_leader(&state))?;
    let (reply_tx, reply_rx) = oneshot::channel();
    tx.send(LeaderCommand::Trigger { namespace: ns, name, count, reply: reply_tx }).await.map_err(|_| not_leader(&state))?;
    let ids = tokio::time::timeout(std::time::Duration::from_secs(30), reply_rx)
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "timeout", "the leader did not answer in 30s"))?
        .map_err(|_| not_leader(&state))??;
    if count > 1 {
        return Ok((StatusCode::CREATED, Json(json!({"count": ids.len(), "ids": ids}))));
    }
    let id = ids.into_iter().next().ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "no run was created"))?;
    let detail = state
        .node
        .store
        .get_run(&id)
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "triggered run vanished"))?;
    Ok((StatusCode::CREATED, Json(run_json(&detail.run, Some(&detail), true))))
}

pub fn run_json(run: &RunRecord, detail: Option<&RunDetail>, with_output: bool) -> Value {
    let mut v = json!({
        "id": run.id,
        "job": run.job,
        "namespace": run.namespace,
        "scheduled_at": format_millis(run.scheduled_at),
        "fired_at": format_millis(run.fired_at),
        "state": run.state,
        "attempt": run.attempt,
        "reason": run.reason,
        "manual": run.manual,
        "next_attempt_at": run.next_attempt_at.map(format_millis),
        "cancel_requested": run.cancel_requested,
        "updated_at": format_millis(run.updated_at),
    });
    if let (Some(d), Some(obj)) = (detail, v.as_object_mut()) {
        let attempts: Vec<Value> = d
            .attempts
            .iter()
            .map(|a| {
                let mut item = json!({
                    "attempt": a.attempt, "worker": a.worker, "token": a.token, "state": a.state,
                    "assigned_at": format_millis(a.assigned_at),
                    "started_at": a.started_at.map(format_millis), "ended_at": a.ended_at.map(format_millis),
                    "exit_code": a.exit_code,
                });
                if with_output {
                    item["output"] = json!(a.output);
                }
                item
            })
            .collect();
        obj.insert("attempts".into(), json!(attempts));
    }
    v
}

async fn list_runs(State(state): State<ApiState>, req: Request) -> ApiResult<impl IntoResponse> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Q {
        job: Option<String>,
        namespace: Option<String>,
        state: Option<String>,
        limit: Option<u64>,
        cursor: Option<String>,
        stale: Option<bool>,
    }
    let p = caller(&req)?;
    let mut q: Q = query(req.uri().query())?;
    match (&q.namespace, &p.namespaces) {
        (Some(ns), _) => check_ns(&p, ns)?,
        (None, None) => {}
        (None, Some(list)) if list.len() == 1 => q.namespace = Some(list[0].clone()),
        (None, Some(list)) => {
            return Err(ApiError::bad(
                "namespace_required",
                format!("credential {:?} is limited to namespaces {}; pass namespace=", p.name, list.join(", ")),
            ))
        }
    }
    let run_state = match &q.state {
        None => None,
        Some(s) => Some(RunState::parse(s).ok_or_else(|| ApiError::bad("invalid_query", format!("state: unknown run state {s:?}")))?),
    };
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad("invalid_query", "limit: must be between 1 and 1000"));
    }
    let cursor = match &q.cursor {
        None => None,
        Some(c) => Some(c.parse::<i64>().map_err(|_| ApiError::bad("invalid_query", format!("cursor: {c:?} is not a cursor")))?),
    };
    let filter = RunFilter { namespace: q.namespace.clone(), job: q.job.clone(), state: run_state };
    let page = reader(&state, q.stale).list_runs(&filter, u32::try_from(limit).unwrap_or(1000), cursor).await?;
    let runs: Vec<Value> = page.runs.iter().map(|r| run_json(r, None, false)).collect();
    Ok(marked(q.stale, Json(json!({"runs": runs, "next_cursor": page.next_cursor.map(|c| c.to_string())}))))
}

/// A run the caller may see (one in another namespace does not exist for it).
async fn load_run(state: &ApiState, p: &Principal, id: &str) -> ApiResult<RunDetail> {
    load_run_from(state.node.store.as_ref(), p, id).await
}

async fn load_run_from(store: &dyn gnomon_backend::Store, p: &Principal, id: &str) -> ApiResult<RunDetail> {
    let missing = || ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("run {id} does not exist"));
    let detail = store.get_run(id).await?.ok_or_else(missing)?;
    if !p.sees(&detail.run.namespace) {
        return Err(missing());
    }
    Ok(detail)
}

async fn get_run(
    State(state): State<ApiState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult<impl IntoResponse> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Q {
        stale: Option<bool>,
    }
    let q: Q = query(uri.query())?;
    let detail = load_run_from(reader(&state, q.stale).as_ref(), &p, &id).await?;
    let mut v = run_json(&detail.run, Some(&detail), true);
    if detail.run.state == RunState::Pending {
        if let Some(why) = state.node.waiting_reason(&detail.run.job_uid) {
            v["waiting_for"] = json!(why);
        }
    }
    Ok(marked(q.stale, Json(v)))
}

async fn cancel_run(
    State(state): State<ApiState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    load_run(&state, &p, &id).await?;
    let outcome = state.node.store.request_cancel(&id, state.node.clock.now_millis()).await?;
    state.node.run_changed(&id);
    let detail = load_run(&state, &p, &id).await?;
    let status = if outcome == CancelOutcome::Cancelled { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(run_json(&detail.run, Some(&detail), true))))
}

async fn list_workers(State(state): State<ApiState>) -> impl IntoResponse {
    let workers: Vec<Value> = state
        .node
        .workers()
        .into_iter()
        .map(|w| {
            let state = if !w.connected {
                "disconnected"
            } else if w.draining {
                "draining"
            } else {
                "live"
            };
            json!({"id": w.id, "session": w.session, "labels": w.labels, "capacity": w.capacity, "prefetch": w.prefetch, "running": w.running,
                   "load": w.load, "state": state, "lease_expires_at": format_millis(w.lease_expires_at),
                   "executors": w.executors, "handlers": w.handlers})
        })
        .collect();
    Json(json!({"workers": workers}))
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

async fn leader(State(state): State<ApiState>, uri: axum::http::Uri) -> ApiResult<impl IntoResponse> {
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
    let mut answer = match record {
        Some(r) => json!({
            "scope": r.scope, "backend": r.backend, "holder": r.holder, "token": r.token,
            "address": r.address, "since": format_millis(r.since),
            "leader_time": (r.leader_time > 0).then(|| format_millis(r.leader_time)),
            "is_self": me == Some(r.token) && r.holder == state.node.config.node_id,
            "answered_by": state.node.config.node_id,
            "backpressure": state.node.pressure(),
        }),
        None => {
            json!({"scope": SCOPE, "backend": state.node.elector_backend, "holder": null, "token": null, "address": null, "since": null, "is_self": false,
                   "answered_by": state.node.config.node_id})
        }
    };
    let clock = state.node.clock_status();
    answer["clock"] =
        json!({"skew_ms": clock.skew_ms, "verdict": clock.verdict, "stepped_down_at": clock.stepped_down_at.map(format_millis)});
    if let Some(st) = raft {
        answer["raft"] = serde_json::to_value(st).unwrap_or(Value::Null);
    }
    Ok(marked(q.stale, Json(answer)))
}

/// How long a readiness answer is reused: `/readyz` needs no credential,
/// so a flood of probes must not become a flood of store queries.
const READY_CACHE: std::time::Duration = std::time::Duration::from_secs(1);

/// The last readiness check: when, and whether a leader is recorded (or why not).
pub type ReadyCheck = Option<(std::time::Instant, Result<bool, ApiError>)>;

async fn readyz(State(state): State<ApiState>) -> Response {
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
        Ok(true) => Json(json!({"status": "ready", "leading": state.node.leading_token().is_some()})).into_response(),
        Ok(false) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "no_leader", "no leader has been elected yet").into_response(),
        Err(e) => match state.raft.as_ref().map(|s| s.member.status()) {
            Some(st) => degraded(&st, &e.message).into_response(),
            None => e.into_response(),
        },
    }
}

async fn metrics_text(State(state): State<ApiState>) -> Response {
    match &state.metrics {
        Some(h) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.render()).into_response(),
        None => ApiError::new(StatusCode::NOT_FOUND, "not_found", "metrics are not enabled").into_response(),
    }
}

async fn openapi() -> impl IntoResponse {
    Json(crate::openapi::document())
}
