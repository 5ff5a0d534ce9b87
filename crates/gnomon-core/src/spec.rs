//! Job specifications: the JSON users write, its validation, and the compiled
//! form the leader runs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::{format_duration, parse_duration};
use crate::retry::BackoffPolicy;
use crate::schedule::{CronSchedule, Schedule};
use crate::{Millis, SpecError};

/// The longest job or handler name, in characters.
pub const MAX_NAME_LEN: usize = 128;
/// The longest namespace name, in characters.
pub const MAX_NAMESPACE_LEN: usize = 64;
/// The most attempts `retry.max_attempts` may give a run.
pub const MAX_ATTEMPTS_LIMIT: u32 = 100;
/// The largest handler payload, in bytes of its JSON.
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;
/// The namespace of a job that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A job as users write it (and as it is stored, normalised). Unknown fields
/// are rejected so a typo never silently changes behaviour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The job's name, unique within its namespace: 1 to 128 letters,
    /// digits, `_`, `.` or `-`, starting with a letter or digit.
    pub name: String,
    /// The namespace the job belongs to (credentials and notification
    /// secrets are scoped by namespace): 1 to 64 characters, by the same
    /// rules as `name`. Absent: `default`; a stored job always has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Free text for people, at most 4096 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// When the job fires by itself. Absent or `{}`: never; it runs only
    /// when triggered.
    #[serde(default)]
    pub schedule: ScheduleSpec,
    /// What each attempt runs: exactly one of `shell`, `http` or
    /// `handler`.
    pub executor: Executor,
    /// How many attempts a run gets and the delay between them. Absent:
    /// one attempt, no retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// How long one attempt may run before the worker kills it and ends it
    /// `timed_out`: a duration such as `"30s"` or `"10m"`, 1ms to one year
    /// (stored in canonical form, e.g. `"1m30s"`). Absent: no limit (an
    /// `http` request still gives up after the worker's own 5-minute
    /// limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// What a fire does while an earlier run of the job is still open
    /// (default `allow`).
    #[serde(default)]
    pub overlap: OverlapPolicy,
    /// What becomes of scheduled times that were missed (default
    /// `fire_once`).
    #[serde(default)]
    pub misfire: MisfirePolicy,
    /// How far back missed scheduled times may still fire under `misfire`:
    /// a duration, 1ms to one year (default `1h`). Missed times older than
    /// this are recorded `skipped` whatever `misfire` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catchup_window: Option<String>,
    /// Which workers may run the job and how one is chosen. Absent: any
    /// worker that runs the executor, `least_loaded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteSpec>,
    /// Who is told of the runs' outcomes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<crate::notify::NotifyTarget>,
    /// Read-only metadata that the API adds (version, timestamps). Accepted
    /// and ignored on write so `job get -o json | job apply -f -` works;
    /// a compiled spec never holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub status: Option<serde_json::Value>,
}

/// Exactly one of `cron`, `every` or `at`, or none of them (manual only).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// A cron expression on the wall clock of `timezone`: 6 fields
    /// (seconds first) or 5 (seconds 0); `L`, `W`, `#` and `@hourly`-style
    /// macros work. At most 256 characters; it must match some real date.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA time zone `cron` is evaluated in, e.g. `Europe/Berlin`.
    /// Only with `cron`; default `UTC` (a stored cron schedule always has
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// A fixed interval, a duration such as `"10s"` (100ms to one year):
    /// the job fires at every multiple of it since the Unix epoch, on
    /// absolute time, whatever the wall clock does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// An instant (RFC 3339) at which the job fires once; stored in UTC
    /// with millisecond precision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// What an attempt runs: job JSON holds exactly one of `shell`, `http` or
/// `handler`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Executor {
    /// Execute a command on the worker.
    Shell(ShellSpec),
    /// Make an HTTP request from the worker.
    Http(HttpSpec),
    /// Call a handler registered on the worker.
    Handler(HandlerSpec),
}

impl Executor {
    /// The executor's kind, as workers announce what they run: `shell`,
    /// `http` or `handler`.
    pub fn kind(&self) -> &'static str {
        match self {
            Executor::Shell(_) => "shell",
            Executor::Http(_) => "http",
            Executor::Handler(_) => "handler",
        }
    }
}

