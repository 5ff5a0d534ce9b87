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

/// A webhook trigger: who may call it (whoever holds one of its secrets),
/// how fresh a call must be, and which params its payload sets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WebhookTrigger {
    /// The name of the signing secret, held by every server for the job's
    /// own namespace: the environment variable
    /// `GNOMON_HOOK_SECRET_<namespace>__<NAME>` (in the `default` namespace
    /// also `GNOMON_HOOK_SECRET_<NAME>`). 1-64 letters, digits or `_`, not
    /// starting with `_`, no `__`. A call carries `Gnomon-Timestamp: <Unix
    /// milliseconds>` and `Gnomon-Signature: v2=<hex HMAC-SHA256>` of
    /// `v2\n{namespace}\n{job}\n{timestamp}\n{key}\n{body}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::SecretName))]
    pub secret: Option<String>,
    /// A second secret's name, accepted as well: a secret is rotated
    /// without downtime by naming the new one here, moving the senders to
    /// it, then making it `secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::SecretName))]
    pub secondary_secret: Option<String>,
    /// The older way to name the secret: the environment variable itself.
    /// Only a variable of the job's own namespace is accepted
    /// (`GNOMON_HOOK_SECRET_<namespace>__<NAME>`, or in the `default`
    /// namespace `GNOMON_HOOK_SECRET_<NAME>`); use `secret` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub secret_env: Option<String>,
    /// How far, in seconds, a call's timestamp may be from the server's
    /// clock (1 to 3600, default 300). A call is accepted once: a replay of
    /// it is refused for at least its timestamp plus 3600 seconds.
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

/// The environment variable that holds the webhook secret `name` of
/// `namespace`: `GNOMON_HOOK_SECRET_<namespace>__<NAME>`, the namespace as
/// written, the name in capitals.
pub fn hook_secret_env(namespace: &str, name: &str) -> String {
    format!("{HOOK_SECRET_PREFIX}{namespace}__{}", name.to_ascii_uppercase())
}

/// Whether the variable `env` holds a secret of `namespace`: its own
/// scoped variables, and in the `default` namespace the unscoped ones
/// (`GNOMON_HOOK_SECRET_<NAME>`, NAME without `__`).
pub fn env_in_scope(namespace: &str, env: &str) -> bool {
    let Some(tail) = env.strip_prefix(HOOK_SECRET_PREFIX) else { return false };
    if let Some(name) = tail.strip_prefix(namespace).and_then(|t| t.strip_prefix("__")) {
        return crate::notify::check_secret_name("", name).is_ok() && name == name.to_ascii_uppercase();
    }
    namespace == crate::spec::DEFAULT_NAMESPACE && crate::notify::check_secret_name("", tail).is_ok() && tail == tail.to_ascii_uppercase()
}

