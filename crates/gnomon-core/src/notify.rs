//! Notifications: who a job tells about its runs' outcomes, and the pure
//! parts of telling them (which outcomes a transition raises, when to retry).
//! The leader writes a notification in the same store write as the outcome
//! it tells of; delivery is elsewhere.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::{format_duration, parse_duration};
use crate::SpecError;

/// Most notification targets on one job.
pub const MAX_TARGETS: usize = 8;
/// The longest target URL, in bytes.
pub const MAX_URL_LEN: usize = 2048;
/// The most extra headers a webhook target may set.
pub const MAX_HEADERS: usize = 16;
/// The longest signing secret name.
pub const MAX_SECRET_NAME: usize = 64;
/// The headers a webhook target may not set, gnomon does (in any case)…
pub const RESERVED_HEADERS: [&str; 4] = ["content-type", "content-length", "host", "transfer-encoding"];
/// …nor any starting with this.
pub const RESERVED_HEADER_PREFIX: &str = "gnomon-";
/// The longest header name a webhook target may set, in bytes.
pub const MAX_HEADER_NAME: usize = 128;
/// The longest header value a webhook target may set, in bytes.
pub const MAX_HEADER_VALUE: usize = 1024;
/// How late a run may start before a `late` notification, by default.
pub const DEFAULT_LATE_AFTER: Duration = Duration::from_secs(60);
/// A delivery's own timeout, by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest delivery timeout a target may set (longer ones are refused
/// at write, and clamped to this when read).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// Deliveries tried before giving up, by default.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// The most deliveries a target may ask for (`max_attempts` is 1 to this).
pub const MAX_ATTEMPTS: u32 = 50;
/// The first retry's delay; each one after doubles, up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(2);
/// The longest delay between two deliveries of one notification.
pub const MAX_BACKOFF: Duration = Duration::from_secs(600);

/// An outcome a target may be told of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum NotifyOn {
    /// The run ended failed (its last attempt failed, timed out or was lost).
    Failed,
    /// The run ended succeeded.
    Succeeded,
    /// The run's first attempt was handed to a worker more than
    /// `late_after` after its scheduled time.
    Late,
    /// The run succeeded and the job's previous finished run had failed.
    Recovered,
}

impl NotifyOn {
    /// The outcome's name as job JSON and the API write it: `failed`,
    /// `succeeded`, `late` or `recovered`.
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyOn::Failed => "failed",
            NotifyOn::Succeeded => "succeeded",
            NotifyOn::Late => "late",
            NotifyOn::Recovered => "recovered",
        }
    }

    /// The outcome named `s` (as [`as_str`](Self::as_str) writes it);
    /// `None` for any other text.
    pub fn parse(s: &str) -> Option<NotifyOn> {
        [NotifyOn::Failed, NotifyOn::Succeeded, NotifyOn::Late, NotifyOn::Recovered].into_iter().find(|o| o.as_str() == s)
    }
}

/// One target of a job's notifications: where (exactly one of `webhook`
/// and `slack`), on which outcomes, and how hard to try.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NotifyTarget {
    /// The outcomes this target is told of: at least one, each at most
    /// once (stored sorted).
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 4))]
    pub on: Vec<NotifyOn>,
    /// Post a JSON notification to a webhook; give this or `slack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookSpec>,
    /// Post a one-line message to a Slack-compatible incoming webhook;
    /// give this or `webhook`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slack: Option<SlackSpec>,
    /// For `late` (only with `late` in `on`): how long after its scheduled
    /// time a run may start, 1s to 7 days (default 1m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::LateAfter>))]
    pub late_after: Option<String>,
    /// One delivery's timeout, 100ms to 60s (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::DeliveryTimeout>))]
    pub timeout: Option<String>,
    /// Deliveries tried before giving up (default 10; retries back off
    /// from 2s, doubling, up to 10m apart); 1 to 50.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::int::option")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 50))]
    pub max_attempts: Option<u32>,
}

/// A generic webhook: a JSON `POST`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WebhookSpec {
    /// Where the notification is posted: an `http://` or `https://` URL
    /// with a host, at most 2048 bytes.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::NotifyUrl))]
    pub url: String,
    /// The name of a signing secret the servers hold for the job's own
    /// namespace (the environment variable
    /// `GNOMON_NOTIFY_SECRET_<namespace>__<NAME>`; in the `default`
    /// namespace also `GNOMON_NOTIFY_SECRET_<NAME>`); with it, each delivery
    /// carries `Gnomon-Signature: sha256=<HMAC of "<timestamp>.<body>">`.
    /// A job can never name another namespace's secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::SecretName>))]
    pub secret: Option<String>,
    /// Extra request headers, at most 16.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = BTreeMap<crate::schema::NotifyHeaderName, crate::schema::NotifyHeaderValue>)
    )]
    pub headers: BTreeMap<String, String>,
}

