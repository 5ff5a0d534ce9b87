//! `/v1/jobs` and `/v1/schedules/preview`.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use gnomon_api::{Job, JobList, JobStatus, SchedulePreview, SchedulePreviewRequest};
use gnomon_backend::{JobRecord, Precondition};
use gnomon_core::format_millis;
use gnomon_core::spec::{parse_job_json, JobSpec};
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::extract::{check_ns, marked, query, reader, BoundedBody, Caller, IfMatch, NsQuery, Query};
use super::state::ApiState;
use crate::auth::Principal;

/// A job as the API shows it.
pub fn job_view(job: &JobRecord, next_fire_at: Option<i64>) -> Job {
    Job {
        spec: job.spec.clone(),
        status: JobStatus {
            version: job.version,
            paused: job.paused,
            created_at: format_millis(job.created_at),
            updated_at: format_millis(job.updated_at),
            last_scheduled_at: job.last_scheduled_at.map(format_millis),
            next_fire_at: next_fire_at.map(format_millis),
        },
    }
}

fn next_fire(state: &ApiState, job: &JobRecord) -> Option<i64> {
    if job.paused {
        return None;
    }
    let compiled = job.spec.compile().ok()?;
    let now = state.node.clock.now_millis();
    let schedule = &compiled.schedule;
    // An instant whose jittered fire is still to come may lie before now.
    let base = job.last_scheduled_at.unwrap_or(job.created_at).max(now - 1 - schedule.max_jitter_ms());
    let mut next = schedule.next_after(base)?;
    while schedule.fire_at(next) < now {
        next = schedule.next_after(next)?;
    }
    Some(schedule.fire_at(next))
}

fn view(state: &ApiState, job: &JobRecord) -> Job {
    job_view(job, next_fire(state, job))
}

fn check_name(name: &str) -> ApiResult<()> {
    gnomon_core::spec::validate_name("name", name, gnomon_core::spec::MAX_NAME_LEN).map_err(ApiError::from)
}

#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", summary = "Create a job",
    params(("namespace" = Option<gnomon_core::schema::Namespace>, Query, nullable = false, description = "The namespace when the body names none")),
    request_body = JobSpec,
    responses((status = 201, body = Job),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 409, body = gnomon_api::ErrorBody, description = "the call conflicts with what the server holds"),
        (status = 429, body = gnomon_api::ErrorBody, description = "its edges would pass the namespace's `downstream_runs` quota: nothing was written", headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
        (status = 413, body = gnomon_api::ErrorBody, description = "the body is larger than 1 MiB"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(super) async fn create_job(
    State(state): State<ApiState>,
    Caller(p): Caller,
    Query(q): Query<NsQuery>,
    BoundedBody(bytes): BoundedBody,
) -> ApiResult<impl IntoResponse> {
    let mut spec = parse_job_json(&bytes)?;
    if spec.namespace.is_none() && q.namespace.is_some() {
        spec.namespace = q.namespace.clone();
    }
    let compiled = spec.compile()?;
    check_ns(&p, compiled.spec.namespace())?;
    super::dependencies::check_fan_out(&state, &compiled.spec).await?;
    let job = state.node.store.put_job(&compiled.spec, Precondition::DoesNotExist, state.node.clock.now_millis()).await?;
    state.node.nudge();
    Ok((StatusCode::CREATED, Json(view(&state, &job))))
}

#[utoipa::path(put, path = "/v1/jobs/{name}", tag = "jobs", summary = "Create or update a job (If-Match or ?version= for a precondition)",
    params(("name" = gnomon_core::schema::Name, Path, description = "The job's name"), ("namespace" = Option<gnomon_core::schema::Namespace>, Query, nullable = false, description = "The job's namespace (default `default`)"), ("version" = Option<u64>, Query, nullable = false, minimum = 1, maximum = 9007199254740991_u64, description = "Only if the job is at this version (as If-Match)"),
        ("If-Match" = Option<String>, Header, nullable = false, pattern = "^(?:[1-9][0-9]{0,15}|\"[1-9][0-9]{0,15}\")$", description = "Only if the job is at this version (its `status.version`, quoted or not); `?version=` wins when both are given")),
    request_body(content = gnomon_core::schema::JobUpdate, description = "The job; the path names it (a body that gives a `name` must give the path's)"),
    responses((status = 200, body = Job, description = "updated"), (status = 201, body = Job, description = "created"),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 409, body = gnomon_api::ErrorBody, description = "the call conflicts with what the server holds"),
        (status = 429, body = gnomon_api::ErrorBody, description = "its edges would pass the namespace's `downstream_runs` quota: nothing was written", headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
        (status = 413, body = gnomon_api::ErrorBody, description = "the body is larger than 1 MiB"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(super) async fn put_job(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Caller(p): Caller,
    Query(q): Query<NsQuery>,
    IfMatch(if_match): IfMatch,
    BoundedBody(bytes): BoundedBody,
) -> ApiResult<impl IntoResponse> {
    check_name(&name)?;
    let mut spec: JobSpec = parse_job_json(&named(bytes, &name))?;
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
    super::dependencies::check_fan_out(&state, &compiled.spec).await?;
    let existed = state.node.store.get_job(compiled.spec.namespace(), &name).await?.is_some();
    let job = state.node.store.put_job(&compiled.spec, precondition, state.node.clock.now_millis()).await?;
    state.node.nudge();
    Ok((if existed { StatusCode::OK } else { StatusCode::CREATED }, Json(view(&state, &job))))
}

/// A `PUT` body that names no job is the job the path names.
fn named(bytes: Vec<u8>, name: &str) -> Vec<u8> {
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(mut body)) if !body.contains_key("name") => {
            body.insert("name".into(), name.into());
            serde_json::to_vec(&body).unwrap_or(bytes)
        }
        _ => bytes,
    }
}

#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", summary = "List jobs",
    params(("namespace" = Option<gnomon_core::schema::Namespace>, Query, nullable = false, description = "Only this namespace"), ("stale" = Option<bool>, Query, nullable = false, description = "Read this replica's copy without confirming it with the leader")),
    responses((status = 200, body = JobList),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable")))]
pub(super) async fn list_jobs(State(state): State<ApiState>, Caller(p): Caller, raw: RawQuery) -> ApiResult<impl IntoResponse> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Q {
        namespace: Option<String>,
        stale: Option<bool>,
    }
    let q: Q = query(raw.0.as_deref())?;
    if let Some(ns) = &q.namespace {
        check_ns(&p, ns)?;
    }
    let mut jobs = reader(&state, q.stale).list_jobs(q.namespace.as_deref()).await?;
    jobs.retain(|j| p.sees(&j.namespace));
    let jobs = jobs.iter().map(|j| view(&state, j)).collect();
    Ok(marked(q.stale, Json(JobList { jobs })))
}

pub(super) async fn load_job(state: &ApiState, ns: &str, name: &str) -> ApiResult<JobRecord> {
    load_job_from(state.node.store.as_ref(), ns, name).await
}

async fn load_job_from(store: &dyn gnomon_backend::Store, ns: &str, name: &str) -> ApiResult<JobRecord> {
    check_name(name)?;
    store
        .get_job(ns, name)
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("job {ns}/{name} does not exist")))
}