impl WebhookTrigger {
    /// The variables, in order, that may hold this job's secrets for a job
    /// of `namespace`: never one of another namespace.
    pub fn secret_envs(&self, namespace: &str) -> Vec<String> {
        let mut v = Vec::new();
        for name in [&self.secret, &self.secondary_secret].into_iter().flatten() {
            for env in crate::notify::secret_envs(namespace, name) {
                v.push(env.replacen(crate::notify::SECRET_ENV_PREFIX, HOOK_SECRET_PREFIX, 1));
            }
        }
        if let Some(env) = self.secret_env.as_ref().filter(|e| env_in_scope(namespace, e)) {
            v.push(env.clone());
        }
        v
    }

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

/// Checks `triggers` against the job's namespace and declared params.
pub fn validate(triggers: &TriggersSpec, namespace: &str, declared: &BTreeMap<String, ParamSpec>) -> Result<(), SpecError> {
    let Some(hook) = &triggers.webhook else { return Ok(()) };
    for (field, name) in [("triggers.webhook.secret", &hook.secret), ("triggers.webhook.secondary_secret", &hook.secondary_secret)] {
        if let Some(name) = name {
            crate::notify::check_secret_name(field, name).map_err(|e| SpecError::new("invalid_trigger", field, e.message))?;
        }
    }
    match (&hook.secret, &hook.secret_env) {
        (Some(_), Some(_)) => {
            return Err(SpecError::new("invalid_trigger", "triggers.webhook.secret_env", "give secret or secret_env, not both"));
        }
        (None, None) => {
            return Err(SpecError::new(
                "invalid_trigger",
                "triggers.webhook.secret",
                format!("name the signing secret (the server reads {})", hook_secret_env(namespace, "NAME")),
            ));
        }
        (None, Some(env)) if env.len() > 128 || !env_in_scope(namespace, env) => {
            return Err(SpecError::new(
                "invalid_trigger",
                "triggers.webhook.secret_env",
                format!(
                    "a variable of this namespace's webhook secrets, {} (NAME of capitals, digits or '_'); better, name the secret with `secret`",
                    hook_secret_env(namespace, "NAME")
                ),
            ));
        }
        _ => {}
    }
    let upper = |n: &Option<String>| n.as_ref().map(|n| n.to_ascii_uppercase());
    if hook.secondary_secret.is_some() && upper(&hook.secondary_secret) == upper(&hook.secret) {
        return Err(SpecError::new("invalid_trigger", "triggers.webhook.secondary_secret", "must name another secret than secret"));
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
        TriggersSpec { webhook: Some(WebhookTrigger { secret_env: Some(env.into()), ..Default::default() }) }
    }

    fn named(secret: &str) -> TriggersSpec {
        TriggersSpec { webhook: Some(WebhookTrigger { secret: Some(secret.into()), ..Default::default() }) }
    }

    fn validate(t: &TriggersSpec, declared: &BTreeMap<String, ParamSpec>) -> Result<(), SpecError> {
        super::validate(t, "default", declared)
    }

    fn declared(names: &[&str]) -> BTreeMap<String, ParamSpec> {
        names.iter().map(|n| (n.to_string(), ParamSpec::default())).collect()
    }

    #[test]
    fn a_secret_is_a_hook_secret_variable_and_nothing_else() {
        assert!(validate(&hook("GNOMON_HOOK_SECRET_DEPLOY"), &declared(&[])).is_ok());
        assert!(validate(&hook("GNOMON_HOOK_SECRET_A_2"), &declared(&[])).is_ok());
        for bad in [
            "",
            "PATH",
            "GNOMON_HOOK_SECRET_",
            "GNOMON_HOOK_SECRET_lower",
            "GNOMON_HOOK_SECRET_A-B",
            "GNOMON_NOTIFY_SECRET_X",
            "GNOMON_HOOK_SECRET_A__B",
        ] {
            let e = validate(&hook(bad), &declared(&[])).unwrap_err();
            assert_eq!(e.field, "triggers.webhook.secret_env", "{bad}");
            assert_eq!(e.code, "invalid_trigger");
        }
        let long = format!("{HOOK_SECRET_PREFIX}{}", "A".repeat(120));
        assert!(validate(&hook(&long), &declared(&[])).is_err());
    }

    #[test]
    fn secrets_are_scoped_to_the_job_namespace() {
        let mut t = named("deploy");
        t.webhook.as_mut().unwrap().secondary_secret = Some("deploy_next".into());
        assert!(super::validate(&t, "team-a", &declared(&[])).is_ok());
        let w = t.webhook.as_ref().unwrap();
        assert_eq!(w.secret_envs("team-a"), vec!["GNOMON_HOOK_SECRET_team-a__DEPLOY", "GNOMON_HOOK_SECRET_team-a__DEPLOY_NEXT"]);
        assert_eq!(
            w.secret_envs("default"),
            vec![
                "GNOMON_HOOK_SECRET_default__DEPLOY",
                "GNOMON_HOOK_SECRET_DEPLOY",
                "GNOMON_HOOK_SECRET_default__DEPLOY_NEXT",
                "GNOMON_HOOK_SECRET_DEPLOY_NEXT"
            ]
        );
        // A name can never reach into another namespace.
        for bad in ["team_b__deploy", "_x", "a-b", "", &"x".repeat(65)] {
            let e = super::validate(&named(bad), "team-a", &declared(&[])).unwrap_err();
            assert_eq!((e.code, e.field.as_str()), ("invalid_trigger", "triggers.webhook.secret"), "{bad}");
        }
        // The older variable form: only this namespace's own variables.
        assert!(super::validate(&hook("GNOMON_HOOK_SECRET_team-a__DEPLOY"), "team-a", &declared(&[])).is_ok());
        for bad in ["GNOMON_HOOK_SECRET_DEPLOY", "GNOMON_HOOK_SECRET_team-b__DEPLOY", "GNOMON_HOOK_SECRET_team-a__A__B"] {
            assert!(super::validate(&hook(bad), "team-a", &declared(&[])).is_err(), "{bad}");
            let w = WebhookTrigger { secret_env: Some(bad.into()), ..Default::default() };
            assert!(w.secret_envs("team-a").is_empty(), "a stored job never reads {bad}");
        }
        assert!(validate(&hook("GNOMON_HOOK_SECRET_DEPLOY"), &declared(&[])).is_ok());
        // One secret, not both forms, nor none; the second differs.
        let mut both = named("a");
        both.webhook.as_mut().unwrap().secret_env = Some("GNOMON_HOOK_SECRET_A".into());
        assert!(validate(&both, &declared(&[])).is_err());
        assert!(validate(&TriggersSpec { webhook: Some(WebhookTrigger::default()) }, &declared(&[])).is_err());
        let mut same = named("a");
        same.webhook.as_mut().unwrap().secondary_secret = Some("a".into());
        assert!(validate(&same, &declared(&[])).is_err());
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
        let mut w = WebhookTrigger { secret: Some("x".into()), ..Default::default() };
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
