//! `POST /v1/jobs/{name}/trigger`, and what it shares with webhook calls:
//! the idempotency key, the trigger's body, and the round trip to the
//! leader that creates the runs.

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gnomon_api::{TriggerAnswer, TriggerBody, Triggered};
use gnomon_core::spec::DEFAULT_NAMESPACE;
use serde::Deserialize;
use tokio::sync::oneshot;

use super::error::{ApiError, ApiResult};
use super::extract::{check_ns, json_body, read_body, Caller, Query};
use super::forward::not_leader;
use super::jobs::load_job;
use super::state::ApiState;
use crate::leader::{AskClaim, LeaderCommand, TriggerError, TriggerRequest, Withdrawal};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TriggerQuery {
    namespace: Option<String>,
    /// How many manual runs to create at once (1 to 10,000).
    count: Option<u32>,
}

/// Most runs one trigger call may create.
pub const MAX_TRIGGER_COUNT: u32 = 10_000;

/// The header that names a manual run: a repeated call with the same key
/// answers with the run the first one created.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 255;

/// The request's idempotency key, if it has one: 1 to 255 visible ASCII
/// characters (spaces inside allowed), or a 400 that names the header.
pub(super) fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let Some(v) = headers.get(IDEMPOTENCY_KEY) else { return Ok(None) };
    let bad = |why: &str| ApiError::bad("invalid_idempotency_key", format!("the Idempotency-Key header {why}"));
    let key = v.to_str().map_err(|_| bad("must be visible ASCII text"))?;
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY {
        return Err(bad(&format!("must be 1 to {MAX_IDEMPOTENCY_KEY} characters long")));
    }
    if !key.bytes().all(|b| (0x20..0x7f).contains(&b)) || key.starts_with(' ') || key.ends_with(' ') {
        return Err(bad("must be visible ASCII text, with no space at either end"));
    }
    Ok(Some(key.to_string()))
}

#[utoipa::path(post, path = "/v1/jobs/{name}/trigger", tag = "jobs", summary = "Trigger manual runs now (on the leader)",
    description = "With an `Idempotency-Key` header, the call names one run: the first call with that key creates it \
        (201), and every later call with the same key for the same job, on any server and across leader changes, answers \
        with that run as it is (200) and creates nothing, for as long as retention keeps the run.",
    params(("name" = gnomon_core::schema::Name, Path, description = "The job's name"), ("namespace" = Option<gnomon_core::schema::Namespace>, Query, nullable = false, description = "The job's namespace (default `default`)"), ("count" = Option<u32>, Query, nullable = false, minimum = 1, maximum = 10000, description = "How many runs (1 to 10,000; default 1; 1 with an idempotency key)"),
        ("Idempotency-Key" = Option<String>, Header, nullable = false, min_length = 1, max_length = 255, pattern = "^[!-~](?:[ -~]*[!-~])?$", description = "1 to 255 visible ASCII characters (spaces inside) naming the run")),
    request_body(content = Option<TriggerBody>, description = "Optional: values of the job's params (the others keep their defaults)"),
    responses((status = 201, body = TriggerAnswer, description = "the run (count 1) or the ids of the runs"),
        (status = 200, body = TriggerAnswer, description = "the run the idempotency key already named; nothing was created"),
        (status = 409, body = gnomon_api::ErrorBody, description = "the idempotency key names a run that has other values of the params this call sets"),
        (status = 429, body = gnomon_api::ErrorBody, description = "over a quota of the namespace: nothing was written; `Retry-After` says when to ask again", headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 413, body = gnomon_api::ErrorBody, description = "the body is larger than 1 MiB"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 502, body = gnomon_api::ErrorBody, description = "the leader could not be reached"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(super) async fn trigger_job(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Caller(p): Caller,
    Query(q): Query<TriggerQuery>,
    req: Request,
) -> ApiResult<Response> {
    let ns = q.namespace.clone().unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
    check_ns(&p, &ns)?;
    let key = idempotency_key(req.headers())?;
    let count = q.count.unwrap_or(1);
    if !(1..=MAX_TRIGGER_COUNT).contains(&count) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_count", format!("count must be between 1 and {MAX_TRIGGER_COUNT}")));
    }
    if key.is_some() && count != 1 {
        return Err(ApiError::bad("invalid_count", "an Idempotency-Key names one run: count must be 1"));
    }
    if state.node.leader_commands().is_none() {
        // Only the leader creates runs: a follower hands on a call whose
        // caller, query and key it checked.
        return super::forward::to_leader(&state, req).await;
    }
    let body: TriggerBody = json_body(&read_body(req.into_body()).await?)?;
    let job = load_job(&state, &ns, &name).await?;
    // Checked here for a clear answer; the leader checks again against the
    // job as it is when it creates the run.
    gnomon_core::params::resolve(&job.spec.params, &body.params)?;
    let request = TriggerRequest { count, key, params: body.params, ..Default::default() };
    let triggered = ask_leader(&state, ns, name, request).await?;
    let status = if triggered.existed { StatusCode::OK } else { StatusCode::CREATED };
    let ids = triggered.ids;
    if count > 1 {
        return Ok((status, Json(TriggerAnswer::Many(Triggered { count: ids.len(), ids }))).into_response());
    }
    let id = ids.into_iter().next().ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "no run was created"))?;
    one_run(&state, status, &id).await
}

