//! The `job create` flags for a job's place in a pipeline (`--after`), the
//! params it declares (`--param`) and its webhook trigger (`--webhook-*`),
//! and the job JSON they make. Each flag is checked when it is read, and
//! all of them together before any request is sent, with the rules the
//! server applies, so a mistake is told in the flags' own terms.

use std::collections::BTreeMap;

use anyhow::bail;
use clap::Args;
use gnomon_core::deps::{validate_edges, AfterEdge, On};
use gnomon_core::params::{validate_declared, ParamSpec};
use gnomon_core::spec::{validate_name, MAX_NAME_LEN};
use gnomon_core::triggers::MAX_TOLERANCE_SECONDS;
use serde_json::{json, Value};

/// The flags of `job create` that place the job in a pipeline, declare its
/// params and give it a webhook trigger.
#[derive(Args, Debug, Default)]
pub struct PipelineArgs {
    /// Run after another job of the namespace (repeatable): each run of JOB
    /// gives this job a run of the same instant, which starts once JOB's run
    /// has ended as ON accepts (`succeeded`, the default; `failed`; or
    /// `any`: succeeded, failed or cancelled), and is recorded skipped
    /// otherwise. E.g. `--after extract --after extract-check:failed`.
    #[arg(long = "after", value_name = "JOB[:ON]", value_parser = parse_after)]
    pub after: Vec<AfterEdge>,
    /// Declare a param (repeatable): NAME alone is required (every trigger
    /// sets it); NAME=DEFAULT gives it a default, read as JSON when it is
    /// JSON (5, true, {"a":1}), else as text. TYPE reads DEFAULT as
    /// `string`, `int`, `number`, `bool` or `json` (the job keeps only the
    /// value). A job with a schedule or --after needs a default for every
    /// param. E.g. `--param region=eu --param limit:int=100 --param day`.
    #[arg(long = "param", value_name = "NAME[:TYPE][=DEFAULT]", value_parser = parse_param_decl)]
    pub params: Vec<(String, ParamSpec)>,
    /// Start runs from signed webhook calls (`POST
    /// /v1/hooks/{namespace}/{job}`), signed with the secret of this NAME:
    /// the servers read it from `GNOMON_HOOK_SECRET_<namespace>__<NAME>`.
    #[arg(long, value_name = "NAME", value_parser = parse_secret_name)]
    pub webhook_secret: Option<String>,
    /// A second secret NAME that also signs calls (for rotating the
    /// secret without refusing calls meanwhile).
    #[arg(long, value_name = "NAME", requires = "webhook_secret", value_parser = parse_secret_name)]
    pub webhook_secondary_secret: Option<String>,
    /// How far, in seconds, a call's timestamp may be from the server's
    /// clock (1 to 3600; default 300).
    #[arg(long, value_name = "SECS", requires = "webhook_secret",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_TOLERANCE_SECONDS)))]
    pub webhook_tolerance: Option<u32>,
    /// Set a declared param from the call's JSON body (repeatable): the
    /// value the JSON pointer finds, e.g. `--webhook-param branch=/ref`
    /// (an empty pointer takes the whole body).
    #[arg(long = "webhook-param", value_name = "NAME=/json/pointer", requires = "webhook_secret", value_parser = parse_webhook_param)]
    pub webhook_params: Vec<(String, String)>,
}

