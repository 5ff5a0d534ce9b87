//! What may start a job's runs besides its schedule and a manual trigger:
//! `triggers.webhook`, a signed HTTP call (`POST /v1/hooks/{namespace}/{job}`)
//! whose body becomes the run's payload.
//!
//! Everything about a webhook that the job declares is checked here, when
//! the job is parsed; the signature itself is checked by the server that
//! receives the call, against the secret its environment holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::params::{ParamSpec, Params};
use crate::SpecError;

/// The prefix every webhook secret's environment variable has, so a job
/// can name no other variable of the servers' environment.
pub const HOOK_SECRET_PREFIX: &str = "GNOMON_HOOK_SECRET_";
/// How far a call's timestamp may be from the server's clock, by default.
pub const DEFAULT_TOLERANCE_SECONDS: u32 = 300;
/// The widest tolerance a job may set.
pub const MAX_TOLERANCE_SECONDS: u32 = 3600;
/// The largest payload, in bytes.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

/// The ways a job's runs may be started from outside.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TriggersSpec {
    /// Runs started by a signed `POST /v1/hooks/{namespace}/{job}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookTrigger>,
}

impl TriggersSpec {
    /// Whether the job declares no trigger (then the field is left out).
    pub fn is_empty(&self) -> bool {
        self.webhook.is_none()
    }
}

/// A webhook trigger: who may call it (whoever holds the secret), how
/// fresh a call must be, and which params its payload sets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WebhookTrigger {
    /// The environment variable, on every server, that holds the signing
    /// secret: `GNOMON_HOOK_SECRET_` followed by capitals, digits or `_`.
    /// A call carries `Gnomon-Timestamp: <Unix milliseconds>` and
    /// `Gnomon-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::HookSecretEnv))]
    pub secret_env: String,
    /// How far, in seconds, a call's timestamp may be from the server's
    /// clock (1 to 3600, default 300). A call is accepted once: a replay of
    /// it inside this window is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::int::option")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 3600))]
    pub tolerance_seconds: Option<u32>,
    /// Params the payload sets, by name: a JSON pointer (RFC 6901, e.g.
    /// `/ref` or `/repository/name`) into a JSON payload. A pointer that
    /// finds nothing leaves the param at its default.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<crate::schema::ParamName, crate::schema::JsonPointer>))]
    pub params: BTreeMap<String, String>,
}

impl WebhookTrigger {
    /// The tolerance in milliseconds.
    pub fn tolerance_millis(&self) -> i64 {
        i64::from(self.tolerance_seconds.unwrap_or(DEFAULT_TOLERANCE_SECONDS)) * 1000
    }

    /// The values the payload sets of the job's params: each mapped
    /// pointer that finds a value in a JSON payload. A payload that is not
    /// JSON sets none.
    pub fn params_from(&self, payload: &str) -> Params {
        if self.params.is_empty() {
            return Params::new();
        }
        let Ok(doc) = serde_json::from_str::<serde_json::Value>(payload) else { return Params::new() };
        self.params.iter().filter_map(|(name, pointer)| Some((name.clone(), doc.pointer(pointer)?.clone()))).collect()
    }
}

