//! `/v1/jobs/{name}/backfill` and `/v1/backfills`: a backfill is asked of
//! any server, which checks it and hands it to the leader; the leader
//! admits it against its namespace's quotas, writes it, and works through
//! it.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use gnomon_api::{Backfill, BackfillList, BackfillRequest};
use gnomon_backend::{backfill_id, BackfillRecord, NewBackfill, StoreError};
use gnomon_core::{format_millis, Millis};
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::extract::{check_ns, marked, query, reader, BoundedBody, Caller, NsQuery, Query};
use super::jobs::load_job;
use super::state::ApiState;
use crate::leader::TriggerError;

/// The most instants one backfill may cover.
pub const MAX_BACKFILL_INSTANTS: usize = 100_000;
/// Instants per second when a backfill names no rate.
pub const DEFAULT_BACKFILL_RATE: u32 = 10;
/// The highest rate a backfill may ask for.
pub const MAX_BACKFILL_RATE: u32 = 1000;

/// A backfill as the API shows it.
pub fn backfill_view(b: &BackfillRecord) -> Backfill {
    Backfill {
        id: b.id.clone(),
        namespace: b.namespace.clone(),
        job: b.job.clone(),
        from: format_millis(b.from),
        to: format_millis(b.to),
        params: b.params.as_deref().and_then(|p| serde_json::from_str(p).ok()),
        rate: b.rate,
        state: b.state.as_str().to_string(),
        total: b.total,
        created: b.created,
        kept: b.kept,
        cursor: (b.cursor >= b.from).then(|| format_millis(b.cursor)),
        reason: b.reason.clone(),
        created_at: format_millis(b.created_at),
        updated_at: format_millis(b.updated_at),
    }
}

fn instant(field: &str, text: &str) -> ApiResult<Millis> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| ApiError::bad("invalid_time", format!("{field}: {text:?} is not an RFC 3339 time: {e}")))
}

fn body(bytes: &[u8]) -> ApiResult<BackfillRequest> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let body: BackfillRequest =
        serde_path_to_error::deserialize(&mut de).map_err(|e| ApiError::bad("invalid_body", format!("{}: {}", e.path(), e.inner())))?;
    de.end().map_err(|e| ApiError::bad("invalid_json", format!("body: {e}")))?;
    Ok(body)
}

#[utoipa::path(post, path = "/v1/jobs/{name}/backfill", tag = "jobs", summary = "Backfill the past instants of a job's schedule",
    description = "Creates a run for each instant of the job's schedule in `[from, to]` that has no run or skip record, by the \
        instant's own run id, at most `rate` instants a second; an instant that has a record keeps it, so a repeated or \
        overlapping backfill creates nothing twice. The leader works through it and records its progress.",
    params(("name" = gnomon_core::schema::Name, Path, description = "The job's name"), ("namespace" = Option<gnomon_core::schema::Namespace>, Query, nullable = false, description = "The job's namespace (default `default`)")),
    request_body = BackfillRequest,
    responses((status = 201, body = Backfill),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 409, body = gnomon_api::ErrorBody, description = "the call conflicts with what the server holds"),
        (status = 413, body = gnomon_api::ErrorBody, description = "the body is larger than 1 MiB"),
        (status = 429, body = gnomon_api::ErrorBody, description = "over a quota of the namespace: nothing was written; `Retry-After` says when to ask again", headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(super) async fn create_backfill(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Caller(p): Caller,
    Query(q): Query<NsQuery>,
    parts: axum::http::request::Parts,
    BoundedBody(bytes): BoundedBody,
) -> ApiResult<axum::response::Response> {
    check_ns(&p, q.namespace())?;
    let b = body(&bytes)?;
    let job = load_job(&state, q.namespace(), &name).await?;
    let (from, to) = (instant("from", &b.from)?, instant("to", &b.to)?);
    let now = state.node.clock.now_millis();
    if from > to {
        return Err(ApiError::bad("invalid_range", "from: the range's first instant is after its last (`to`)"));
    }
    // A backfill covers past instants only: the future is the schedule's.
    let to = to.min(now);
    let rate = b.rate.unwrap_or(DEFAULT_BACKFILL_RATE);
    if !(1..=MAX_BACKFILL_RATE).contains(&rate) {
        return Err(ApiError::bad("invalid_rate", format!("rate: instants per second, 1 to {MAX_BACKFILL_RATE}")));
    }
    let compiled = job.spec.compile()?;
    if compiled.schedule.is_manual() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_schedule",
            format!("job {}/{name} has no schedule, so no instants to backfill", job.namespace),
        ));
    }
    let (instants, cut) = compiled.schedule.fires_between(from - 1, to, MAX_BACKFILL_INSTANTS);
    if cut {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "too_many_instants",
            format!("from: the range holds more than {MAX_BACKFILL_INSTANTS} instants; split it"),
        ));
    }
    if instants.is_empty() {
        return Err(ApiError::new(StatusCode::CONFLICT, "no_instants", "from: the job's schedule has no past instant in the range"));
    }
    let given = b.params.unwrap_or_default();
    let params = gnomon_core::params::resolve(&job.spec.params, &given)?.map(|p| serde_json::to_string(&p).unwrap_or_default());
    let new = NewBackfill {
        id: backfill_id(&job.uid, now),
        namespace: job.namespace.clone(),
        job: job.name.clone(),
        job_uid: job.uid.clone(),
        from,
        to,
        params,
        rate,
        total: instants.len() as u64,
    };
    let Some(tx) = state.node.leader_commands() else {
        // Only the leader admits a backfill: a follower hands on a request
        // it checked (the leader checks it again).
        return super::forward::with_body(&state, &parts, bytes.to_vec()).await;
    };
    let ended = || super::forward::not_leader(&state, "its leader term ended during the call");
    let (reply, answer) = tokio::sync::oneshot::channel();
    tx.send(crate::leader::LeaderCommand::Backfill { new, reply }).await.map_err(|_| ended())?;
    let created = tokio::time::timeout(std::time::Duration::from_secs(30), answer)
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "timeout", "the leader did not answer in 30s"))?
        .map_err(|_| ended())?
        .map_err(|e| match e {
            TriggerError::Store(StoreError::AlreadyExists(_)) => ApiError::new(
                StatusCode::CONFLICT,
                "backfill_exists",
                "a backfill of this job was asked for in the same millisecond; ask again",
            ),
            TriggerError::Store(e) => e.into(),
            TriggerError::Quota(q) => q.into(),
            e => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
        })?;
    Ok((StatusCode::CREATED, Json(backfill_view(&created))).into_response())
}