impl PipelineArgs {
    /// Adds `after`, `params` and `triggers` to the job `spec` named `name`.
    /// `scheduled`: the job has a schedule of its own (then, as with
    /// `--after`, every param needs a default).
    pub fn apply(self, spec: &mut Value, name: &str, scheduled: bool) -> anyhow::Result<()> {
        if !self.after.is_empty() {
            if let Err(e) = validate_edges(name, &self.after) {
                bail!("--after: {}", e.message);
            }
            spec["after"] = serde_json::to_value(&self.after)?;
        }
        let mut params: BTreeMap<String, ParamSpec> = BTreeMap::new();
        for (pname, p) in self.params {
            if params.insert(pname.clone(), p).is_some() {
                bail!("--param {pname} is given twice");
            }
        }
        if let Err(e) = validate_declared(&params, scheduled || !self.after.is_empty()) {
            let why = if e.code == "missing_default" {
                format!(
                    "{} has no default, and a job with a schedule or --after starts runs no trigger sets: give it one (NAME=DEFAULT)",
                    param_of(&e.field)
                )
            } else {
                format!("{} ({})", e.message, e.field)
            };
            bail!("--param: {why}");
        }
        if !params.is_empty() {
            spec["params"] = serde_json::to_value(&params)?;
        }
        let Some(secret) = self.webhook_secret else { return Ok(()) };
        let mut hook = json!({ "secret": secret });
        if let Some(second) = self.webhook_secondary_secret {
            if second == secret {
                bail!("--webhook-secondary-secret names the same secret as --webhook-secret");
            }
            hook["secondary_secret"] = second.into();
        }
        if let Some(t) = self.webhook_tolerance {
            hook["tolerance_seconds"] = t.into();
        }
        if !self.webhook_params.is_empty() {
            let mut map = serde_json::Map::new();
            for (pname, pointer) in self.webhook_params {
                if !params.contains_key(&pname) {
                    bail!("--webhook-param {pname}: the job declares no param {pname:?} (declare it with --param {pname}=DEFAULT)");
                }
                if map.insert(pname.clone(), pointer.into()).is_some() {
                    bail!("--webhook-param {pname} is given twice");
                }
            }
            hook["params"] = map.into();
        }
        spec["triggers"] = json!({ "webhook": hook });
        Ok(())
    }
}

/// The param a field path such as `params.day.default` names.
fn param_of(field: &str) -> &str {
    field.strip_prefix("params.").map_or(field, |rest| rest.strip_suffix(".default").unwrap_or(rest))
}

/// `JOB[:ON]` of `--after`.
pub fn parse_after(arg: &str) -> Result<AfterEdge, String> {
    let (job, on) = match arg.split_once(':') {
        Some((job, on)) => (job, Some(on)),
        None => (arg, None),
    };
    if job.contains('/') {
        return Err(format!("{job:?} names another namespace: a job runs only after jobs of its own namespace"));
    }
    validate_name("JOB", job, MAX_NAME_LEN).map_err(|e| format!("the job name {job:?} {}", e.message))?;
    let on = match on {
        None => On::Succeeded,
        Some("succeeded") => On::Succeeded,
        Some("failed") => On::Failed,
        Some("any") => On::Any,
        Some(other) => {
            let hint = match other {
                "success" | "ok" | "succeed" | "done" => " (did you mean succeeded?)",
                "failure" | "fail" | "error" => " (did you mean failed?)",
                "always" | "all" | "complete" | "completed" => " (did you mean any?)",
                _ => "",
            };
            return Err(format!("ON is succeeded, failed or any, not {other:?}{hint}"));
        }
    };
    Ok(AfterEdge { job: job.to_string(), on })
}

/// `NAME[:TYPE][=DEFAULT]` of `job create --param`.
pub fn parse_param_decl(arg: &str) -> Result<(String, ParamSpec), String> {
    let (head, default) = match arg.split_once('=') {
        Some((h, d)) => (h, Some(d)),
        None => (arg, None),
    };
    let (name, kind) = match head.split_once(':') {
        Some((n, k)) => (n, Some(k)),
        None => (head, None),
    };
    // The server's rules for a name, checked on a declaration of its own.
    let one: BTreeMap<String, ParamSpec> = [(name.to_string(), ParamSpec::default())].into();
    if let Err(e) = validate_declared(&one, false) {
        return Err(format!("{name:?}: {}", e.message));
    }
    let value = match (kind, default) {
        (None, None) => None,
        (Some(k), None) => {
            return Err(format!(
                "{name}:{k} has no default: TYPE only says how to read DEFAULT (the job keeps no type); \
                 write {name}:{k}=DEFAULT, or {name} alone for a param every trigger must set"
            ))
        }
        (None, Some(d)) => Some(serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.to_string()))),
        (Some(k), Some(d)) => Some(typed(k, d).map_err(|why| format!("{name}'s default {d:?} {why}"))?),
    };
    Ok((name.to_string(), ParamSpec { default: value, description: None }))
}

