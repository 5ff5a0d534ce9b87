//! `/v1/runs`.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use gnomon_api::{Attempt, Run, RunList};
use gnomon_backend::{CancelOutcome, RunDetail, RunFilter, RunRecord};
use gnomon_core::{format_millis, RunState};
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::extract::{check_ns, marked, query, reader, Caller};
use super::state::ApiState;
use crate::auth::Principal;

/// A run as the API shows it: with its attempts when `detail` is given,
/// and their output when `with_output`.
pub fn run_view(run: &RunRecord, detail: Option<&RunDetail>, with_output: bool) -> Run {
    Run {
        id: run.id.clone(),
        job: run.job.clone(),
        namespace: run.namespace.clone(),
        scheduled_at: format_millis(run.scheduled_at),
        fired_at: format_millis(run.fired_at),
        state: run.state,
        attempt: run.attempt,
        reason: run.reason.clone(),
        manual: run.manual,
        next_attempt_at: run.next_attempt_at.map(format_millis),
        cancel_requested: run.cancel_requested,
        updated_at: format_millis(run.updated_at),
        attempts: detail.map(|d| {
            d.attempts
                .iter()
                .map(|a| Attempt {
                    attempt: a.attempt,
                    worker: a.worker.clone(),
                    token: a.token,
                    state: a.state,
                    assigned_at: format_millis(a.assigned_at),
                    started_at: a.started_at.map(format_millis),
                    ended_at: a.ended_at.map(format_millis),
                    exit_code: a.exit_code,
                    output: with_output.then(|| a.output.clone()),
                })
                .collect()
        }),
        waiting_for: None,
        graph: None,
        notifications: None,
        params: run.params.as_deref().and_then(|p| serde_json::from_str(p).ok()),
        payload: detail.and(run.payload.clone()),
    }
}

/// A run's notifications as the API shows them.
pub fn notification_views(list: &[gnomon_backend::Notification]) -> Vec<gnomon_api::runs::RunNotification> {
    list.iter()
        .map(|n| {
            let target: Option<gnomon_core::notify::NotifyTarget> = serde_json::from_str(&n.target).ok();
            let destination =
                target.as_ref().and_then(|t| url::Url::parse(t.url()).ok()).map(|u| u.origin().ascii_serialization()).unwrap_or_default();
            gnomon_api::runs::RunNotification {
                id: n.id.clone(),
                outcome: n.outcome.clone(),
                kind: target.as_ref().map_or("unknown", |t| t.kind()).to_string(),
                destination,
                state: n.state.as_str().to_string(),
                attempts: n.attempts,
                next_at: (n.state == gnomon_backend::NotificationState::Pending).then(|| format_millis(n.next_at)),
                last_error: n.last_error.clone(),
                created_at: format_millis(n.created_at),
                updated_at: format_millis(n.updated_at),
            }
        })
        .collect()
}

#[utoipa::path(get, path = "/v1/runs", tag = "runs", summary = "List runs, newest first",
    params(("job" = Option<gnomon_core::schema::Name>, Query, nullable = false, description = "Only this job's runs"),
        ("namespace" = Option<gnomon_core::schema::Namespace>, Query, nullable = false, description = "Only this namespace's runs (required of a credential limited to several namespaces)"),
        ("state" = Option<RunState>, Query, nullable = false, description = "Only runs in this state"),
        ("limit" = Option<u32>, Query, nullable = false, minimum = 1, maximum = 1000, description = "1 to 1000, default 100"),
        ("cursor" = Option<String>, Query, nullable = false, pattern = "^-?[0-9]{1,18}$", description = "next_cursor of the previous page"),
        ("stale" = Option<bool>, Query, nullable = false, description = "Read this replica's copy without confirming it with the leader")),
    responses((status = 200, body = RunList),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable")))]
pub(super) async fn list_runs(State(state): State<ApiState>, Caller(p): Caller, raw: RawQuery) -> ApiResult<impl IntoResponse> {
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
    let mut q: Q = query(raw.0.as_deref())?;
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
    let runs = page.runs.iter().map(|r| run_view(r, None, false)).collect();
    Ok(marked(q.stale, Json(RunList { runs, next_cursor: page.next_cursor.map(|c| c.to_string()) })))
}

/// A run the caller may see (one in another namespace does not exist for it).
async fn load_run(state: &ApiState, p: &Principal, id: &str) -> ApiResult<RunDetail> {
    load_run_from(state.node.store.as_ref(), p, id).await
}

pub(super) async fn load_run_from(store: &dyn gnomon_backend::Store, p: &Principal, id: &str) -> ApiResult<RunDetail> {
    let missing = || ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("run {id} does not exist"));
    let detail = store.get_run(id).await?.ok_or_else(missing)?;
    if !p.sees(&detail.run.namespace) {
        return Err(missing());
    }
    Ok(detail)
}

#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", summary = "Get a run with its attempts and their output",
    params(("id" = String, Path), ("stale" = Option<bool>, Query, nullable = false, description = "Read this replica's copy without confirming it with the leader")),
    responses((status = 200, body = Run),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable")))]
pub(super) async fn get_run(
    State(state): State<ApiState>,
    Caller(p): Caller,
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
    let mut v = run_view(&detail.run, Some(&detail), true);
    if detail.run.state == RunState::Pending {
        v.waiting_for = state.node.waiting_reason(&detail.run.job_uid);
    }
    let (graph, waiting) = super::dependencies::instant_graph(reader(&state, q.stale).as_ref(), &detail.run).await?;
    v.graph = graph;
    if waiting.is_some() {
        v.waiting_for = waiting;
    }
    let notes = reader(&state, q.stale).run_notifications(&id).await?;
    v.notifications = Some(notification_views(&notes));
    Ok(marked(q.stale, Json(v)))
}

#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "runs", summary = "Cancel a run",
    params(("id" = String, Path)),
    responses((status = 200, body = Run, description = "cancelled"), (status = 202, body = Run, description = "the leader is stopping its attempt"),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 409, body = gnomon_api::ErrorBody, description = "the call conflicts with what the server holds"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(super) async fn cancel_run(State(state): State<ApiState>, Caller(p): Caller, Path(id): Path<String>) -> ApiResult<impl IntoResponse> {
    load_run(&state, &p, &id).await?;
    let outcome = state.node.store.request_cancel(&id, state.node.clock.now_millis()).await?;
    state.node.run_changed(&id);
    let detail = load_run(&state, &p, &id).await?;
    let status = if outcome == CancelOutcome::Cancelled { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(run_view(&detail.run, Some(&detail), true))))
}
