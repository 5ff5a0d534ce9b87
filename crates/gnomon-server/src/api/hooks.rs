//! `POST /v1/hooks/{namespace}/{job}`: a webhook call that starts a run of
//! a job that takes them (`triggers.webhook`).
//!
//! The call carries no credential: it is authenticated by its signature
//! under one of the job's secrets ([`crate::signing`]), over its place
//! (namespace and job), timestamp, idempotency key and body, and its
//! timestamp must be within the job's tolerance of this server's clock.
//!
//! Every server, a follower included, checks what is cheap before it reads
//! a body: the declared length, the path, the timestamp, that the job
//! takes calls and that this server holds a secret of it. The body of a
//! caller not yet proven holds a connection and memory, so it is bounded
//! three ways: at most [`MAX_PAYLOAD_BYTES`] of it is kept, taken first
//! from the listener's one budget for unproven bodies
//! ([`crate::listener::UnprovenBodies`]; a call that finds it spent is
//! answered 503 `webhooks_busy` at once, unread), and it must arrive whole
//! within [`BODY_DEADLINE`] (408 `body_timeout`, and an HTTP/1 connection
//! is closed). A refusal of the caller's proof (no such job, no webhook,
//! no secret held here, a bad or stale signature) is one answer, the same
//! 401 after draining the same bounded body, and a slow or busy call gets
//! the same answer whatever its job, so that no answer tells which jobs
//! exist.
//!
//! A call creates at most one run, whichever server answers it and however
//! often it is sent. With an `Idempotency-Key` (signed) the run's id comes
//! from the key, in the webhooks' own key space (no manual trigger's key
//! names it): a repeat answers 200 with that run. Without one, the run's
//! id comes from the call's signature, so a replay finds the run the first
//! call made and is refused (409 `webhook_replayed`).

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gnomon_core::spec::{validate_name, MAX_NAMESPACE_LEN, MAX_NAME_LEN};
use gnomon_core::triggers::{MAX_PAYLOAD_BYTES, MAX_TOLERANCE_SECONDS};
use http_body_util::BodyExt;

use super::error::ApiError;
use super::extract::MAX_BODY_BYTES;
use super::state::ApiState;
use super::trigger::{ask_leader, idempotency_key};
use crate::leader::{Origin, TriggerRequest};
use crate::signing::{check_timestamp, verify, Refusal, Signed, SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// How long a caller has to send its body once the cheap checks are done
/// and the server reads it: a caller not yet proven holds its connection
/// no longer than this (and the time those checks take).
pub const BODY_DEADLINE: Duration = Duration::from_secs(1);

/// The budget for unproven bodies when a request comes with none (a router
/// served without the listener, as in tests).
fn fallback_budget() -> crate::listener::UnprovenBodies {
    static BUDGET: std::sync::OnceLock<crate::listener::UnprovenBodies> = std::sync::OnceLock::new();
    BUDGET.get_or_init(|| crate::listener::UnprovenBodies::new(crate::listener::DEFAULT_UNPROVEN_BODY_MEMORY)).clone()
}

/// The idempotency key of a call sent without one: its signature. It starts
/// with a space, which an `Idempotency-Key` header may not, so no caller's
/// key can name the run of another call.
fn delivery_key(signature: &[u8; 32]) -> String {
    format!(" call {}", hex::encode(signature))
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    Some(headers.get(name)?.to_str().unwrap_or("").to_string())
}

/// The one answer to a call whose proof does not hold, whatever the reason.
fn unauthorized() -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "the webhook call is not authorized")
}

fn slow() -> ApiError {
    ApiError::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", format!("the body did not arrive within {} s", BODY_DEADLINE.as_secs()))
}

fn busy() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "webhooks_busy",
        "the server is reading as many webhook bodies as it has room for; try again shortly",
    )
}

fn too_large() -> ApiError {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", format!("a webhook payload is at most {MAX_PAYLOAD_BYTES} bytes"))
}