/// Checks `triggers` against the job's declared params.
pub fn validate(triggers: &TriggersSpec, declared: &BTreeMap<String, ParamSpec>) -> Result<(), SpecError> {
    let Some(hook) = &triggers.webhook else { return Ok(()) };
    let env = &hook.secret_env;
    let tail = env.strip_prefix(HOOK_SECRET_PREFIX).unwrap_or("");
    if tail.is_empty() || env.len() > 128 || !tail.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') {
        return Err(SpecError::new(
            "invalid_trigger",
            "triggers.webhook.secret_env",
            format!("the name of an environment variable {HOOK_SECRET_PREFIX}<NAME>, NAME of capitals, digits or '_' (at most 128 bytes in all)"),
        ));
    }
    if let Some(t) = hook.tolerance_seconds {
        if !(1..=MAX_TOLERANCE_SECONDS).contains(&t) {
            return Err(SpecError::new(
                "invalid_trigger",
                "triggers.webhook.tolerance_seconds",
                format!("between 1 and {MAX_TOLERANCE_SECONDS}"),
            ));
        }
    }
    for (name, pointer) in &hook.params {
        let field = format!("triggers.webhook.params.{name}");
        if !declared.contains_key(name) {
            return Err(SpecError::new("unknown_param", field, format!("the job declares no param {name:?}")));
        }
        if (!pointer.is_empty() && !pointer.starts_with('/')) || pointer.len() > 1024 {
            return Err(SpecError::new(
                "invalid_trigger",
                field,
                "a JSON pointer (RFC 6901): empty for the whole payload, or '/'-separated names such as /repository/name, at most 1024 bytes",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(env: &str) -> TriggersSpec {
        TriggersSpec { webhook: Some(WebhookTrigger { secret_env: env.into(), ..Default::default() }) }
    }

    fn declared(names: &[&str]) -> BTreeMap<String, ParamSpec> {
        names.iter().map(|n| (n.to_string(), ParamSpec::default())).collect()
    }

    #[test]
    fn a_secret_is_a_hook_secret_variable_and_nothing_else() {
        assert!(validate(&hook("GNOMON_HOOK_SECRET_DEPLOY"), &declared(&[])).is_ok());
        assert!(validate(&hook("GNOMON_HOOK_SECRET_A_2"), &declared(&[])).is_ok());
        for bad in ["", "PATH", "GNOMON_HOOK_SECRET_", "GNOMON_HOOK_SECRET_lower", "GNOMON_HOOK_SECRET_A-B", "GNOMON_NOTIFY_SECRET_X"] {
            let e = validate(&hook(bad), &declared(&[])).unwrap_err();
            assert_eq!(e.field, "triggers.webhook.secret_env", "{bad}");
            assert_eq!(e.code, "invalid_trigger");
        }
        let long = format!("{HOOK_SECRET_PREFIX}{}", "A".repeat(120));
        assert!(validate(&hook(&long), &declared(&[])).is_err());
    }

    #[test]
    fn the_tolerance_is_bounded() {
        let mut t = hook("GNOMON_HOOK_SECRET_X");
        for (secs, ok) in [(1, true), (3600, true), (0, false), (3601, false)] {
            t.webhook.as_mut().unwrap().tolerance_seconds = Some(secs);
            assert_eq!(validate(&t, &declared(&[])).is_ok(), ok, "{secs}");
        }
        t.webhook.as_mut().unwrap().tolerance_seconds = None;
        assert_eq!(t.webhook.unwrap().tolerance_millis(), 300_000);
    }

    #[test]
    fn mapped_params_are_declared_and_pointers() {
        let mut t = hook("GNOMON_HOOK_SECRET_X");
        t.webhook.as_mut().unwrap().params.insert("branch".into(), "/ref".into());
        assert!(validate(&t, &declared(&["branch"])).is_ok());
        let e = validate(&t, &declared(&["other"])).unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("unknown_param", "triggers.webhook.params.branch"));
        t.webhook.as_mut().unwrap().params.insert("branch".into(), "ref".into());
        assert_eq!(validate(&t, &declared(&["branch"])).unwrap_err().code, "invalid_trigger");
    }

    #[test]
    fn a_payload_sets_what_its_pointers_find() {
        let mut w = WebhookTrigger { secret_env: "GNOMON_HOOK_SECRET_X".into(), ..Default::default() };
        w.params.insert("branch".into(), "/ref".into());
        w.params.insert("repo".into(), "/repository/name".into());
        w.params.insert("missing".into(), "/nope".into());
        let got = w.params_from(r#"{"ref":"main","repository":{"name":"gnomon","id":7}}"#);
        assert_eq!(got.len(), 2);
        assert_eq!(got["branch"], serde_json::json!("main"));
        assert_eq!(got["repo"], serde_json::json!("gnomon"));
        assert!(w.params_from("not json").is_empty());
        w.params.insert("all".into(), "".into());
        assert_eq!(w.params_from("[1]")["all"], serde_json::json!([1]));
    }
}