/// A Slack-compatible incoming webhook (a `{"text": …}` `POST`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SlackSpec {
    /// The incoming webhook's URL: `http://` or `https://` with a host, at
    /// most 2048 bytes.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::NotifyUrl))]
    pub url: String,
}

/// A target's validated settings.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledTarget {
    /// How long after its scheduled time a run's first attempt may be
    /// handed to a worker before `late` is raised, in milliseconds.
    pub late_after_ms: i64,
    /// One delivery's timeout (at most [`MAX_TIMEOUT`]).
    pub timeout: Duration,
    /// Deliveries tried before giving up (1 to [`MAX_ATTEMPTS`]).
    pub max_attempts: u32,
}

impl NotifyTarget {
    /// The settings a delivery uses, defaults filled in. A stored target
    /// was validated, so this only fails on one written by hand.
    pub fn settings(&self) -> CompiledTarget {
        let dur = |t: &Option<String>, d: Duration| t.as_deref().and_then(|t| parse_duration(t).ok()).unwrap_or(d);
        CompiledTarget {
            late_after_ms: i64::try_from(dur(&self.late_after, DEFAULT_LATE_AFTER).as_millis()).unwrap_or(i64::MAX),
            timeout: dur(&self.timeout, DEFAULT_TIMEOUT).min(MAX_TIMEOUT),
            max_attempts: self.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS).clamp(1, MAX_ATTEMPTS),
        }
    }

    /// Where it posts.
    pub fn url(&self) -> &str {
        match (&self.webhook, &self.slack) {
            (Some(w), _) => &w.url,
            (None, Some(s)) => &s.url,
            (None, None) => "",
        }
    }

    /// The target's kind: `slack` when it has `slack`, else `webhook`.
    pub fn kind(&self) -> &'static str {
        if self.slack.is_some() {
            "slack"
        } else {
            "webhook"
        }
    }
}

/// Validates a job's targets and normalises their durations.
pub fn compile_targets(targets: &mut [NotifyTarget]) -> Result<(), SpecError> {
    if targets.len() > MAX_TARGETS {
        return Err(SpecError::new("invalid_notify", "notify", format!("at most {MAX_TARGETS} targets")));
    }
    for (i, t) in targets.iter_mut().enumerate() {
        let f = |name: &str| format!("notify[{i}].{name}");
        if t.on.is_empty() {
            return Err(SpecError::new("invalid_notify", f("on"), "name at least one of failed, succeeded, late, recovered"));
        }
        t.on.sort();
        let n = t.on.len();
        t.on.dedup();
        if t.on.len() != n {
            return Err(SpecError::new("invalid_notify", f("on"), "an outcome is named twice"));
        }
        match (&t.webhook, &t.slack) {
            (Some(w), None) => {
                check_url(&f("webhook.url"), &w.url)?;
                if let Some(s) = &w.secret {
                    check_secret_name(&f("webhook.secret"), s)?;
                }
                if w.headers.len() > MAX_HEADERS {
                    return Err(SpecError::new("invalid_notify", f("webhook.headers"), format!("at most {MAX_HEADERS} headers")));
                }
                for (k, v) in &w.headers {
                    check_header(&f(&format!("webhook.headers.{k}")), k, v)?;
                }
            }
            (None, Some(s)) => check_url(&f("slack.url"), &s.url)?,
            _ => return Err(SpecError::new("invalid_notify", format!("notify[{i}]"), "give exactly one of webhook or slack")),
        }
        if let Some(l) = &t.late_after {
            if !t.on.contains(&NotifyOn::Late) {
                return Err(SpecError::new("invalid_notify", f("late_after"), "applies only to a target notified on late"));
            }
            let d = bounded(&f("late_after"), l, Duration::from_secs(1), Duration::from_secs(7 * 24 * 3600))?;
            t.late_after = Some(format_duration(d));
        }
        if let Some(l) = &t.timeout {
            let d = bounded(&f("timeout"), l, Duration::from_millis(100), MAX_TIMEOUT)?;
            t.timeout = Some(format_duration(d));
        }
        if let Some(m) = t.max_attempts {
            if m == 0 || m > MAX_ATTEMPTS {
                return Err(SpecError::new("invalid_notify", f("max_attempts"), format!("must be 1 to {MAX_ATTEMPTS}")));
            }
        }
    }
    Ok(())
}

fn bounded(field: &str, text: &str, min: Duration, max: Duration) -> Result<Duration, SpecError> {
    let d = parse_duration(text).map_err(|m| SpecError::new("invalid_duration", field, m))?;
    if d < min || d > max {
        return Err(SpecError::new("invalid_duration", field, format!("must be {} to {}", format_duration(min), format_duration(max))));
    }
    Ok(d)
}