/// Has this server's leader create the runs `request` asks for.
pub(super) async fn ask_leader(
    state: &ApiState,
    namespace: String,
    name: String,
    request: TriggerRequest,
) -> ApiResult<crate::leader::Triggered> {
    let ended = || not_leader(state, "its leader term ended during the call");
    let tx = state.node.leader_commands().ok_or_else(ended)?;
    let (reply_tx, mut reply_rx) = oneshot::channel();
    // Should this call stop waiting (an error answered below, or its client
    // gone), its ask is withdrawn: the leader never writes it later.
    let claim = WithdrawOnDrop(request.claim.clone());
    tx.send(LeaderCommand::Trigger { namespace, name, request, reply: reply_tx }).await.map_err(|_| ended())?;
    let answer = match tokio::time::timeout(std::time::Duration::from_secs(30), &mut reply_rx).await {
        Ok(answer) => answer,
        Err(_) => match claim.0.withdraw() {
            Withdrawal::Withdrawn => {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "timeout",
                    "the leader did not answer in 30s; the trigger was withdrawn and creates nothing",
                ))
            }
            // Planned already: its write is on its way; wait for it a
            // little longer, and name its runs if it does not come.
            Withdrawal::Planned(ids) => match tokio::time::timeout(std::time::Duration::from_secs(10), &mut reply_rx).await {
                Ok(answer) => answer,
                Err(_) => return Err(planned_unconfirmed(&ids)),
            },
        },
    };
    answer
        .map_err(|_| match claim.0.withdraw() {
            Withdrawal::Planned(ids) if !ids.is_empty() => planned_unconfirmed(&ids),
            _ => ended(),
        })?
        .map_err(|e| match e {
            // A write whose outcome is unknown: its runs may exist.
            TriggerError::Store(_) if !claim.0.planned().is_empty() => planned_unconfirmed(&claim.0.planned()),
            TriggerError::Store(e) => ApiError::from(e),
            TriggerError::Params(e) => ApiError::from(e),
            TriggerError::KeyReused { .. } => ApiError::new(StatusCode::CONFLICT, "idempotency_key_reused", e.to_string()),
            TriggerError::NoWebhook => ApiError::new(StatusCode::NOT_FOUND, "no_webhook", e.to_string()),
            TriggerError::Quota(q) => ApiError::from(q),
        })
}

/// Withdraws an ask when its caller stops waiting (a no-op once the
/// leader planned it).
struct WithdrawOnDrop(AskClaim);

impl Drop for WithdrawOnDrop {
    fn drop(&mut self) {
        self.0.withdraw();
    }
}

/// The leader planned the runs `ids`, and their write was not confirmed:
/// they may exist; the caller reads them before asking again.
fn planned_unconfirmed(ids: &[String]) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "trigger_unconfirmed",
        format!(
            "the leader planned run(s) {} but did not confirm their write; read them (GET /v1/runs/ID) before triggering again",
            ids.join(", ")
        ),
    )
}

/// The answer naming one run, as the store has it now.
pub(super) async fn one_run(state: &ApiState, status: StatusCode, id: &str) -> ApiResult<Response> {
    let detail = state
        .node
        .store
        .get_run(id)
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "triggered run vanished"))?;
    Ok((status, Json(TriggerAnswer::One(Box::new(super::runs::run_view(&detail.run, Some(&detail), true))))).into_response())
}
