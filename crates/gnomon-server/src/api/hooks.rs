//! `POST /v1/hooks/{namespace}/{job}`: a webhook call that starts a run of
//! a job that takes them (`triggers.webhook`).
//!
//! The call carries no credential: it is authenticated by its signature
//! under the job's secret ([`crate::signing`]), over its timestamp and
//! body, and its timestamp must be within the job's tolerance of this
//! server's clock. Its body becomes the run's payload.
//!
//! A call creates at most one run, whichever server answers it and however
//! often it is sent. With an `Idempotency-Key` the run's id comes from the
//! key, as on a manual trigger: a repeat answers 200 with that run. Without
//! one, the run's id comes from the call's signature, so a replay of the
//! same call (same timestamp, same body) finds the run the first one made
//! and is refused (409 `webhook_replayed`); the store holds that record, so
//! a replay is refused on every server and after a leader change, for as
//! long as retention keeps the run (a call older than the tolerance is
//! refused anyway).

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use gnomon_core::triggers::MAX_PAYLOAD_BYTES;

use super::error::{ApiError, ApiResult};
use super::extract::read_body;
use super::state::ApiState;
use super::trigger::{ask_leader, idempotency_key, one_run};
use crate::leader::{Origin, TriggerRequest};
use crate::signing::{verify, Refusal, SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// The idempotency key of a call sent without one: its signature. It starts
/// with a space, which an `Idempotency-Key` header may not, so no caller's
/// key can name the run of another call.
fn delivery_key(signature: &[u8; 32]) -> String {
    format!(" webhook sha256={}", hex::encode(signature))
}

fn header(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    Some(headers.get(name)?.to_str().unwrap_or("").to_string())
}

fn no_webhook(ns: &str, name: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no_webhook", format!("no job {ns}/{name} takes webhook calls"))
}

fn unauthorized(r: Refusal) -> ApiError {
    let code = match r {
        Refusal::NoTimestamp | Refusal::BadTimestamp | Refusal::Stale { .. } => "invalid_timestamp",
        Refusal::NoSignature | Refusal::BadSignatureFormat | Refusal::Mismatch => "invalid_signature",
    };
    ApiError::new(StatusCode::UNAUTHORIZED, code, r.to_string())
}

#[utoipa::path(post, path = "/v1/hooks/{namespace}/{job}", tag = "hooks", summary = "Start a run from a signed webhook call",
    description = "For a job with `triggers.webhook`. No credential: the call carries `Gnomon-Timestamp` (Unix milliseconds, \
        within the job's tolerance of the server's clock, default 300 s) and `Gnomon-Signature: sha256=<hex HMAC-SHA256 of \
        \"<timestamp>.<body>\">` under the secret in the job's `secret_env`. The body (UTF-8, at most 64 KiB) is the run's payload; \
        the job's `triggers.webhook.params` take params from it. With an `Idempotency-Key`, a repeat answers 200 with the run the \
        key names; without one, a replay of the same call is refused with 409.",
    security(()),
    params(("namespace" = gnomon_core::schema::Namespace, Path, description = "The job's namespace"),
        ("job" = gnomon_core::schema::Name, Path, description = "The job's name"),
        ("Gnomon-Timestamp" = String, Header, pattern = "^[0-9]{1,15}$", description = "Unix milliseconds"),
        ("Gnomon-Signature" = String, Header, pattern = "^sha256=[0-9a-f]{64}$", description = "sha256=<64 hex digits>"),
        ("Idempotency-Key" = Option<String>, Header, nullable = false, min_length = 1, max_length = 255, pattern = "^[!-~](?:[ -~]*[!-~])?$", description = "1 to 255 visible ASCII characters (spaces inside) naming the run")),
    request_body(content = String, description = "The payload: any UTF-8 text, usually JSON"),
    responses((status = 201, body = gnomon_api::Run, description = "the run the call started"),
        (status = 200, body = gnomon_api::Run, description = "the run the idempotency key already named; nothing was created"),
        (status = 401, body = gnomon_api::ErrorBody, description = "the timestamp or the signature does not hold"),
        (status = 404, body = gnomon_api::ErrorBody, description = "no such job, or it takes no webhook calls"),
        (status = 409, body = gnomon_api::ErrorBody, description = "a replay of a call already accepted, or a key reused with another payload"),
        (status = 413, body = gnomon_api::ErrorBody, description = "the payload is larger than 64 KiB"),
        (status = 400, body = gnomon_api::ErrorBody, description = "malformed: a path, query, header or body value breaks its rule"),
        (status = 500, body = gnomon_api::ErrorBody, description = "a bug in the server"),
        (status = 502, body = gnomon_api::ErrorBody, description = "the leader could not be reached"),
        (status = 503, body = gnomon_api::ErrorBody, description = "the store or the leader is unavailable"),
        (status = 403, body = gnomon_api::ErrorBody, description = "the Host or Origin is refused (a defence against DNS rebinding and cross-site requests)")))]

