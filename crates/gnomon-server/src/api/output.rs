//! `GET /v1/runs/{id}/output`: an attempt's output, live while it runs.
//!
//! Live output is kept by the leader (`crate::live`); a follower forwards
//! the call. Once the attempt has ended, the answer is the output kept
//! with it in the store, or, to a reader that followed it (`from` > 0),
//! the rest of its live output while the leader still keeps it.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gnomon_api::RunOutput;
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::extract::{query, Caller};
use super::state::ApiState;

#[utoipa::path(get, path = "/v1/runs/{id}/output", tag = "runs", summary = "Read an attempt's output, live while it runs",
    params(("id" = String, Path),
        ("attempt" = Option<u32>, Query, nullable = false, minimum = 1, description = "The attempt (default: the run's current one)"),
        ("from" = Option<u64>, Query, nullable = false, minimum = 0, description = "Where to start in the live output: the `next` of the previous answer (default 0)")),
    responses((status = 200, body = RunOutput),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable")))]
pub(super) async fn run_output(
    State(state): State<ApiState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    req: axum::extract::Request,
) -> ApiResult<Response> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Q {
        attempt: Option<u32>,
        from: Option<u64>,
    }
    let q: Q = query(req.uri().query())?;
    if q.attempt == Some(0) {
        return Err(ApiError::bad("invalid_query", "attempt: attempts are numbered from 1"));
    }
    if state.node.leading_token().is_none() {
        // Live output is on the leader: a follower asks it.
        return super::forward::to_leader(&state, req).await;
    }
    let detail = super::runs::load_run_from(state.node.store.as_ref(), &p, &id).await?;
    let run = &detail.run;
    let attempt = q.attempt.unwrap_or(run.attempt);
    let mut answer =
        RunOutput { run_id: run.id.clone(), attempt, state: run.state, live: false, from: 0, next: 0, skipped: 0, text: String::new() };
    if attempt == 0 {
        return Ok(Json(answer).into_response());
    }
    if attempt > run.attempt {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "not_found",
            format!("run {id} has had {} attempts, not {attempt}", run.attempt),
        ));
    }
    if attempt == run.attempt && run.state.is_active() {
        answer.live = true;
        let from = q.from.unwrap_or(0);
        answer.from = from;
        answer.next = from;
        if let Some(r) = state.node.live().read(&run.id, attempt, from) {
            (answer.from, answer.next, answer.skipped, answer.text) = (r.from, r.next, r.skipped, r.text);
        }
    } else if let Some(r) = q.from.filter(|f| *f > 0).and_then(|from| state.node.live().read(&run.id, attempt, from)) {
        // A reader that followed the attempt reads its live output on to
        // its end (kept a while after the attempt ends).
        (answer.from, answer.next, answer.skipped, answer.text) = (r.from, r.next, r.skipped, r.text);
    } else if let Some(a) = detail.attempts.iter().find(|a| a.attempt == attempt) {
        answer.text = a.output.clone();
    }
    Ok(Json(answer).into_response())
}
