//! The leader's notification deliverer: every second it reads the due
//! notifications from the store's outbox, posts each to its target and
//! records the delivery, fenced. A delivery that fails is tried again with
//! backoff until its target's `max_attempts`; a client error other than
//! 408 or 429 ends it at once.
//!
//! Under normal operation a notification is posted once. A leader that
//! posts one and loses its term (or the store) before recording it leaves
//! it pending, and the next leader posts it again: receivers deduplicate by
//! the `Gnomon-Notification-Id` header (the body's `id`).

use std::sync::Arc;
use std::time::Duration;

use gnomon_backend::{Delivery, Fence, Notification, NotificationState, RunDetail, RunFilter, Store, StoreError};
use gnomon_core::notify::{retry_delay, secret_env, secret_envs, status_is_final, NotifyOn, NotifyTarget, SECRET_ENV_PREFIX};
use gnomon_core::{Clock, Millis, RunState};
use serde_json::json;
use tokio::task::JoinSet;

/// How often the outbox is read.
pub const NOTIFY_EVERY: Duration = Duration::from_secs(1);
/// Due notifications read at once.
const BATCH: u32 = 200;
/// Deliveries in flight at once.
const PARALLEL: usize = 16;
/// The output tail a notification carries.
const OUTPUT_TAIL: usize = 1024;

/// What an attempt to deliver came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    Delivered,
    /// Not to be sent, and rightly so (a success that was no recovery).
    NotDue(String),
    /// Failed; `final` when trying again cannot help.
    Failed {
        error: String,
        r#final: bool,
    },
}

/// Looks up a signing secret: `(namespace, name)` → the secret.
pub type Secrets = Arc<dyn Fn(&str, &str) -> Option<String> + Send + Sync>;

/// The `GNOMON_NOTIFY_SECRET_*` variables, read once at start.
static CAPTURED: std::sync::OnceLock<std::collections::HashMap<String, String>> = std::sync::OnceLock::new();

/// Reads every `GNOMON_NOTIFY_SECRET_*` variable of the process environment
/// into a table this module owns, once (later calls change nothing), so the
/// variables can then be removed from the environment. Returns their names.
/// Call at start, while the process is single-threaded.
pub fn capture_env_secrets() -> Vec<String> {
    let table = CAPTURED.get_or_init(|| {
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, v)| k.starts_with(SECRET_ENV_PREFIX) && !v.is_empty())
            .collect()
    });
    let mut names: Vec<String> = table.keys().cloned().collect();
    names.sort();
    names
}

/// The signing secrets captured at start (see [`capture_env_secrets`]): a
/// job's secret `NAME` resolves in its own namespace only
/// (`GNOMON_NOTIFY_SECRET_<namespace>__<NAME>`, and in `default` also the
/// unscoped `GNOMON_NOTIFY_SECRET_<NAME>`).
pub fn env_secrets() -> Secrets {
    capture_env_secrets();
    let table = CAPTURED.get().cloned().unwrap_or_default();
    secrets_from(table)
}

/// [`Secrets`] over a table of variables.
pub fn secrets_from(table: std::collections::HashMap<String, String>) -> Secrets {
    Arc::new(move |namespace, name| secret_envs(namespace, name).iter().find_map(|var| table.get(var).cloned()))
}

/// Delivers due notifications while the term lasts (returns when fenced).
pub async fn notify_loop(store: Arc<dyn Store>, fence: Fence, clock: Arc<dyn Clock>, secrets: Secrets) {
    let client = gnomon_egress::Egress::with_defaults().client();
    let mut tick = tokio::time::interval(NOTIFY_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match deliver_due(&store, &fence, &clock, &client, &secrets).await {
            Ok(_) => {}
            Err(StoreError::Fenced { .. }) => return,
            Err(e) => tracing::warn!(error = %e, "notification round failed; next round"),
        }
    }
}

