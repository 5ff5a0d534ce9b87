//! Run parameters: what a job declares (`params`, with defaults), what a
//! trigger may set, and the values a run records and runs with.
//!
//! A run's values are resolved once, when the run is created, from the
//! job's declaration and what its trigger set; the run keeps them, so a
//! later change of the job's defaults never changes what a run ran with.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::SpecError;

/// The most parameters a job may declare.
pub const MAX_PARAMS: usize = 64;
/// The longest parameter name, in characters.
pub const MAX_PARAM_NAME: usize = 64;
/// The longest parameter description, in characters.
pub const MAX_PARAM_DESCRIPTION: usize = 1024;
/// The largest set of a run's values, in bytes of its JSON.
pub const MAX_PARAMS_BYTES: usize = 64 * 1024;

/// A parameter a job declares.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    /// The value a run gets when its trigger sets none: any JSON value.
    /// Absent: the parameter is required, and every trigger must set it
    /// (a job with a schedule must give every parameter a default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::ParamValue>))]
    pub default: Option<serde_json::Value>,
    /// Free text for people, at most 1024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub description: Option<String>,
}

/// The values of a run's parameters, by name.
pub type Params = BTreeMap<String, serde_json::Value>;

/// Checks a job's declared parameters (`params`): 1 to 64 names of
/// letters, digits and `_`, starting with a letter or `_`, apart from
/// each other also in upper case (they become `GNOMON_PARAM_<NAME>`);
/// with a schedule, every one has a default.
pub fn validate_declared(declared: &BTreeMap<String, ParamSpec>, scheduled: bool) -> Result<(), SpecError> {
    if declared.len() > MAX_PARAMS {
        return Err(SpecError::new("invalid_params", "params", format!("at most {MAX_PARAMS} parameters")));
    }
    let mut upper: BTreeMap<String, &str> = BTreeMap::new();
    for (name, spec) in declared {
        let field = format!("params.{name}");
        validate_param_name(&field, name)?;
        if let Some(other) = upper.insert(name.to_ascii_uppercase(), name) {
            return Err(SpecError::new(
                "invalid_params",
                field,
                format!("differs from {other:?} only in case; both would be GNOMON_PARAM_{}", name.to_ascii_uppercase()),
            ));
        }
        if spec.description.as_ref().is_some_and(|d| d.chars().count() > MAX_PARAM_DESCRIPTION) {
            return Err(SpecError::new(
                "invalid_params",
                format!("{field}.description"),
                format!("longer than {MAX_PARAM_DESCRIPTION} characters"),
            ));
        }
        if scheduled && spec.default.is_none() {
            return Err(SpecError::new(
                "missing_default",
                format!("{field}.default"),
                "a job with a schedule or upstreams starts runs that no trigger sets: give it a default",
            ));
        }
    }
    let defaults: Params = declared.iter().filter_map(|(k, s)| Some((k.clone(), s.default.clone()?))).collect();
    check_size("params", &defaults)
}

fn validate_param_name(field: &str, name: &str) -> Result<(), SpecError> {
    let ok_start = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
    if name.is_empty() || name.len() > MAX_PARAM_NAME || !ok_start || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(SpecError::new(
            "invalid_param_name",
            field,
            format!("a parameter name is 1 to {MAX_PARAM_NAME} letters, digits or '_', starting with a letter or '_'"),
        ));
    }
    Ok(())
}

fn check_size(field: &str, values: &Params) -> Result<(), SpecError> {
    // A shell job gets each value in its environment, which cannot hold NUL.
    if let Some((name, _)) = values.iter().find(|(_, v)| env_value(v).contains('\0')) {
        return Err(SpecError::new("invalid_param_value", format!("{field}.{name}"), "a value must not contain NUL"));
    }
    let bytes = serde_json::to_vec(values).map_or(usize::MAX, |v| v.len());
    if bytes > MAX_PARAMS_BYTES {
        return Err(SpecError::new("invalid_params", field, format!("{bytes} bytes of JSON; at most {MAX_PARAMS_BYTES}")));
    }
    Ok(())
}

/// A run's values: the declared defaults, overridden by what its trigger
/// set (`given`, checked against the declaration: an unknown or a missing
/// required name is refused with its field, `params.<name>`). `None` for a
/// job that declares none and a trigger that sets none.
pub fn resolve(declared: &BTreeMap<String, ParamSpec>, given: &Params) -> Result<Option<Params>, SpecError> {
    for name in given.keys() {
        if !declared.contains_key(name) {
            let known: Vec<&str> = declared.keys().map(String::as_str).collect();
            let hint =
                if known.is_empty() { "the job declares no params".to_string() } else { format!("it declares {}", known.join(", ")) };
            return Err(SpecError::new("unknown_param", format!("params.{name}"), format!("the job has no parameter {name:?}; {hint}")));
        }
    }
    if declared.is_empty() {
        return Ok(None);
    }
    let mut values = Params::new();
    for (name, spec) in declared {
        match given.get(name).or(spec.default.as_ref()) {
            Some(v) => {
                values.insert(name.clone(), v.clone());
            }
            None => return Err(SpecError::new("missing_param", format!("params.{name}"), format!("{name:?} has no default: set it"))),
        }
    }
    check_size("params", &values)?;
    Ok(Some(values))
}