/// An argv vector: `command` is executed directly with `args`; there is no
/// shell interpolation unless the user writes `sh -c`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ShellSpec {
    /// The program to execute: a path, or a name looked up in `PATH`.
    /// Must not be empty.
    pub command: String,
    /// Its arguments, passed as they are (no expansion, no quoting).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables to set, by name (names without `=`, never
    /// `GNOMON_*`). Besides these the command sees only `PATH`, `HOME`,
    /// `LANG` and `TZ` from the worker and the attempt's `GNOMON_*`
    /// variables; a name given here replaces the worker's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The working directory; by default a fresh directory per attempt
    /// under the worker's data dir, removed when the attempt ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Keep the fresh per-attempt directory after the attempt (for debugging).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_workdir: bool,
    /// Resource limits of the job's processes (setrlimit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
}

/// Resource limits of a shell job. Memory and processes are the attempt's
/// cgroup limits (`memory.max`, `pids.max`, for all its processes together)
/// where the worker runs attempts in cgroups, and setrlimit otherwise.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// CPU time, in seconds (`RLIMIT_CPU`): past it the process is killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<u64>,
    /// Memory (`memory.max` by cgroup, else address space `RLIMIT_AS`),
    /// e.g. `"512MiB"`, `"2GiB"` or bytes;
    /// units are powers of 1024 (`K`, `M`, `G`, with or without `iB`/`B`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// Open file descriptors (`RLIMIT_NOFILE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
    /// Processes of the attempt (`pids.max` by cgroup); without cgroups,
    /// of the user the job runs as (`RLIMIT_NPROC` counts all of that
    /// user's processes, so it is then meant for use with `--run-as`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
}

/// Parses a size: bytes, or a number with `K`, `M`, `G`, `T` (powers of
/// 1024; `KiB`, `KB` and `k` mean the same).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("{text:?} is not a size like \"512MiB\""))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        u => return Err(format!("unknown size unit {u:?} in {text:?} (use K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("{text:?} is too large"))
}

/// An HTTP request the worker makes. Besides `headers` it carries the
/// attempt's `Gnomon-Run-Id`, `Gnomon-Attempt`, `Gnomon-Fence-Token`, …
/// headers; the attempt's exit code is the answer's status and its output
/// the answer's body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HttpSpec {
    /// `GET` (default), `POST`, `PUT`, `PATCH`, `DELETE`, `HEAD` or
    /// `OPTIONS`, in capitals.
    #[serde(default = "default_method")]
    pub method: String,
    /// The URL to request: `http://` or `https://`, with a host.
    pub url: String,
    /// Extra request headers, by name (valid header names; values without
    /// CR, LF or NUL).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// The request body, sent as it is (set `Content-Type` in `headers`
    /// when the receiver needs it). Absent: no body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Expected status; when absent any 2xx succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_status: Option<u16>,
}

fn default_method() -> String {
    "GET".into()
}

/// A call of a named handler registered on the worker (every worker has
/// `noop` and `echo`); its attempts go only to workers that registered it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HandlerSpec {
    /// The handler's name: 1 to 128 letters, digits, `_`, `.` or `-`,
    /// starting with a letter or digit.
    pub name: String,
    /// Any JSON value, handed to the handler as it is; at most 256 KiB as
    /// JSON. Absent: `null`.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub payload: serde_json::Value,
}

/// How a run is retried after an attempt fails, times out or is lost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts a run gets in all, the first included: 1 (the default: no
    /// retry) to 100.
    #[serde(default = "one")]
    pub max_attempts: u32,
    /// The delay before each retry. Absent: from 1s, doubling, up to 1m,
    /// with ±20 % jitter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffSpec>,
}

fn one() -> u32 {
    1
}

/// Exponential backoff between attempts: after the n-th failed attempt
/// the run waits `initial × multiplier^(n-1)`, at most `max`, spread by
/// `jitter`. Each field left out keeps its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BackoffSpec {
    /// The delay before the first retry: a duration such as `"1s"`, 1ms to
    /// one year (default `1s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial: Option<String>,
    /// The longest delay: a duration, at least `initial` and at most one
    /// year (default `1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// How much each delay grows over the one before: 1.0 (constant) to
    /// 10.0 (default 2.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
    /// The random spread of each delay, as a fraction: the delay is drawn
    /// uniformly from `delay × (1 ± jitter)`, never above `max`. 0.0 (none)
    /// to 1.0 (default 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
}

/// What a fire does while an earlier run of the job is still open
/// (pending, assigned, running or retrying).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Runs may overlap freely.
    #[default]
    Allow,
    /// A fire while a run is active is recorded `skipped`.
    Forbid,
    /// A fire while a run is active cancels the active run.
    Replace,
    /// At most one run waits behind the active one; further fires are skipped.
    BufferOne,
}

