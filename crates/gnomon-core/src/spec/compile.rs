//! Parsing and checking a job: JSON to [`JobSpec`] with the path of the
//! offending field, every field validated where it is parsed, and the
//! schedule and backoff compiled ([`CompiledJob`]).

use super::*;

/// Parses a JSON job document; serde errors are mapped to stable codes and
/// carry the path of the offending field.
pub fn parse_job_json(bytes: &[u8]) -> Result<JobSpec, SpecError> {
    let text = std::str::from_utf8(bytes).map_err(|e| SpecError::new("invalid_encoding", "body", format!("body is not UTF-8: {e}")))?;
    let mut de = serde_json::Deserializer::from_str(text);
    let spec: JobSpec = serde_path_to_error::deserialize(&mut de).map_err(|e| json_error(&e))?;
    de.end().map_err(|e| SpecError::new("invalid_json", "body", e.to_string()))?;
    Ok(spec)
}

fn json_error(e: &serde_path_to_error::Error<serde_json::Error>) -> SpecError {
    let path = e.path().to_string();
    let field = if path == "." || path == "?" { "body".to_string() } else { path };
    let inner = e.inner();
    let message = inner.to_string();
    let code = if message.starts_with("unknown field") {
        "unknown_field"
    } else if message.starts_with("missing field") {
        "missing_field"
    } else if inner.is_syntax() || inner.is_eof() {
        "invalid_json"
    } else {
        "invalid_field"
    };
    SpecError::new(code, field, message)
}

/// Checks a job or namespace name: 1..=max characters from `[A-Za-z0-9_.-]`,
/// starting with a letter or digit.
pub fn validate_name(field: &str, name: &str, max: usize) -> Result<(), SpecError> {
    if name.is_empty() {
        return Err(SpecError::new("invalid_name", field, "must not be empty"));
    }
    if name.len() > max {
        return Err(SpecError::new("invalid_name", field, format!("longer than {max} characters")));
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))) {
        return Err(SpecError::new("invalid_name", field, format!("contains {bad:?}; only letters, digits, '_', '.' and '-' are allowed")));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(SpecError::new("invalid_name", field, "must start with a letter or digit"));
    }
    Ok(())
}

fn duration_field(field: &str, text: &str) -> Result<Duration, SpecError> {
    parse_duration(text).map_err(|m| SpecError::new("invalid_duration", field, m))
}

fn positive_duration_field(field: &str, text: &str) -> Result<Duration, SpecError> {
    let d = duration_field(field, text)?;
    if d < Duration::from_millis(1) {
        // Sub-millisecond durations would round to zero (no timeout at all).
        return Err(SpecError::new("invalid_duration", field, "must be at least 1ms"));
    }
    if d > Duration::from_secs(366 * 24 * 3600) {
        return Err(SpecError::new("invalid_duration", field, "must be at most one year"));
    }
    Ok(d)
}