/// `text` read as a value of the type `kind`.
fn typed(kind: &str, text: &str) -> Result<Value, String> {
    match kind {
        "string" | "str" | "text" => Ok(Value::String(text.to_string())),
        "int" | "integer" => text.trim().parse::<i64>().map(Value::from).map_err(|_| "is not an integer".to_string()),
        "number" | "float" => {
            let n: f64 = text.trim().parse().map_err(|_| "is not a number".to_string())?;
            serde_json::Number::from_f64(n).map(Value::Number).ok_or_else(|| "is not a finite number".to_string())
        }
        "bool" | "boolean" => match text.trim() {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            _ => Err("is not true or false".to_string()),
        },
        "json" => serde_json::from_str(text).map_err(|e| format!("is not JSON: {e}")),
        other => Err(format!("cannot be read as {other:?}: TYPE is string, int, number, bool or json")),
    }
}

/// A secret's NAME: letters, digits and `_`, at most 128 bytes.
pub fn parse_secret_name(arg: &str) -> Result<String, String> {
    if arg.starts_with(gnomon_core::triggers::HOOK_SECRET_PREFIX) {
        return Err(format!(
            "give the secret's NAME, not a variable: the servers read NAME from {}<namespace>__<NAME>",
            gnomon_core::triggers::HOOK_SECRET_PREFIX
        ));
    }
    if arg.is_empty() || arg.len() > 128 || !arg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("{arg:?} is not a secret name: 1 to 128 letters, digits or '_'"));
    }
    Ok(arg.to_string())
}