/// The values of a dependency run: with no params declared, those of the
/// upstream run that made it, as they are; else the job's own, each taken
/// from the upstream run where it has a value of that name, else its
/// default. `None` when neither has any.
pub fn inherit(declared: &BTreeMap<String, ParamSpec>, upstream: Option<&Params>) -> Option<Params> {
    if declared.is_empty() {
        return upstream.cloned();
    }
    let given: Params = upstream
        .map(|u| u.iter().filter(|(k, _)| declared.contains_key(*k)).map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    resolve(declared, &given).ok().flatten().or_else(|| defaults(declared))
}

/// The defaults of a job whose every parameter has one (a scheduled
/// fire's values); `None` when it declares none.
pub fn defaults(declared: &BTreeMap<String, ParamSpec>) -> Option<Params> {
    resolve(declared, &Params::new()).ok().flatten()
}

/// A value as an environment variable holds it: a string as it is, any
/// other value as its JSON.
pub fn env_value(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The environment variable of the parameter `name`.
pub fn env_name(name: &str) -> String {
    format!("GNOMON_PARAM_{}", name.to_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn declared(v: serde_json::Value) -> BTreeMap<String, ParamSpec> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_dependency_run_inherits_or_takes_its_own() {
        let up: Params = [("day".to_string(), serde_json::json!("2026-12-01")), ("n".to_string(), serde_json::json!(3))].into();
        assert_eq!(inherit(&BTreeMap::new(), Some(&up)), Some(up.clone()), "no declaration: the upstream's values");
        assert_eq!(inherit(&BTreeMap::new(), None), None);
        let declared: BTreeMap<String, ParamSpec> =
            serde_json::from_str(r#"{"day": {"default": "today"}, "mode": {"default": "full"}}"#).unwrap();
        let got = inherit(&declared, Some(&up)).unwrap();
        assert_eq!(got.get("day"), Some(&serde_json::json!("2026-12-01")), "a declared name takes the upstream's value");
        assert_eq!(got.get("mode"), Some(&serde_json::json!("full")), "else its default");
        assert!(!got.contains_key("n"), "an undeclared name is not taken");
        assert_eq!(inherit(&declared, None).unwrap().get("day"), Some(&serde_json::json!("today")));
    }

    #[test]
    fn defaults_are_overridden_by_what_a_trigger_sets() {
        let d = declared(json!({"region": {"default": "eu"}, "limit": {"default": 100}, "date": {}}));
        let given: Params = serde_json::from_value(json!({"date": "2026-12-01", "limit": 5})).unwrap();
        let v = resolve(&d, &given).unwrap().unwrap();
        assert_eq!(serde_json::to_value(&v).unwrap(), json!({"date": "2026-12-01", "limit": 5, "region": "eu"}));
        assert_eq!(env_value(&v["limit"]), "5");
        assert_eq!(env_value(&v["region"]), "eu");
        assert_eq!(env_name("region"), "GNOMON_PARAM_REGION");
    }

    #[test]
    fn unknown_and_missing_names_are_refused_with_their_field() {
        let d = declared(json!({"date": {}}));
        let e = resolve(&d, &serde_json::from_value(json!({"dat": 1})).unwrap()).unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("unknown_param", "params.dat"));
        let e = resolve(&d, &Params::new()).unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("missing_param", "params.date"));
        let e = resolve(&BTreeMap::new(), &serde_json::from_value(json!({"x": 1})).unwrap()).unwrap_err();
        assert_eq!(e.code, "unknown_param");
        assert_eq!(resolve(&BTreeMap::new(), &Params::new()).unwrap(), None);
    }

    #[test]
    fn declarations_are_checked() {
        assert!(validate_declared(&declared(json!({"a": {"default": 1}, "_b2": {}})), false).is_ok());
        for (bad, code) in [
            (json!({"1a": {}}), "invalid_param_name"),
            (json!({"a-b": {}}), "invalid_param_name"),
            (json!({"": {}}), "invalid_param_name"),
            (json!({"Region": {}, "region": {}}), "invalid_params"),
        ] {
            assert_eq!(validate_declared(&declared(bad.clone()), false).unwrap_err().code, code, "{bad}");
        }
        let e = validate_declared(&declared(json!({"date": {}})), true).unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("missing_default", "params.date.default"));
        let nul = declared(json!({"a": {"default": "x\u{0}y"}}));
        assert_eq!(validate_declared(&nul, false).unwrap_err().code, "invalid_param_value");
        let big = declared(json!({"a": {"default": "x".repeat(MAX_PARAMS_BYTES)}}));
        assert_eq!(validate_declared(&big, false).unwrap_err().code, "invalid_params");
    }
}