pub(crate) async fn hook(State(state): State<ApiState>, Path((ns, name)): Path<(String, String)>, req: Request) -> ApiResult<Response> {
    let peer = crate::listener::ClientAddr::shown(req.extensions().get());
    let path = format!("/v1/hooks/{ns}/{name}");
    let answer = answer(state, ns, name, req).await;
    let status = match &answer {
        Ok(r) => r.status(),
        Err(e) => e.status,
    };
    if status.is_success() {
        tracing::info!(target: "gnomon::audit", credential = "-", %peer, method = "POST", %path, status = status.as_u16(), "webhook call");
    } else {
        tracing::warn!(target: "gnomon::audit", credential = "-", %peer, method = "POST", %path, status = status.as_u16(), "webhook call refused");
    }
    answer
}

async fn answer(state: ApiState, ns: String, name: String, req: Request) -> ApiResult<Response> {
    if state.node.leader_commands().is_none() {
        // Only the leader creates runs: a follower hands the call on, as it
        // came (the leader checks its signature again).
        return super::forward::to_leader(&state, req).await;
    }
    let key = idempotency_key(req.headers())?;
    let (timestamp, signature) = (header(req.headers(), TIMESTAMP_HEADER), header(req.headers(), SIGNATURE_HEADER));
    let body = read_body(req.into_body()).await?;
    // An unknown job and one that takes no calls look the same to a caller.
    let job = match state.node.store.get_job(&ns, &name).await {
        Ok(Some(job)) => job,
        Ok(None) | Err(gnomon_backend::StoreError::NotFound(_)) => return Err(no_webhook(&ns, &name)),
        Err(e) => return Err(e.into()),
    };
    let Some(hook) = job.spec.triggers.webhook.clone() else { return Err(no_webhook(&ns, &name)) };
    let secret = std::env::var(&hook.secret_env).ok().filter(|s| !s.is_empty()).ok_or_else(|| {
        tracing::error!(job = %format!("{ns}/{name}"), variable = %hook.secret_env, "a webhook call came for a job whose secret this server does not hold");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "webhook_secret_missing",
            format!("this server does not hold the job's secret (the environment variable {} is not set)", hook.secret_env),
        )
    })?;
    let now = state.node.clock.now_millis();
    let verified =
        verify(&secret, timestamp.as_deref(), signature.as_deref(), &body, now, hook.tolerance_millis()).map_err(unauthorized)?;
    if body.len() > MAX_PAYLOAD_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("a webhook payload is at most {MAX_PAYLOAD_BYTES} bytes; this one has {}", body.len()),
        ));
    }
    let payload = String::from_utf8(body).map_err(|_| ApiError::bad("invalid_payload", "a webhook payload must be UTF-8 text"))?;
    let params = hook.params_from(&payload);
    // Checked here for a clear answer; the leader checks again against the
    // job as it is when it creates the run.
    gnomon_core::params::resolve(&job.spec.params, &params)?;
    let replay_guard = key.is_none();
    let key = key.unwrap_or_else(|| delivery_key(&verified.signature));
    let payload = (!payload.is_empty()).then_some(payload);
    let request = TriggerRequest { count: 1, key: Some(key), params, payload, origin: Origin::Webhook };
    let triggered = ask_leader(&state, ns, name, request).await?;
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
        ));
    }
    one_run(&state, if triggered.existed { StatusCode::OK } else { StatusCode::CREATED }, &id).await
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
}