/// Why a call was refused: for the server's log only.
enum Refused {
    /// The caller's proof: answered [`unauthorized`] after the drain.
    Proof(String),
    /// Anything else, answered as it says.
    Answer(ApiError),
}

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Self {
        Refused::Answer(e)
    }
}

fn proof(why: impl Into<String>) -> Refused {
    Refused::Proof(why.into())
}

impl From<Refusal> for Refused {
    fn from(r: Refusal) -> Self {
        Refused::Proof(r.to_string())
    }
}

#[utoipa::path(post, path = "/v1/hooks/{namespace}/{job}", tag = "hooks", summary = "Start a run from a signed webhook call",
    description = "For a job with `triggers.webhook`. No credential: the call carries `Gnomon-Timestamp` (Unix milliseconds, \
        within the job's tolerance of the server's clock, default 300 s) and `Gnomon-Signature: v2=<hex HMAC-SHA256>` of \
        `v2\\n{namespace}\\n{job}\\n{timestamp}\\n{key}\\n{body}` under one of the job's secrets (`key`: the `Idempotency-Key`, \
        empty without one). The body (UTF-8, at most 64 KiB, sent whole within 1 s) is the run's payload; the job's \
        `triggers.webhook.params` take params from it. With an `Idempotency-Key`, a repeat answers 200 with the run the key \
        names; without one, a replay of the same call is refused with 409. Every refusal of the call's proof (no such job, \
        no webhook, a bad or stale signature) is the same 401.",
    security(()),
    params(("namespace" = gnomon_core::schema::Namespace, Path, description = "The job's namespace"),
        ("job" = gnomon_core::schema::Name, Path, description = "The job's name"),
        ("Gnomon-Timestamp" = String, Header, pattern = "^[1-9][0-9]{0,15}$", description = "Unix milliseconds"),
        ("Gnomon-Signature" = String, Header, pattern = "^v2=[0-9a-f]{64}$", description = "v2=<64 hex digits>"),
        ("Idempotency-Key" = Option<String>, Header, nullable = false, min_length = 1, max_length = 255, pattern = "^[!-~](?:[ -~]*[!-~])?$", description = "1 to 255 visible ASCII characters (spaces inside) naming the run; part of the signed string")),
    request_body(content = String, description = "The payload: any UTF-8 text, usually JSON"),
    responses((status = 201, body = gnomon_api::HookRun, description = "the run the call started"),
        (status = 200, body = gnomon_api::HookRun, description = "the run the idempotency key already named; nothing was created"),
        (status = 401, body = gnomon_api::ErrorBody, description = "the call's proof does not hold (whatever the reason)"),
        (status = 409, body = gnomon_api::ErrorBody, description = "a replay of a call already accepted, or a key reused with another payload"),
        (status = 429, body = gnomon_api::ErrorBody, description = "over a quota of the namespace: nothing was written; `Retry-After` says when to ask again", headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
        (status = 413, body = gnomon_api::ErrorBody, description = "the payload is larger than 64 KiB"),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 408, body = gnomon_api::ErrorBody, description = "`body_timeout`: the body did not arrive whole within 1 s (an HTTP/1 connection is then closed)"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 502, body = gnomon_api::ErrorBody, description = "the leader could not be reached"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable, or `webhooks_busy`: the server holds as many webhook bodies not yet checked as its memory for them allows (`--webhook-body-memory`); nothing was read, `Retry-After` says when to ask again", headers(("Retry-After" = u64, description = "seconds to wait before asking again"))),
        (status = 403, body = gnomon_api::ErrorBody, description = "the Host or Origin is refused (a defence against DNS rebinding and cross-site requests)")))]