impl JobSpec {
    /// The job's namespace: `namespace`, or [`DEFAULT_NAMESPACE`] when it
    /// is absent.
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
    }

    /// Validates every field and compiles the schedule. On success the
    /// returned spec is normalised (namespace filled in, durations
    /// canonicalised) and is what gets stored.
    pub fn compile(&self) -> Result<CompiledJob, SpecError> {
        let mut spec = self.clone();
        spec.status = None;
        validate_name("name", &spec.name, MAX_NAME_LEN)?;
        let ns = spec.namespace().to_string();
        validate_name("namespace", &ns, MAX_NAMESPACE_LEN)?;
        spec.namespace = Some(ns.clone());
        if let Some(d) = &spec.description {
            if d.chars().count() > MAX_DESCRIPTION_LEN {
                return Err(SpecError::new("invalid_field", "description", format!("longer than {MAX_DESCRIPTION_LEN} characters")));
            }
        }
        let name = spec.name.clone();
        let schedule = compile_schedule(&mut spec.schedule, Some((&ns, &name)))?;
        validate_executor(&spec.executor)?;
        let timeout = match &spec.timeout {
            Some(t) => {
                let d = positive_duration_field("timeout", t)?;
                spec.timeout = Some(format_duration(d));
                Some(d)
            }
            None => None,
        };
        let (max_attempts, backoff) = match &mut spec.retry {
            None => (1, BackoffPolicy::default()),
            Some(retry) => {
                if retry.max_attempts == 0 {
                    return Err(SpecError::new("invalid_retry", "retry.max_attempts", "must be at least 1"));
                }
                if retry.max_attempts > MAX_ATTEMPTS_LIMIT {
                    return Err(SpecError::new("invalid_retry", "retry.max_attempts", format!("must be at most {MAX_ATTEMPTS_LIMIT}")));
                }
                let backoff = compile_backoff(retry.backoff.as_mut())?;
                (retry.max_attempts, backoff)
            }
        };
        let catchup = match &spec.catchup_window {
            Some(w) => {
                let d = positive_duration_field("catchup_window", w)?;
                spec.catchup_window = Some(format_duration(d));
                d
            }
            None => DEFAULT_CATCHUP_WINDOW,
        };
        if let Some(route) = &spec.route {
            for (k, v) in &route.labels {
                if k.is_empty() || k.chars().count() > MAX_LABEL_LEN || v.chars().count() > MAX_LABEL_LEN {
                    return Err(SpecError::new(
                        "invalid_route",
                        format!("route.labels.{k}"),
                        format!("label keys must be 1-{MAX_LABEL_LEN} characters, values at most {MAX_LABEL_LEN}"),
                    ));
                }
            }
        }
        crate::notify::compile_targets(&mut spec.notify)?;
        crate::deps::validate_edges(&spec.name, &spec.after)?;
        if schedule.max_jitter_ms() >= i64::try_from(catchup.as_millis()).unwrap_or(i64::MAX) {
            return Err(SpecError::new("invalid_schedule", "schedule.jitter", "must be shorter than the job's catchup_window"));
        }
        let untriggered = !schedule.is_manual() || !spec.after.is_empty();
        crate::params::validate_declared(&spec.params, untriggered)?;
        crate::triggers::validate(&spec.triggers, &ns, &spec.params)?;
        let default_params = crate::params::defaults(&spec.params).map(|v| serde_json::to_string(&v).unwrap_or_default());
        Ok(CompiledJob {
            default_params,
            spec,
            schedule,
            timeout,
            max_attempts,
            backoff,
            catchup_window_ms: i64::try_from(catchup.as_millis()).unwrap_or(i64::MAX),
        })
    }
}

impl ScheduleSpec {
    /// The schedule this describes, as the spec of job `name` in
    /// `namespace` compiles it (its jitter is seeded by them); without a
    /// job, a jitter is checked but delays nothing.
    pub fn compile(&self, job: Option<(&str, &str)>) -> Result<Schedule, SpecError> {
        compile_schedule(&mut self.clone(), job)
    }
}

fn time_field(field: &str, text: &str) -> Result<Millis, SpecError> {
    let t = chrono::DateTime::parse_from_rfc3339(text)
        .map_err(|e| SpecError::new("invalid_schedule", field, format!("not an RFC 3339 time: {e}")))?;
    Ok(t.timestamp_millis())
}

/// A schedule's rule, then its bounds and jitter (normalised in `s`).
fn compile_schedule(s: &mut ScheduleSpec, job: Option<(&str, &str)>) -> Result<Schedule, SpecError> {
    let rule = compile_rule(s)?;
    let bounded = s.start_at.is_some() || s.end_at.is_some();
    if bounded && !matches!(rule, Rule::Cron(_) | Rule::Every { .. }) {
        let field = if s.start_at.is_some() { "schedule.start_at" } else { "schedule.end_at" };
        return Err(SpecError::new("invalid_schedule", field, "start_at and end_at bound a cron or every schedule"));
    }
    let start = s.start_at.as_deref().map(|t| time_field("schedule.start_at", t)).transpose()?;
    let end = s.end_at.as_deref().map(|t| time_field("schedule.end_at", t)).transpose()?;
    if let (Some(start), Some(end)) = (start, end) {
        if end < start {
            return Err(SpecError::new("invalid_schedule", "schedule.end_at", "must not be before schedule.start_at"));
        }
    }
    s.start_at = start.map(crate::format_millis);
    s.end_at = end.map(crate::format_millis);
    let jitter = match &s.jitter {
        None => None,
        Some(_) if matches!(rule, Rule::Manual) => {
            return Err(SpecError::new("invalid_schedule", "schedule.jitter", "jitter applies to cron, every or at schedules"));
        }
        Some(text) => {
            let d = positive_duration_field("schedule.jitter", text)?;
            if d > MAX_JITTER {
                return Err(SpecError::new("invalid_duration", "schedule.jitter", "must be at most 1h"));
            }
            s.jitter = Some(format_duration(d));
            let seed = job.map(|(ns, name)| Jitter::seed_of(ns, name));
            seed.map(|seed| Jitter { max_ms: i64::try_from(d.as_millis()).unwrap_or(i64::MAX), seed })
        }
    };
    Ok(Schedule::from(rule).bounded(start, end).jittered(jitter))
}