fn check_url(field: &str, text: &str) -> Result<(), SpecError> {
    let u = url::Url::parse(text).map_err(|e| SpecError::new("invalid_notify", field, format!("not a URL: {e}")))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none_or(str::is_empty) {
        return Err(SpecError::new("invalid_notify", field, "must be an http:// or https:// URL with a host"));
    }
    if text.len() > MAX_URL_LEN {
        return Err(SpecError::new("invalid_notify", field, format!("longer than {MAX_URL_LEN} bytes")));
    }
    Ok(())
}

/// A secret's name: letters, digits and `_`, at most 64, neither starting
/// with `_` nor holding `__`. The name is looked up in the job's own
/// namespace only (see [`secret_envs`]); the `__` that separates a
/// namespace from a name in a variable can therefore never be part of a
/// name, so no job can spell its way into another namespace's secret.
pub fn check_secret_name(field: &str, name: &str) -> Result<(), SpecError> {
    if name.is_empty() || name.len() > MAX_SECRET_NAME || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(SpecError::new("invalid_notify", field, "a secret name is 1-64 letters, digits or '_'"));
    }
    if name.starts_with('_') || name.contains("__") {
        return Err(SpecError::new(
            "invalid_notify",
            field,
            "a secret name may not start with '_' or contain '__': it names a secret of the job's own namespace \
             (GNOMON_NOTIFY_SECRET_<namespace>__<NAME>), never another namespace's",
        ));
    }
    Ok(())
}

/// The prefix of every signing secret's environment variable.
pub const SECRET_ENV_PREFIX: &str = "GNOMON_NOTIFY_SECRET_";

/// The environment variable that holds the signing secret `name` of
/// `namespace`: `GNOMON_NOTIFY_SECRET_<namespace>__<NAME>`, the namespace
/// exactly as written, the name in capitals.
pub fn secret_env(namespace: &str, name: &str) -> String {
    format!("{SECRET_ENV_PREFIX}{namespace}__{}", name.to_ascii_uppercase())
}

/// The variables that may hold the secret `name` for a job of `namespace`,
/// first match wins: the namespace's own, then, in the `default` namespace
/// only, the unscoped `GNOMON_NOTIFY_SECRET_<NAME>`. A name that is not
/// valid (see [`check_secret_name`]) has none.
pub fn secret_envs(namespace: &str, name: &str) -> Vec<String> {
    if check_secret_name("", name).is_err() {
        return Vec::new();
    }
    let mut v = vec![secret_env(namespace, name)];
    if namespace == crate::spec::DEFAULT_NAMESPACE {
        v.push(format!("{SECRET_ENV_PREFIX}{}", name.to_ascii_uppercase()));
    }
    v
}

fn check_header(field: &str, name: &str, value: &str) -> Result<(), SpecError> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || name.len() > MAX_HEADER_NAME || !name.chars().all(token) {
        return Err(SpecError::new("invalid_notify", field, "not a valid header name"));
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with(RESERVED_HEADER_PREFIX) || RESERVED_HEADERS.contains(&lower.as_str()) {
        return Err(SpecError::new("invalid_notify", field, "this header is set by gnomon"));
    }
    if value.len() > MAX_HEADER_VALUE || value.chars().any(|c| c.is_control()) {
        return Err(SpecError::new("invalid_notify", field, "a header value is at most 1024 bytes, without control characters"));
    }
    Ok(())
}

/// A notification's id: one per run, outcome and target, so writing it
/// twice is writing it once.
pub fn notification_id(run_id: &str, on: NotifyOn, target: usize) -> String {
    format!("{run_id}/{}/{target}", on.as_str())
}

/// When to try again after `attempts` failed deliveries (`None`: give up).
pub fn retry_delay(attempts: u32, max_attempts: u32) -> Option<Duration> {
    if attempts >= max_attempts {
        return None;
    }
    let shift = attempts.saturating_sub(1).min(20);
    Some(FIRST_BACKOFF.saturating_mul(1 << shift).min(MAX_BACKOFF))
}