pub(crate) async fn hook(State(state): State<ApiState>, Path((ns, name)): Path<(String, String)>, req: Request) -> Response {
    let peer = crate::listener::ClientAddr::shown(req.extensions().get());
    let (namespace, job) = (super::audit::shown(&ns), super::audit::shown(&name));
    let (parts, body) = req.into_parts();
    let (answer, why) = match answer(&state, &ns, &name, &parts, body).await {
        Ok(r) => (r, None),
        Err(Refused::Answer(e)) => {
            let why = e.message.clone();
            let unread = matches!(e.code, "body_timeout" | "webhooks_busy");
            let mut answer = e.into_response();
            if unread {
                // The rest of the body is not read: an HTTP/1 connection
                // cannot carry another request (HTTP/2 resets the stream).
                if parts.version <= axum::http::Version::HTTP_11 {
                    answer.headers_mut().insert(header::CONNECTION, axum::http::HeaderValue::from_static("close"));
                }
                if answer.status() == StatusCode::SERVICE_UNAVAILABLE {
                    answer.headers_mut().insert(header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
                }
            }
            (answer, Some(why))
        }
        Err(Refused::Proof(why)) => (unauthorized().into_response(), Some(why)),
    };
    let status = answer.status().as_u16();
    match why {
        None => tracing::info!(target: "gnomon::audit", credential = "-", %peer, method = "POST", %namespace, %job, status, "webhook call"),
        Some(why) => tracing::warn!(target: "gnomon::audit", credential = "-", %peer, method = "POST", %namespace, %job, status,
            why = %super::audit::shown(&why), "webhook call refused"),
    }
    answer
}

/// The body, read to its end but never past `keep` bytes (what the call
/// took of the budget, at most [`MAX_PAYLOAD_BYTES`]) nor past
/// [`BODY_DEADLINE`]: `Ok(None)` when it is larger (the rest is then read
/// and dropped up to the API's bound, so the caller gets the answer rather
/// than a reset connection).
async fn bounded(body: Body, keep: usize) -> Result<Option<Vec<u8>>, ApiError> {
    let read = async {
        let mut body = body;
        let mut out = Vec::new();
        let mut seen = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| ApiError::bad("invalid_body", "the body could not be read"))?;
            if let Ok(data) = frame.into_data() {
                seen += data.len();
                if seen > MAX_BODY_BYTES {
                    break;
                }
                if seen <= keep {
                    out.extend_from_slice(&data);
                }
            }
        }
        Ok((seen <= keep).then_some(out))
    };
    tokio::time::timeout(BODY_DEADLINE, read).await.map_err(|_| slow())?
}

async fn answer(state: &ApiState, ns: &str, name: &str, parts: &axum::http::request::Parts, body: Body) -> Result<Response, Refused> {
    // A declared length past the API's bound is refused before anything
    // is read, for every path alike.
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large().into());
    }
    // What may be kept of the body comes out of the one budget for unproven
    // bodies before anything is read, for every path alike; it is given
    // back once the signature holds (or the call is answered).
    let keep = declared.map_or(MAX_PAYLOAD_BYTES, |n| (n as usize).min(MAX_PAYLOAD_BYTES));
    let budget = parts.extensions.get::<crate::listener::UnprovenBodies>().cloned().unwrap_or_else(fallback_budget);
    let Some(held) = budget.take(keep) else { return Err(busy().into()) };
    let checked = before_body(state, ns, name, &parts.headers).await;
    let body = bounded(body, keep).await?.ok_or_else(too_large)?;
    let (hook, secrets, key) = checked?;
    let key_text = key.clone().unwrap_or_default();
    let signed = Signed { namespace: ns, job: name, key: &key_text, body: &body };
    let now = state.node.clock.now_millis();
    let (timestamp, signature) = (header(&parts.headers, TIMESTAMP_HEADER), header(&parts.headers, SIGNATURE_HEADER));
    let verified = verify(&secrets, timestamp.as_deref(), signature.as_deref(), &signed, now, hook.tolerance_millis())?;
    // Proven: the body is the caller's, no longer the budget's.
    drop(held);
    if state.node.leader_commands().is_none() {
        // Only the leader creates runs: a follower hands on a call that
        // holds (the leader checks it again).
        return Ok(super::forward::with_body(state, parts, body).await?);
    }
    let payload = String::from_utf8(body).map_err(|_| ApiError::bad("invalid_payload", "a webhook payload must be UTF-8 text"))?;
    let params = hook.params_from(&payload);
    let replay_guard = key.is_none();
    let key = key.unwrap_or_else(|| delivery_key(&verified.signature));
    let payload = (!payload.is_empty()).then_some(payload);
    let request = TriggerRequest { count: 1, key: Some(key), params, payload, origin: Origin::Webhook, ..Default::default() };
    let triggered = match ask_leader(state, ns.to_string(), name.to_string(), request).await {
        Ok(t) => t,
        // The job stopped taking calls, or was deleted, since it was read.
        Err(e) if e.code == "no_webhook" || e.status == StatusCode::NOT_FOUND => return Err(proof(e.message)),
        Err(e) => return Err(e.into()),
    };
    let id = triggered
        .ids
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "no run was created"))?;
    if triggered.existed && replay_guard {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "webhook_replayed",
            format!("this call (the same timestamp, body and signature) was accepted before and started run {id}"),
        )
        .into());
    }
    let run = state
        .node
        .store
        .get_run(&id)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "triggered run vanished"))?;
    let status = if triggered.existed { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(gnomon_api::HookRun { id, state: run.run.state })).into_response())
}