fn compile_rule(s: &mut ScheduleSpec) -> Result<Rule, SpecError> {
    let given = [s.cron.is_some(), s.every.is_some(), s.at.is_some()].iter().filter(|b| **b).count();
    if given > 1 {
        return Err(SpecError::new("invalid_schedule", "schedule", "give exactly one of cron, every or at (or none for manual only)"));
    }
    if s.timezone.is_some() && s.cron.is_none() {
        return Err(SpecError::new("invalid_schedule", "schedule.timezone", "timezone applies only to cron schedules"));
    }
    if let Some(expr) = &s.cron {
        let tz = s.timezone.clone().unwrap_or_else(|| "UTC".into());
        let c = CronSchedule::parse(expr, &tz)?;
        s.cron = Some(c.expression.clone());
        s.timezone = Some(tz);
        return Ok(Rule::Cron(Box::new(c)));
    }
    if let Some(every) = &s.every {
        let d = positive_duration_field("schedule.every", every)?;
        if d < Duration::from_millis(100) {
            return Err(SpecError::new("invalid_duration", "schedule.every", "must be at least 100ms"));
        }
        s.every = Some(format_duration(d));
        return Ok(Rule::Every { every_ms: i64::try_from(d.as_millis()).unwrap_or(i64::MAX) });
    }
    if let Some(at) = &s.at {
        let t = chrono::DateTime::parse_from_rfc3339(at)
            .map_err(|e| SpecError::new("invalid_schedule", "schedule.at", format!("not an RFC 3339 time: {e}")))?;
        let at_ms: Millis = t.timestamp_millis();
        s.at = Some(crate::format_millis(at_ms));
        return Ok(Rule::At { at_ms });
    }
    Ok(Rule::Manual)
}

fn compile_backoff(b: Option<&mut BackoffSpec>) -> Result<BackoffPolicy, SpecError> {
    let mut policy = BackoffPolicy::default();
    let Some(b) = b else { return Ok(policy) };
    if let Some(i) = &b.initial {
        policy.initial = positive_duration_field("retry.backoff.initial", i)?;
        b.initial = Some(format_duration(policy.initial));
    }
    if let Some(m) = &b.max {
        policy.max = positive_duration_field("retry.backoff.max", m)?;
        b.max = Some(format_duration(policy.max));
    }
    if policy.max < policy.initial {
        return Err(SpecError::new("invalid_retry", "retry.backoff.max", "must be at least retry.backoff.initial"));
    }
    if let Some(m) = b.multiplier {
        if !(1.0..=10.0).contains(&m) {
            return Err(SpecError::new("invalid_retry", "retry.backoff.multiplier", "must be between 1.0 and 10.0"));
        }
        policy.multiplier = m;
    }
    if let Some(j) = b.jitter {
        if !(0.0..=1.0).contains(&j) {
            return Err(SpecError::new("invalid_retry", "retry.backoff.jitter", "must be between 0.0 and 1.0"));
        }
        policy.jitter = j;
    }
    Ok(policy)
}