#[utoipa::path(get, path = "/v1/jobs/{name}", tag = "jobs", summary = "Get a job",
    params(("name" = gnomon_core::schema::Name, Path, description = "The job's name"), ("namespace" = Option<gnomon_core::schema::Namespace>, Query, nullable = false, description = "The job's namespace (default `default`)"), ("stale" = Option<bool>, Query, nullable = false, description = "Read this replica's copy without confirming it with the leader")),
    responses((status = 200, body = Job),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable")))]
pub(super) async fn get_job(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Caller(p): Caller,
    Query(q): Query<NsQuery>,
) -> ApiResult<impl IntoResponse> {
    check_ns(&p, q.namespace())?;
    let job = load_job_from(reader(&state, q.stale).as_ref(), q.namespace(), &name).await?;
    Ok(marked(q.stale, Json(view(&state, &job))))
}

#[utoipa::path(delete, path = "/v1/jobs/{name}", tag = "jobs", summary = "Delete a job (its runs stay in the history; refused while other jobs run after it)",
    params(("name" = gnomon_core::schema::Name, Path, description = "The job's name"), ("namespace" = Option<gnomon_core::schema::Namespace>, Query, nullable = false, description = "The job's namespace (default `default`)"), ("version" = Option<u64>, Query, nullable = false, minimum = 1, maximum = 9007199254740991_u64, description = "Only if the job is at this version (as If-Match)"),
        ("If-Match" = Option<String>, Header, nullable = false, pattern = "^(?:[1-9][0-9]{0,15}|\"[1-9][0-9]{0,15}\")$", description = "Only if the job is at this version (its `status.version`, quoted or not); `?version=` wins when both are given")),
    responses((status = 204, description = "deleted"),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 409, body = gnomon_api::ErrorBody, description = "the call conflicts with what the server holds"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(super) async fn delete_job(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Caller(p): Caller,
    Query(q): Query<NsQuery>,
    IfMatch(if_match): IfMatch,
) -> ApiResult<impl IntoResponse> {
    check_name(&name)?;
    check_ns(&p, q.namespace())?;
    let precondition = match q.version.or(if_match) {
        Some(v) => Precondition::MatchesVersion(v),
        None => Precondition::None,
    };
    state.node.store.delete_job(q.namespace(), &name, precondition).await?;
    state.node.nudge();
    Ok(StatusCode::NO_CONTENT)
}

async fn set_paused(state: ApiState, name: String, p: Principal, q: NsQuery, paused: bool) -> ApiResult<Json<Job>> {
    check_name(&name)?;
    check_ns(&p, q.namespace())?;
    let job = state.node.store.set_job_paused(q.namespace(), &name, paused, state.node.clock.now_millis()).await?;
    state.node.nudge();
    Ok(Json(view(&state, &job)))
}

#[utoipa::path(post, path = "/v1/jobs/{name}/pause", tag = "jobs", summary = "Pause a job (times that pass while it is paused do not fire)",
    params(("name" = gnomon_core::schema::Name, Path, description = "The job's name"), ("namespace" = Option<gnomon_core::schema::Namespace>, Query, nullable = false, description = "The job's namespace (default `default`)")),
    responses((status = 200, body = Job),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(super) async fn pause_job(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Caller(p): Caller,
    Query(q): Query<NsQuery>,
) -> ApiResult<impl IntoResponse> {
    set_paused(state, name, p, q, true).await
}

#[utoipa::path(post, path = "/v1/jobs/{name}/resume", tag = "jobs", summary = "Resume a paused job",
    params(("name" = gnomon_core::schema::Name, Path, description = "The job's name"), ("namespace" = Option<gnomon_core::schema::Namespace>, Query, nullable = false, description = "The job's namespace (default `default`)")),
    responses((status = 200, body = Job),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such resource"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(super) async fn resume_job(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Caller(p): Caller,
    Query(q): Query<NsQuery>,
) -> ApiResult<impl IntoResponse> {
    set_paused(state, name, p, q, false).await
}

#[utoipa::path(post, path = "/v1/schedules/preview", tag = "jobs", summary = "The next fire times of a schedule, with daylight-saving changes marked",
    request_body = SchedulePreviewRequest,
    responses((status = 200, body = SchedulePreview),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 401, body = gnomon_api::ErrorBody, description = "no credential, or one the server does not know"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the credential's role or namespaces do not cover the call"),
        (status = 413, body = gnomon_api::ErrorBody, description = "the body is larger than 1 MiB"),
        (status = 415, body = gnomon_api::ErrorBody, description = "a body or Content-Type other than application/json")))]
pub(super) async fn preview_schedule(State(state): State<ApiState>, BoundedBody(bytes): BoundedBody) -> ApiResult<Json<SchedulePreview>> {
    use gnomon_core::preview::{format_local, format_offset, preview, zone_of};
    let body: SchedulePreviewRequest = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad("invalid_json", format!("a preview is {{\"schedule\": {{…}}, \"count\": N}}: {e}")))?;
    let count = body.count.unwrap_or(10);
    if !(1..=gnomon_core::preview::MAX_PREVIEW as u32).contains(&count) {
        return Err(ApiError::bad("invalid_count", format!("count must be between 1 and {}", gnomon_core::preview::MAX_PREVIEW)));
    }
    let after = match &body.after {
        None => state.node.clock.now_millis(),
        Some(t) => chrono::DateTime::parse_from_rfc3339(t)
            .map_err(|e| ApiError::bad("invalid_time", format!("after: {t:?} is not an RFC 3339 time: {e}")))?
            .timestamp_millis(),
    };
    let namespace = body.namespace.as_deref().unwrap_or(gnomon_core::spec::DEFAULT_NAMESPACE);
    if let Some(job) = &body.job {
        check_name(job)?;
        gnomon_core::spec::validate_name("namespace", namespace, gnomon_core::spec::MAX_NAMESPACE_LEN)?;
    }
    let schedule = body.schedule.compile(body.job.as_deref().map(|job| (namespace, job)))?;
    let (start_at, end_at) = schedule.bounds();
    let tz = zone_of(&schedule);
    let fires = preview(&schedule, after, count as usize)
        .into_iter()
        .map(|f| gnomon_api::PreviewFire {
            at: format_millis(f.at),
            local: format_local(&tz, f.at),
            offset: format_offset(f.offset_seconds),
            offset_changed_from: f.offset_changed_from.map(format_offset),
            note: f.note,
            fire_at: f.fire_at.map(format_millis),
        })
        .collect();
    Ok(Json(SchedulePreview {
        timezone: tz.name().to_string(),
        after: format_millis(after),
        fires,
        start_at: start_at.map(format_millis),
        end_at: end_at.map(format_millis),
    }))
}