/// `NAME=/json/pointer` of `--webhook-param`.
pub fn parse_webhook_param(arg: &str) -> Result<(String, String), String> {
    let (name, pointer) = arg.split_once('=').ok_or_else(|| format!("{arg:?} is not NAME=/json/pointer"))?;
    if name.is_empty() {
        return Err(format!("{arg:?} has no param name before '='"));
    }
    if (!pointer.is_empty() && !pointer.starts_with('/')) || pointer.len() > 1024 {
        return Err(format!(
            "{pointer:?} is not a JSON pointer: '/'-separated names such as /repository/name (empty: the whole body), at most 1024 bytes"
        ));
    }
    Ok((name.to_string(), pointer.to_string()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use serde_json::json;

    use crate::{Cli, Command, JobCmd};

    /// The job JSON `gnomon job create …` sends, or the CLI's error.
    fn body(args: &[&str]) -> Result<serde_json::Value, String> {
        let mut all = vec!["gnomon", "job", "create"];
        all.extend_from_slice(args);
        let cli = Cli::try_parse_from(all).map_err(|e| e.to_string())?;
        let Command::Job(JobCmd::Create(a)) = cli.command else { panic!("not job create") };
        crate::commands::create_body(a).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn after_edges_take_the_specs_words() {
        let b = body(&["load", "--after", "extract", "--after", "audit:failed", "--after", "notify:any", "--", "true"]).unwrap();
        assert_eq!(
            b["after"],
            json!([{"job": "extract", "on": "succeeded"}, {"job": "audit", "on": "failed"}, {"job": "notify", "on": "any"}])
        );
        assert!(body(&["load", "--", "true"]).unwrap().get("after").is_none(), "no --after, no field");
        for (bad, says) in [
            ("extract:failure", "did you mean failed"),
            ("extract:always", "did you mean any"),
            ("extract:maybe", "succeeded, failed or any"),
            ("other/extract", "another namespace"),
            ("bad name", "contains ' '"),
            (":failed", "must not be empty"),
        ] {
            let e = body(&["load", "--after", bad, "--", "true"]).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = body(&["load", "--after", "load", "--", "true"]).unwrap_err();
        assert!(e.contains("cannot run after itself"), "{e}");
        let e = body(&["load", "--after", "a", "--after", "a:any", "--", "true"]).unwrap_err();
        assert!(e.contains("named twice"), "{e}");
    }

    #[test]
    fn params_are_declared_with_typed_defaults() {
        let b = body(&[
            "report",
            "--param",
            "day",
            "--param",
            "region=eu",
            "--param",
            "limit=100",
            "--param",
            "code:string=007",
            "--param",
            "n:int=5",
            "--param",
            "ratio:number=0.5",
            "--param",
            "dry:bool=true",
            "--param",
            "opts:json={\"a\":[1]}",
            "--param",
            "plain:string=true",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(
            b["params"],
            json!({"day": {}, "region": {"default": "eu"}, "limit": {"default": 100}, "code": {"default": "007"},
                   "n": {"default": 5}, "ratio": {"default": 0.5}, "dry": {"default": true}, "opts": {"default": {"a": [1]}},
                   "plain": {"default": "true"}})
        );
        for (bad, says) in [
            ("1day=x", "a parameter name is"),
            ("a-b", "a parameter name is"),
            ("n:int=five", "is not an integer"),
            ("n:bool=yes", "is not true or false"),
            ("n:json={", "is not JSON"),
            ("n:date=2026-01-01", "TYPE is string, int, number, bool or json"),
            ("n:int", "has no default"),
            ("n:number=inf", "finite"),
        ] {
            let e = body(&["report", "--param", bad, "--", "true"]).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = body(&["report", "--param", "a=1", "--param", "a=2", "--", "true"]).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
        let e = body(&["report", "--param", "Region=1", "--param", "region=2", "--", "true"]).unwrap_err();
        assert!(e.contains("only in case"), "{e}");
        // A job that starts runs no trigger sets needs every default.
        let e = body(&["report", "--every", "1m", "--param", "day", "--", "true"]).unwrap_err();
        assert!(e.contains("day has no default"), "{e}");
        let e = body(&["report", "--after", "load", "--param", "day", "--", "true"]).unwrap_err();
        assert!(e.contains("day has no default"), "{e}");
        assert!(body(&["report", "--param", "day", "--", "true"]).is_ok(), "a manual job may require a param");
    }

    #[test]
    fn the_webhook_flags_make_the_trigger() {
        let b = body(&[
            "deploy",
            "--param",
            "branch=main",
            "--param",
            "repo=x",
            "--webhook-secret",
            "DEPLOY",
            "--webhook-secondary-secret",
            "DEPLOY_NEXT",
            "--webhook-tolerance",
            "60",
            "--webhook-param",
            "branch=/ref",
            "--webhook-param",
            "repo=/repository/name",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(
            b["triggers"],
            json!({"webhook": {"secret": "DEPLOY", "secondary_secret": "DEPLOY_NEXT", "tolerance_seconds": 60,
                               "params": {"branch": "/ref", "repo": "/repository/name"}}})
        );
        assert_eq!(body(&["deploy", "--webhook-secret", "D", "--", "true"]).unwrap()["triggers"], json!({"webhook": {"secret": "D"}}));
        assert!(body(&["deploy", "--", "true"]).unwrap().get("triggers").is_none());
        for (args, says) in [
            (vec!["--webhook-tolerance", "60"], "--webhook-secret"),
            (vec!["--webhook-secret", "D", "--webhook-tolerance", "0"], "0 is not in 1..=3600"),
            (vec!["--webhook-secret", "D", "--webhook-tolerance", "3601"], "3601 is not in 1..=3600"),
            (vec!["--webhook-secret", "GNOMON_HOOK_SECRET_D"], "give the secret's NAME"),
            (vec!["--webhook-secret", "a-b"], "not a secret name"),
            (vec!["--webhook-secret", "D", "--webhook-param", "branch=ref"], "not a JSON pointer"),
            (vec!["--webhook-secret", "D", "--webhook-param", "branch=/ref"], "declares no param \"branch\""),
            (vec!["--webhook-secret", "D", "--webhook-secondary-secret", "D"], "the same secret"),
        ] {
            let mut all = vec!["deploy"];
            all.extend(args.iter().copied());
            all.extend(["--", "true"]);
            let e = body(&all).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }
}