#[utoipa::path(get, path = "/v1/backfills", tag = "backfills", summary = "List backfills, newest first",
    params(("namespace" = Option<gnomon_core::schema::Namespace>, Query, nullable = false, description = "Only this namespace"), ("job" = Option<gnomon_core::schema::Name>, Query, nullable = false, description = "Only this job's"),
        ("stale" = Option<bool>, Query, nullable = false, description = "Read this replica's copy without confirming it with the leader")),
    responses((status = 200, body = BackfillList),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable")))]
pub(super) async fn list_backfills(State(state): State<ApiState>, Caller(p): Caller, raw: RawQuery) -> ApiResult<impl IntoResponse> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Q {
        namespace: Option<String>,
        job: Option<String>,
        stale: Option<bool>,
    }
    let q: Q = query(raw.0.as_deref())?;
    if let Some(ns) = &q.namespace {
        check_ns(&p, ns)?;
    }
    let mut list = reader(&state, q.stale).list_backfills(q.namespace.as_deref()).await?;
    list.retain(|b| p.sees(&b.namespace) && q.job.as_ref().is_none_or(|j| *j == b.job));
    Ok(marked(q.stale, Json(BackfillList { backfills: list.iter().map(backfill_view).collect() })))
}

async fn visible(state: &ApiState, p: &crate::auth::Principal, id: &str, stale: Option<bool>) -> ApiResult<BackfillRecord> {
    match reader(state, stale).get_backfill(id).await? {
        Some(b) if p.sees(&b.namespace) => Ok(b),
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("backfill {id} does not exist"))),
    }
}

#[utoipa::path(get, path = "/v1/backfills/{id}", tag = "backfills", summary = "Get a backfill and its progress",
    params(("id" = String, Path), ("stale" = Option<bool>, Query, nullable = false, description = "Read this replica's copy without confirming it with the leader")),
    responses((status = 200, body = Backfill),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable")))]
pub(super) async fn get_backfill(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Caller(p): Caller,
    raw: RawQuery,
) -> ApiResult<impl IntoResponse> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Q {
        stale: Option<bool>,
    }
    let q: Q = query(raw.0.as_deref())?;
    let b = visible(&state, &p, &id, q.stale).await?;
    Ok(marked(q.stale, Json(backfill_view(&b))))
}

#[utoipa::path(post, path = "/v1/backfills/{id}/cancel", tag = "backfills", summary = "Cancel a running backfill (the runs it created stay)",
    params(("id" = String, Path)),
    responses((status = 200, body = Backfill),
        (status = 409, body = gnomon_api::ErrorBody, description = "it has ended"),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(super) async fn cancel_backfill(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Caller(p): Caller,
) -> ApiResult<impl IntoResponse> {
    visible(&state, &p, &id, None).await?;
    let b = state.node.store.cancel_backfill(&id, state.node.clock.now_millis()).await.map_err(|e| match e {
        StoreError::Terminal(_) => ApiError::new(StatusCode::CONFLICT, "backfill_ended", format!("backfill {id} has ended")),
        e => e.into(),
    })?;
    state.node.nudge();
    Ok(Json(backfill_view(&b)))
}