/// What becomes of scheduled times that were missed: reached more than the
/// misfire grace (`--misfire-grace`, default 1s) late, because no leader
/// was running, the leader was held up, or backpressure deferred new
/// fires. Times older than the job's `catchup_window` are skipped under
/// every policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum MisfirePolicy {
    /// Missed times are recorded `skipped`.
    Skip,
    /// The latest missed time within the catch-up window fires; older ones are skipped.
    #[default]
    FireOnce,
    /// Every missed time within the catch-up window fires.
    FireAll,
}

/// How a worker is chosen among those eligible for an attempt (connected,
/// not draining, running the job's executor kind and handler, matching
/// its labels).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RouteStrategy {
    /// The worker holding the fewest attempts relative to its capacity, so
    /// a free slot anywhere beats a queue; ties rotate.
    #[default]
    LeastLoaded,
    /// Each worker with room in turn.
    RoundRobin,
    /// The same worker for the same job name (rendezvous hashing: about
    /// 1/N of jobs move when a worker joins or leaves); a run waits while
    /// that worker is full instead of going elsewhere.
    ConsistentHash,
}

/// Which workers may run a job's attempts, and how one is chosen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// How one worker is chosen (default `least_loaded`).
    #[serde(default)]
    pub strategy: RouteStrategy,
    /// A label selector: a worker is eligible only when it has every one
    /// of these labels with exactly this value (keys 1 to 63 bytes, values
    /// at most 63). Empty: any worker.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A validated job: the normalised spec plus its compiled parts.
#[derive(Debug, Clone)]
pub struct CompiledJob {
    /// The normalised spec (namespace filled in, durations and times in
    /// canonical form, no `status`): what is stored.
    pub spec: JobSpec,
    /// The compiled schedule ([`Schedule::Manual`] when none is given).
    pub schedule: Schedule,
    /// One attempt's timeout; `None`: no limit.
    pub timeout: Option<Duration>,
    /// Attempts a run gets in all (1 to [`MAX_ATTEMPTS_LIMIT`]).
    pub max_attempts: u32,
    /// The delay between attempts (the defaults when `retry.backoff` is
    /// absent).
    pub backoff: BackoffPolicy,
    /// How far back missed times may still fire, in milliseconds
    /// ([`DEFAULT_CATCHUP_WINDOW`] when none is given).
    pub catchup_window_ms: i64,
}

/// The catch-up window of a job that sets none: one hour.
pub const DEFAULT_CATCHUP_WINDOW: Duration = Duration::from_secs(3600);

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
        spec.namespace = Some(ns);
        if let Some(d) = &spec.description {
            if d.len() > 4096 {
                return Err(SpecError::new("invalid_field", "description", "longer than 4096 bytes"));
            }
        }
        let schedule = compile_schedule(&mut spec.schedule)?;
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
                if k.is_empty() || k.len() > 63 || v.len() > 63 {
                    return Err(SpecError::new(
                        "invalid_route",
                        format!("route.labels.{k}"),
                        "label keys must be 1-63 bytes, values at most 63",
                    ));
                }
            }
        }
        crate::notify::compile_targets(&mut spec.notify)?;
        Ok(CompiledJob {
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
    /// The schedule this describes (as a job's spec compiles it).
    pub fn compile(&self) -> Result<Schedule, SpecError> {
        compile_schedule(&mut self.clone())
    }
}

fn compile_schedule(s: &mut ScheduleSpec) -> Result<Schedule, SpecError> {
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
        return Ok(Schedule::Cron(Box::new(c)));
    }
    if let Some(every) = &s.every {
        let d = positive_duration_field("schedule.every", every)?;
        if d < Duration::from_millis(100) {
            return Err(SpecError::new("invalid_duration", "schedule.every", "must be at least 100ms"));
        }
        s.every = Some(format_duration(d));
        return Ok(Schedule::Every { every_ms: i64::try_from(d.as_millis()).unwrap_or(i64::MAX) });
    }
    if let Some(at) = &s.at {
        let t = chrono::DateTime::parse_from_rfc3339(at)
            .map_err(|e| SpecError::new("invalid_schedule", "schedule.at", format!("not an RFC 3339 time: {e}")))?;
        let at_ms: Millis = t.timestamp_millis();
        s.at = Some(crate::format_millis(at_ms));
        return Ok(Schedule::At { at_ms });
    }
    Ok(Schedule::Manual)
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
            const METHODS: [&str; 7] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];
            if !METHODS.contains(&h.method.as_str()) {
                return Err(SpecError::new("invalid_executor", "executor.http.method", format!("must be one of {}", METHODS.join(", "))));
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
}