/// One round: every due notification (up to a batch) delivered and
/// recorded. Returns how many were recorded.
pub async fn deliver_due(
    store: &Arc<dyn Store>,
    fence: &Fence,
    clock: &Arc<dyn Clock>,
    client: &reqwest::Client,
    secrets: &Secrets,
) -> Result<usize, StoreError> {
    let due = store.due_notifications(clock.now_millis(), BATCH).await?;
    metrics::gauge!("gnomon_notifications_due").set(due.len() as f64);
    let mut recorded = 0;
    let mut queue = due.into_iter();
    let mut running = JoinSet::new();
    loop {
        while running.len() < PARALLEL {
            let Some(n) = queue.next() else { break };
            let (store, fence, clock, client, secrets) = (store.clone(), fence.clone(), clock.clone(), client.clone(), secrets.clone());
            running.spawn(async move { deliver_one(&store, &fence, &clock, &client, &secrets, n).await });
        }
        let Some(done) = running.join_next().await else { break };
        match done {
            Ok(Ok(true)) => recorded += 1,
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                running.abort_all();
                return Err(e);
            }
            Err(e) => tracing::warn!(error = %e, "a notification delivery task failed"),
        }
    }
    Ok(recorded)
}

async fn deliver_one(
    store: &Arc<dyn Store>,
    fence: &Fence,
    clock: &Arc<dyn Clock>,
    client: &reqwest::Client,
    secrets: &Secrets,
    n: Notification,
) -> Result<bool, StoreError> {
    let target: Option<NotifyTarget> = serde_json::from_str(&n.target).ok();
    let sent = match &target {
        None => Sent::Failed { error: "the stored target cannot be read".into(), r#final: true },
        Some(target) => match store.get_run(&n.run_id).await? {
            None => Sent::NotDue("the run no longer exists".into()),
            Some(run) => match recovery_check(store.as_ref(), &n, &run).await? {
                Some(reason) => Sent::NotDue(reason),
                None => post(client, secrets, target, &n, &run, clock.now_millis()).await,
            },
        },
    };
    let max_attempts = target.as_ref().map_or(1, |t| t.settings().max_attempts);
    let kind = target.as_ref().map_or("unknown", |t| t.kind());
    let at = clock.now_millis();
    let attempts = n.attempts + 1;
    let (state, next_at, error, result) = match sent {
        Sent::Delivered => (NotificationState::Sent, at, None, "sent"),
        Sent::NotDue(why) => (NotificationState::Skipped, at, Some(why), "skipped"),
        Sent::Failed { error, r#final } => match retry_delay(attempts, max_attempts).filter(|_| !r#final) {
            Some(d) => (NotificationState::Pending, at + d.as_millis() as Millis, Some(error), "retry"),
            None => (NotificationState::Failed, at, Some(error), "failed"),
        },
    };
    metrics::counter!("gnomon_notifications_total", "kind" => kind, "result" => result).increment(1);
    match result {
        "failed" => tracing::warn!(notification = %n.id, error = ?error, "notification given up"),
        "retry" => tracing::info!(notification = %n.id, attempts, error = ?error, "notification delivery failed; will retry"),
        _ => tracing::debug!(notification = %n.id, result, "notification delivered"),
    }
    let d = Delivery { id: n.id.clone(), attempts_before: n.attempts, state, attempts, next_at, error, at };
    store.settle_notification(fence, &d).await
}

/// For `recovered`: `None` if the job's previous finished run failed (send
/// it), else why not.
async fn recovery_check(store: &dyn Store, n: &Notification, run: &RunDetail) -> Result<Option<String>, StoreError> {
    if n.outcome != NotifyOn::Recovered.as_str() {
        return Ok(None);
    }
    let filter = RunFilter { namespace: Some(run.run.namespace.clone()), job: Some(run.run.job.clone()), state: None };
    let mut cursor = Some(run.run.seq);
    for _ in 0..5 {
        let page = store.list_runs(&filter, 100, cursor).await?;
        for r in &page.runs {
            match r.state {
                RunState::Failed => return Ok(None),
                RunState::Succeeded => return Ok(Some("the previous run succeeded: not a recovery".into())),
                _ => {}
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    Ok(Some("no earlier failed run: not a recovery".into()))
}

/// The JSON a webhook receives.
pub fn payload(n: &Notification, run: &RunDetail, now: Millis) -> serde_json::Value {
    let last = run.attempts.iter().max_by_key(|a| a.attempt);
    json!({
        "id": n.id,
        "event": n.outcome,
        "at": now,
        "job": { "namespace": n.namespace, "name": n.job },
        "run": {
            "id": run.run.id,
            "state": run.run.state.as_str(),
            "scheduled_at": run.run.scheduled_at,
            "fired_at": run.run.fired_at,
            "attempts": run.run.attempt,
            "manual": run.run.manual,
            "reason": run.run.reason,
        },
        "attempt": last.map(|a| json!({
            "attempt": a.attempt,
            "worker": a.worker,
            "state": a.state.as_str(),
            "exit_code": a.exit_code,
            "started_at": a.started_at,
            "ended_at": a.ended_at,
            "output_tail": tail(&a.output, OUTPUT_TAIL),
        })),
    })
}

/// The text a Slack channel receives.
pub fn slack_text(n: &Notification, run: &RunDetail) -> String {
    let icon = match n.outcome.as_str() {
        "failed" => ":x:",
        "succeeded" => ":white_check_mark:",
        "recovered" => ":large_green_circle:",
        _ => ":hourglass:",
    };
    let what = match n.outcome.as_str() {
        "late" => "started late".to_string(),
        o => o.to_string(),
    };
    let mut text = format!("{icon} gnomon: job *{}/{}* run `{}` {what}", n.namespace, n.job, run.run.id);
    if let Some(a) = run.attempts.iter().max_by_key(|a| a.attempt) {
        text.push_str(&format!(" (attempt {}", a.attempt));
        if let Some(c) = a.exit_code {
            text.push_str(&format!(", exit code {c}"));
        }
        text.push(')');
    }
    if let Some(r) = &run.run.reason {
        text.push_str(&format!(": {r}"));
    }
    text
}

fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

pub use crate::signing::signature;

async fn post(client: &reqwest::Client, secrets: &Secrets, target: &NotifyTarget, n: &Notification, run: &RunDetail, now: Millis) -> Sent {
    let settings = target.settings();
    let (body, mut headers) = match (&target.webhook, &target.slack) {
        (Some(w), _) => {
            let body = payload(n, run, now).to_string().into_bytes();
            let mut h: Vec<(String, String)> = w.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            if let Some(name) = &w.secret {
                let Some(secret) = secrets(&n.namespace, name) else {
                    return Sent::Failed {
                        error: format!(
                            "the signing secret {} is not set on the leader (a job signs only with a secret of its own namespace)",
                            secret_env(&n.namespace, name)
                        ),
                        r#final: false,
                    };
                };
                let signed = crate::signing::Signed { namespace: &n.namespace, job: &n.job, key: "", body: &body };
                h.push(("Gnomon-Signature".into(), signature(&secret, now, &signed)));
            }
            (body, h)
        }
        (None, Some(_)) => (json!({ "text": slack_text(n, run) }).to_string().into_bytes(), Vec::new()),
        (None, None) => return Sent::Failed { error: "the target has neither webhook nor slack".into(), r#final: true },
    };
    headers.push(("Gnomon-Notification-Id".into(), n.id.clone()));
    headers.push(("Gnomon-Event".into(), n.outcome.clone()));
    headers.push(("Gnomon-Timestamp".into(), now.to_string()));
    let mut req = client.post(target.url()).timeout(settings.timeout).header("Content-Type", "application/json").body(body);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    match req.send().await {
        Ok(resp) if resp.status().is_success() => Sent::Delivered,
        Ok(resp) => {
            let status = resp.status().as_u16();
            Sent::Failed { error: format!("the receiver answered {status}"), r#final: status_is_final(status) }
        }
        Err(e) => Sent::Failed { error: format!("cannot deliver: {}", error_chain(&e)), r#final: false },
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_resolves_in_its_job_namespace_only() {
        let table =
            [("GNOMON_NOTIFY_SECRET_OPS", "legacy"), ("GNOMON_NOTIFY_SECRET_A__OPS", "team-a"), ("GNOMON_NOTIFY_SECRET_default__KEY", "d")];
        let s = secrets_from(table.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        assert_eq!(s("A", "ops").as_deref(), Some("team-a"));
        assert_eq!(s("default", "ops").as_deref(), Some("legacy"), "the unscoped variable serves the default namespace");
        assert_eq!(s("default", "key").as_deref(), Some("d"));
        assert_eq!(s("b", "ops"), None, "not another namespace's, nor the unscoped one");
        assert_eq!(s("b", "A__OPS"), None);
        assert_eq!(s("a", "ops"), None, "namespaces are exact");
    }

    #[test]
    fn the_output_tail_is_cut_on_a_character() {
        assert_eq!(tail("abc", 10), "abc");
        assert_eq!(tail("aé", 1), "");
        assert_eq!(tail("aéz", 2), "z");
    }
}