fn validate_limits(l: &Limits) -> Result<(), SpecError> {
    let bad = |field: &str, msg: String| SpecError::new("invalid_limits", format!("executor.shell.limits.{field}"), msg);
    if l.cpu_seconds == Some(0) {
        return Err(bad("cpu_seconds", "must be at least 1".into()));
    }
    if let Some(m) = &l.memory {
        let bytes = parse_bytes(m).map_err(|e| bad("memory", e))?;
        if bytes < 1 << 20 {
            return Err(bad("memory", "must be at least 1MiB".into()));
        }
    }
    if l.open_files.is_some_and(|n| n < 8) {
        return Err(bad("open_files", "must be at least 8".into()));
    }
    if l.processes == Some(0) {
        return Err(bad("processes", "must be at least 1".into()));
    }
    Ok(())
}

fn validate_executor(e: &Executor) -> Result<(), SpecError> {
    match e {
        Executor::Shell(s) => {
            if s.command.trim().is_empty() {
                return Err(SpecError::new("invalid_executor", "executor.shell.command", "must not be empty"));
            }
            let texts = std::iter::once(&s.command).chain(s.args.iter()).chain(s.env.values()).chain(s.cwd.iter());
            for t in texts {
                if t.contains('\0') {
                    return Err(SpecError::new("invalid_executor", "executor.shell", "strings must not contain NUL bytes"));
                }
            }
            if let Some(l) = &s.limits {
                validate_limits(l)?;
            }
            for k in s.env.keys() {
                if k.is_empty() || k.contains('=') || k.contains('\0') {
                    return Err(SpecError::new(
                        "invalid_executor",
                        format!("executor.shell.env.{k}"),
                        "environment names must be non-empty without '=' or NUL",
                    ));
                }
                if k.starts_with("GNOMON_") {
                    return Err(SpecError::new(
                        "invalid_executor",
                        format!("executor.shell.env.{k}"),
                        "GNOMON_* variables are set by gnomon itself",
                    ));
                }
            }
        }
        Executor::Http(h) => {
            let url =
                url::Url::parse(&h.url).map_err(|e| SpecError::new("invalid_url", "executor.http.url", format!("{e}: {:?}", h.url)))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(SpecError::new("invalid_url", "executor.http.url", "scheme must be http or https"));
            }
            if url.host_str().is_none_or(str::is_empty) {
                return Err(SpecError::new("invalid_url", "executor.http.url", "URL has no host"));
            }
            if !HTTP_METHODS.contains(&h.method.as_str()) {
                return Err(SpecError::new(
                    "invalid_executor",
                    "executor.http.method",
                    format!("must be one of {}", HTTP_METHODS.join(", ")),
                ));
            }
            for (k, v) in &h.headers {
                let token_ok = !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if !token_ok || v.contains(['\r', '\n', '\0']) {
                    return Err(SpecError::new("invalid_executor", format!("executor.http.headers.{k}"), "not a valid HTTP header"));
                }
            }
            if let Some(s) = h.expect_status {
                if !(100..=599).contains(&s) {
                    return Err(SpecError::new("invalid_executor", "executor.http.expect_status", "must be an HTTP status 100-599"));
                }
            }
        }
        Executor::Handler(h) => {
            validate_name("executor.handler.name", &h.name, MAX_NAME_LEN).map_err(|e| SpecError { code: "invalid_executor", ..e })?;
            let size = serde_json::to_vec(&h.payload).map(|v| v.len()).unwrap_or(usize::MAX);
            if size > MAX_PAYLOAD_BYTES {
                return Err(SpecError::new(
                    "payload_too_large",
                    "executor.handler.payload",
                    format!("payload is {size} bytes; at most {MAX_PAYLOAD_BYTES}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(json: &str) -> Result<CompiledJob, SpecError> {
        parse_job_json(json.as_bytes())?.compile()
    }

    #[test]
    fn design_example_compiles() {
        let j = compile(
            r#"{"name":"hello","schedule":{"cron":"*/5 * * * * *","timezone":"Europe/Berlin"},
 "executor":{"shell":{"command":"echo","args":["hi"]}},
 "retry":{"max_attempts":3,"backoff":{"initial":"1s","max":"1m","multiplier":2.0,"jitter":0.2}},
 "timeout":"30s","overlap":"allow","misfire":"fire_once","catchup_window":"1h",
 "route":{"strategy":"least_loaded","labels":{"region":"eu"}}}"#,
        )
        .unwrap();
        assert_eq!(j.max_attempts, 3);
        assert_eq!(j.timeout, Some(Duration::from_secs(30)));
        assert_eq!(j.spec.namespace(), "default");
        // The normalised spec round-trips.
        let again = parse_job_json(&serde_json::to_vec(&j.spec).unwrap()).unwrap().compile().unwrap();
        assert_eq!(again.spec, j.spec);
    }

    #[test]
    fn bad_inputs_have_codes_and_fields() {
        let cases = [
            (r#"{"name":"a","schedule":{"cron":"x"},"executor":{"shell":{"command":"true"}}}"#, "invalid_cron", "schedule.cron"),
            (
                r#"{"name":"a","schedule":{"cron":"* * * * *","timezone":"Nowhere/City"},"executor":{"shell":{"command":"true"}}}"#,
                "invalid_timezone",
                "schedule.timezone",
            ),
            (r#"{"name":"a","schedule":{"every":"-1s"},"executor":{"shell":{"command":"true"}}}"#, "invalid_duration", "schedule.every"),
            (r#"{"name":"a","timeout":"soon","executor":{"shell":{"command":"true"}}}"#, "invalid_duration", "timeout"),
            (r#"{"name":"a","timeout":"500us","executor":{"shell":{"command":"true"}}}"#, "invalid_duration", "timeout"),
            (
                r#"{"name":"a","executor":{"shell":{"command":"true","limits":{"memory":"12 parsecs"}}}}"#,
                "invalid_limits",
                "executor.shell.limits.memory",
            ),
            (
                r#"{"name":"a","executor":{"shell":{"command":"true","limits":{"memory":"1K"}}}}"#,
                "invalid_limits",
                "executor.shell.limits.memory",
            ),
            (
                r#"{"name":"a","executor":{"shell":{"command":"true","limits":{"cpu_seconds":0}}}}"#,
                "invalid_limits",
                "executor.shell.limits.cpu_seconds",
            ),
            (
                r#"{"name":"a","executor":{"shell":{"command":"true","limits":{"open_files":2}}}}"#,
                "invalid_limits",
                "executor.shell.limits.open_files",
            ),
            (r#"{"name":"a","retry":{"max_attempts":0},"executor":{"shell":{"command":"true"}}}"#, "invalid_retry", "retry.max_attempts"),
            (
                r#"{"name":"a","retry":{"max_attempts":100000},"executor":{"shell":{"command":"true"}}}"#,
                "invalid_retry",
                "retry.max_attempts",
            ),
            (r#"{"name":"a","bogus":1,"executor":{"shell":{"command":"true"}}}"#, "unknown_field", "bogus"),
            (r#"{"name":"a/b","executor":{"shell":{"command":"true"}}}"#, "invalid_name", "name"),
            (r#"{"name":"a","executor":{"http":{"url":"ftp://x"}}}"#, "invalid_url", "executor.http.url"),
            (r#"{"name":"a","executor":{"http":{"url":"not a url"}}}"#, "invalid_url", "executor.http.url"),
            (
                r#"{"name":"a","schedule":{"cron":"* * * * *","every":"1s"},"executor":{"shell":{"command":"true"}}}"#,
                "invalid_schedule",
                "schedule",
            ),
            (r#"{"name":"a","executor":{"shell":{"command":""}}}"#, "invalid_executor", "executor.shell.command"),
            (r#"{"name":"a","executor":{"shell":{"command":"true","oops":1}}}"#, "unknown_field", "executor.shell.oops"),
            (r#"{"name":"a"}"#, "missing_field", "body"),
            (r#"{"name":"a","#, "invalid_json", "body"),
        ];
        for (json, code, field) in cases {
            let err = compile(json).expect_err(json);
            assert_eq!((err.code, err.field.as_str()), (code, field), "{json}: {err}");
        }
        let long = format!(r#"{{"name":"{}","executor":{{"shell":{{"command":"true"}}}}}}"#, "a".repeat(129));
        assert_eq!(compile(&long).unwrap_err().code, "invalid_name");
        assert_eq!(parse_job_json(b"{\"name\":\"\xff\"}").unwrap_err().code, "invalid_encoding");
    }

    #[test]
    fn after_edges_are_checked_where_the_job_is_parsed() {
        let j = compile(r#"{"name":"report","after":[{"job":"load"},{"job":"clean","on":"any"}],"executor":{"shell":{"command":"true"}}}"#)
            .unwrap();
        assert_eq!(j.spec.after.len(), 2);
        assert_eq!(j.spec.after[0].on, crate::deps::On::Succeeded);
        let e = compile(r#"{"name":"report","after":[{"job":"report"}],"executor":{"shell":{"command":"true"}}}"#).unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("dependency_cycle", "after[0].job"));
        let e =
            compile(r#"{"name":"report","after":[{"job":"load","on":"sometimes"}],"executor":{"shell":{"command":"true"}}}"#).unwrap_err();
        assert!(e.field.starts_with("after[0]"), "{e:?}");
        // A dependency job starts runs no trigger sets: its params need defaults.
        let e = compile(r#"{"name":"report","after":[{"job":"load"}],"params":{"day":{}},"executor":{"shell":{"command":"true"}}}"#)
            .unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("missing_default", "params.day.default"));
    }

    #[test]
    fn bounds_and_jitter_are_checked_and_normalised_where_the_schedule_is_parsed() {
        let j = compile(
            r#"{"name":"q","schedule":{"cron":"0 0 * * * *","start_at":"2027-01-04T09:00:00+01:00","end_at":"2027-03-31T23:59:59Z","jitter":"90s"},
                "executor":{"shell":{"command":"true"}}}"#,
        )
        .unwrap();
        assert_eq!(j.spec.schedule.start_at.as_deref(), Some("2027-01-04T08:00:00.000Z"));
        assert_eq!(j.spec.schedule.jitter.as_deref(), Some("1m30s"));
        assert_eq!(j.schedule.max_jitter_ms(), 90_000);
        let start = chrono::DateTime::parse_from_rfc3339("2027-01-04T08:00:00Z").unwrap().timestamp_millis();
        assert_eq!(j.schedule.next_after(0), Some(start), "the first instant is start_at");
        let bad = |schedule: &str| {
            let e = compile(&format!(r#"{{"name":"q","schedule":{schedule},"executor":{{"shell":{{"command":"true"}}}}}}"#)).unwrap_err();
            (e.code, e.field)
        };
        let field = |f: &str| f.to_string();
        assert_eq!(bad(r#"{"every":"1m","start_at":"monday"}"#), ("invalid_schedule", field("schedule.start_at")));
        assert_eq!(
            bad(r#"{"every":"1m","start_at":"2027-02-01T00:00:00Z","end_at":"2027-01-01T00:00:00Z"}"#),
            ("invalid_schedule", field("schedule.end_at"))
        );
        assert_eq!(bad(r#"{"at":"2027-02-01T00:00:00Z","end_at":"2027-03-01T00:00:00Z"}"#), ("invalid_schedule", field("schedule.end_at")));
        assert_eq!(bad(r#"{"start_at":"2027-02-01T00:00:00Z"}"#), ("invalid_schedule", field("schedule.start_at")));
        assert_eq!(bad(r#"{"jitter":"5s"}"#), ("invalid_schedule", field("schedule.jitter")));
        assert_eq!(bad(r#"{"every":"1m","jitter":"2h"}"#), ("invalid_duration", field("schedule.jitter")));
        assert_eq!(bad(r#"{"every":"1m","jitter":"soon"}"#), ("invalid_duration", field("schedule.jitter")));
        let e = compile(
            r#"{"name":"q","schedule":{"every":"1m","jitter":"10m"},"catchup_window":"5m","executor":{"shell":{"command":"true"}}}"#,
        )
        .unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("invalid_schedule", "schedule.jitter"));
        // The jitter of one job differs from another's, the same for both
        // compiles of one.
        let of = |name: &str| {
            compile(&format!(
                r#"{{"name":"{name}","schedule":{{"every":"1h","jitter":"59m"}},"executor":{{"shell":{{"command":"true"}}}}}}"#
            ))
            .unwrap()
            .schedule
            .fire_at(3_600_000)
        };
        assert_eq!(of("a"), of("a"));
        assert_ne!(of("a"), of("b"));
    }
}
