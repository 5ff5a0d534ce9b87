//! The REST API (`/v1`), health, readiness, metrics, OpenAPI and the UI.
//!
//! Every error is `{"error":{"code","message"}}` with a 4xx/5xx status. Job
//! bodies are read with a 1 MiB limit, must be UTF-8 JSON with no unknown
//! fields, and are fully validated before anything is written.

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use crate::auth::Denied;

mod audit;
pub mod authz;
pub(crate) mod backfills;
mod dependencies;
pub mod error;
pub mod extract;
pub mod forward;
mod forwarder;
pub(crate) mod hooks;
pub(crate) mod jobs;
pub(crate) mod output;
pub(crate) mod runs;
pub mod state;
pub(crate) mod status;
pub(crate) mod trigger;
pub(crate) mod usage;
pub(crate) mod workers;

use error::json_errors;
pub use error::ApiError;
pub use extract::MAX_BODY_BYTES;
pub use forwarder::Forwarder;
pub use jobs::job_view;
pub use runs::run_view;
pub use state::{ApiState, ReadyCheck};
pub use status::cluster_view;
pub use trigger::MAX_TRIGGER_COUNT;

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
        .route("/jobs/{name}/trigger", post(Policy::operator("triggering a job"), trigger::trigger_job))
        .route("/jobs/{name}/backfill", post(Policy::operator("backfilling a job"), backfills::create_backfill))
        .route("/backfills", get(READ, backfills::list_backfills))
        .route("/backfills/{id}", get(READ, backfills::get_backfill))
        .route("/backfills/{id}/cancel", post(Policy::operator("cancelling a backfill"), backfills::cancel_backfill))
        .route("/jobs/{name}/pause", post(Policy::operator("pausing a job"), jobs::pause_job))
        .route("/jobs/{name}/resume", post(Policy::operator("resuming a job"), jobs::resume_job))
        .route("/schedules/preview", post(Policy::viewer("previewing a schedule"), jobs::preview_schedule))
        .route("/runs", get(READ, runs::list_runs))
        .route("/runs/{id}", get(READ, runs::get_run))
        .route("/runs/{id}/output", get(READ, output::run_output))
        .route("/runs/{id}/cancel", post(Policy::operator("cancelling a run"), runs::cancel_run))
        .route("/workers", get(READ, status::list_workers))
        .route("/workers/{id}/binding", delete(Policy::UnrestrictedAdmin("releasing a worker id"), workers::release_worker))
        .route("/namespaces", get(READ, usage::list_usage))
        .route("/namespaces/{namespace}", get(READ, usage::get_usage))
        .route("/whoami", get(READ, status::whoami))
        .route("/leader", get(READ, status::leader))
}

pub fn router(state: ApiState) -> Router {
    use authz::Policy;
    let v1 = v1_routes()
        .merge(crate::cluster_api::routes())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .layer(axum::middleware::from_fn_with_state(state.clone(), authz::authenticate));
    let sessions = crate::sessions::WorkerService::new(state.node.clone(), state.auth.clone(), state.worker_owners.clone());
    let grpc = gnomon_proto::v1::worker_server::WorkerServer::new(sessions).max_decoding_message_size(8 << 20);
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
        // A webhook call carries no credential: its policy is the job's
        // signature, checked by the handler before anything is written.
        .route("/v1/hooks/{namespace}/{job}", axum::routing::post(hooks::hook))
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