/// Whether an HTTP answer means "do not try again" (a client error other
/// than a timeout or a rate limit).
pub fn status_is_final(status: u16) -> bool {
    (400..500).contains(&status) && status != 408 && status != 429
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(json: &str) -> Result<Vec<NotifyTarget>, SpecError> {
        let mut t: Vec<NotifyTarget> = serde_json::from_str(json).map_err(|e| SpecError::new("invalid_json", "notify", e.to_string()))?;
        compile_targets(&mut t)?;
        Ok(t)
    }

    #[test]
    fn a_valid_target_is_normalised() {
        let t =
            target(r#"[{"on":["recovered","failed"],"webhook":{"url":"https://h.example/x","secret":"ops"},"timeout":"5000ms"}]"#).unwrap();
        assert_eq!(t[0].on, vec![NotifyOn::Failed, NotifyOn::Recovered]);
        assert_eq!(t[0].timeout.as_deref(), Some("5s"));
        let s = t[0].settings();
        assert_eq!((s.timeout, s.max_attempts, s.late_after_ms), (Duration::from_secs(5), 10, 60_000));
    }

    #[test]
    fn bad_targets_name_their_field() {
        let cases = [
            (r#"[{"on":[],"slack":{"url":"https://h/x"}}]"#, "notify[0].on"),
            (r#"[{"on":["failed","failed"],"slack":{"url":"https://h/x"}}]"#, "notify[0].on"),
            (r#"[{"on":["failed"]}]"#, "notify[0]"),
            (r#"[{"on":["failed"],"slack":{"url":"https://h/x"},"webhook":{"url":"https://h/x"}}]"#, "notify[0]"),
            (r#"[{"on":["failed"],"slack":{"url":"ftp://h/x"}}]"#, "notify[0].slack.url"),
            (r#"[{"on":["failed"],"webhook":{"url":"not a url"}}]"#, "notify[0].webhook.url"),
            (r#"[{"on":["failed"],"webhook":{"url":"http://h/","secret":"a-b"}}]"#, "notify[0].webhook.secret"),
            (
                r#"[{"on":["failed"],"webhook":{"url":"http://h/","headers":{"Gnomon-Event":"x"}}}]"#,
                "notify[0].webhook.headers.Gnomon-Event",
            ),
            (r#"[{"on":["failed"],"slack":{"url":"https://h/x"},"late_after":"1m"}]"#, "notify[0].late_after"),
            (r#"[{"on":["late"],"slack":{"url":"https://h/x"},"late_after":"0s"}]"#, "notify[0].late_after"),
            (r#"[{"on":["late"],"slack":{"url":"https://h/x"},"timeout":"2m"}]"#, "notify[0].timeout"),
            (r#"[{"on":["late"],"slack":{"url":"https://h/x"},"max_attempts":0}]"#, "notify[0].max_attempts"),
        ];
        for (json, field) in cases {
            let e = target(json).unwrap_err();
            assert_eq!(e.field, field, "{json}: {e:?}");
        }
        let many = format!("[{}]", [r#"{"on":["failed"],"slack":{"url":"https://h/x"}}"#; 9].join(","));
        assert_eq!(target(&many).unwrap_err().field, "notify");
    }

    #[test]
    fn retries_back_off_and_end() {
        assert_eq!(retry_delay(1, 10), Some(Duration::from_secs(2)));
        assert_eq!(retry_delay(2, 10), Some(Duration::from_secs(4)));
        assert_eq!(retry_delay(9, 10), Some(Duration::from_secs(512)));
        assert_eq!(retry_delay(10, 10), None);
        assert_eq!(retry_delay(30, 50), Some(MAX_BACKOFF));
        assert!(status_is_final(404) && !status_is_final(429) && !status_is_final(503) && !status_is_final(408));
    }

    #[test]
    fn ids_are_one_per_run_outcome_and_target() {
        assert_eq!(notification_id("j1-5", NotifyOn::Failed, 2), "j1-5/failed/2");
        assert_eq!(NotifyOn::parse("late"), Some(NotifyOn::Late));
        assert_eq!(secret_env("payments", "ops_1"), "GNOMON_NOTIFY_SECRET_payments__OPS_1");
    }

    #[test]
    fn secrets_are_scoped_to_the_job_namespace() {
        assert_eq!(secret_envs("default", "ops"), vec!["GNOMON_NOTIFY_SECRET_default__OPS", "GNOMON_NOTIFY_SECRET_OPS"]);
        assert_eq!(secret_envs("team-b", "ops"), vec!["GNOMON_NOTIFY_SECRET_team-b__OPS"]);
        // No name reaches another namespace's variable: "__" and a leading
        // '_' are refused, so the split of a variable is unique.
        for bad in ["a__ops", "_ops", "x___y", "__"] {
            assert!(secret_envs("b", bad).is_empty(), "{bad}");
            assert!(check_secret_name("f", bad).is_err(), "{bad}");
        }
        assert_ne!(secret_env("a", "b_ops"), secret_env("a_b", "ops"));
        assert_ne!(secret_env("a_", "c"), secret_env("a", "c_"));
        let t = r#"[{"on":["failed"],"webhook":{"url":"http://h/","secret":"A__OPS"}}]"#;
        assert_eq!(target(t).unwrap_err().field, "notify[0].webhook.secret");
    }
}