/// What is checked before the body is read: the path, the key's form, the
/// timestamp, the job and its webhook, and the secrets this server holds
/// for it. Returns the job's webhook, those secrets and the key.
async fn before_body(
    state: &ApiState,
    ns: &str,
    name: &str,
    headers: &HeaderMap,
) -> Result<(gnomon_core::triggers::WebhookTrigger, Vec<String>, Option<String>), Refused> {
    if validate_name("namespace", ns, MAX_NAMESPACE_LEN).is_err() || validate_name("job", name, MAX_NAME_LEN).is_err() {
        return Err(proof("no such job"));
    }
    let key = idempotency_key(headers)?;
    let now = state.node.clock.now_millis();
    let widest = i64::from(MAX_TOLERANCE_SECONDS) * 1000;
    check_timestamp(header(headers, TIMESTAMP_HEADER).as_deref(), now, widest)?;
    let job = match state.node.store.get_job(ns, name).await {
        Ok(Some(job)) => job,
        Ok(None) | Err(gnomon_backend::StoreError::NotFound(_)) => return Err(proof("no such job")),
        Err(e) => return Err(ApiError::from(e).into()),
    };
    let Some(hook) = job.spec.triggers.webhook.clone() else { return Err(proof("the job takes no webhook calls")) };
    check_timestamp(header(headers, TIMESTAMP_HEADER).as_deref(), now, hook.tolerance_millis())?;
    let envs = hook.secret_envs(ns);
    let secrets: Vec<String> = envs.iter().filter_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty())).collect();
    if secrets.is_empty() {
        tracing::error!(namespace = %super::audit::shown(ns), job = %super::audit::shown(name), variables = ?envs,
            "a webhook call came for a job none of whose secrets this server holds");
        return Err(proof("this server holds none of the job's secrets"));
    }
    Ok((hook, secrets, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_idempotency_key_can_name_a_calls_run() {
        let key = delivery_key(&[7; 32]);
        assert!(key.starts_with(' '), "an Idempotency-Key header may not start with a space");
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(super::super::trigger::IDEMPOTENCY_KEY, key.parse().unwrap());
        assert!(idempotency_key(&headers).is_err());
    }

    #[tokio::test]
    async fn a_body_is_read_within_its_bound() {
        let exact = vec![b'x'; MAX_PAYLOAD_BYTES];
        assert_eq!(bounded(Body::from(exact.clone()), MAX_PAYLOAD_BYTES).await.unwrap(), Some(exact));
        assert_eq!(bounded(Body::from(vec![b'x'; MAX_PAYLOAD_BYTES + 1]), MAX_PAYLOAD_BYTES).await.unwrap(), None);
        assert_eq!(bounded(Body::from(vec![b'x'; 11]), 10).await.unwrap(), None, "never more than was taken");
    }
}
