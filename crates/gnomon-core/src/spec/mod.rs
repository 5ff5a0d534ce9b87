//! Job specifications: the JSON users write, its validation, and the compiled
//! form the leader runs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::{format_duration, parse_duration};
use crate::retry::BackoffPolicy;
use crate::schedule::{CronSchedule, Jitter, Rule, Schedule};
use crate::{Millis, SpecError};

/// The longest job or handler name, in characters.
pub const MAX_NAME_LEN: usize = 128;
/// The longest namespace name, in characters.
pub const MAX_NAMESPACE_LEN: usize = 64;
/// The most attempts `retry.max_attempts` may give a run.
pub const MAX_ATTEMPTS_LIMIT: u32 = 100;
/// The largest handler payload, in bytes of its JSON.
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;
/// The longest job description, in characters.
pub const MAX_DESCRIPTION_LEN: usize = 4096;
/// The longest `route.labels` key or value, in characters.
pub const MAX_LABEL_LEN: usize = 63;
/// The methods an HTTP job may use.
pub const HTTP_METHODS: [&str; 7] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];
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
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub name: String,
    /// The namespace the job belongs to (credentials and notification
    /// secrets are scoped by namespace): 1 to 64 characters, by the same
    /// rules as `name`. Absent: `default`; a stored job always has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::Namespace>))]
    pub namespace: Option<String>,
    /// Free text for people, at most 4096 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 4096))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::Timeout>))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::CatchupWindow>))]
    pub catchup_window: Option<String>,
    /// Which workers may run the job and how one is chosen. Absent: any
    /// worker that runs the executor, `least_loaded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteSpec>,
    /// Who is told of the runs' outcomes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 8))]
    pub notify: Vec<crate::notify::NotifyTarget>,
    /// The parameters a run takes, by name, with their defaults: a manual
    /// trigger (and a webhook or a backfill) may set them, and each run
    /// records the values it ran with. Shell jobs see them as
    /// `GNOMON_PARAM_<NAME>` and in the JSON file `GNOMON_PARAMS_FILE`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<crate::schema::ParamName, crate::params::ParamSpec>))]
    pub params: BTreeMap<String, crate::params::ParamSpec>,
    /// The jobs of this namespace whose runs this job runs after: for each
    /// run of an upstream at an instant, this job gets one run of the same
    /// instant, which waits until every upstream's run of that instant has
    /// ended and runs if each ended as its edge's `on` accepts (else it is
    /// recorded `skipped`). At most 32 edges; no cycles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 32))]
    pub after: Vec<crate::deps::AfterEdge>,
    /// What else may start the job's runs: `{"webhook": {…}}`, a signed
    /// `POST /v1/hooks/{namespace}/{job}` whose body is the run's payload.
    #[serde(default, skip_serializing_if = "crate::triggers::TriggersSpec::is_empty")]
    pub triggers: crate::triggers::TriggersSpec,
    /// Read-only metadata that the API adds (version, timestamps). Accepted
    /// and ignored on write so `job get -o json | job apply -f -` works;
    /// a compiled spec never holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub status: Option<serde_json::Value>,
}

/// Exactly one of `cron`, `every` or `at`, or none of them (manual only).
/// Its OpenAPI schema lists the variants (`crate::schema`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// The first instant the schedule may have (RFC 3339, included): with
    /// `cron` or `every`, instants before it are not instants of the
    /// schedule (no run, no skip record). Stored in UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    /// The last instant the schedule may have (RFC 3339, included; not
    /// before `start_at`): with `cron` or `every`, instants after it are
    /// not instants of the schedule. Stored in UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    /// Delays each instant's fire by up to this duration (1ms to 1h, less
    /// than the job's `catchup_window`), by an amount derived from the
    /// job's namespace, name and the instant, so every leader fires it at
    /// the same time and jobs due at one instant spread out. A run keeps
    /// its instant as `scheduled_at`; the delay is always less than the
    /// time to the next instant. Not with a manual schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
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
    /// Must not be empty (nor only spaces); no NUL.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\x00]*[^\\x00\\s][^\\x00]*$"))]
    pub command: String,
    /// Its arguments, passed as they are (no expansion, no quoting); no NUL.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<crate::schema::NoNul>))]
    pub args: Vec<String>,
    /// Environment variables to set, by name (names without `=`, never
    /// `GNOMON_*`). Besides these the command sees only `PATH`, `HOME`,
    /// `LANG` and `TZ` from the worker and the attempt's `GNOMON_*`
    /// variables; a name given here replaces the worker's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<crate::schema::EnvName, crate::schema::NoNul>))]
    pub env: BTreeMap<String, String>,
    /// The working directory (no NUL); by default a fresh directory per attempt
    /// under the worker's data dir, removed when the attempt ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::NoNul>))]
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
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::int::option")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 9007199254740991_u64))]
    pub cpu_seconds: Option<u64>,
    /// Memory (`memory.max` by cgroup, else address space `RLIMIT_AS`),
    /// e.g. `"512MiB"`, `"2GiB"` or bytes;
    /// units are powers of 1024 (`K`, `M`, `G`, with or without `iB`/`B`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::MemorySize>))]
    pub memory: Option<String>,
    /// Open file descriptors (`RLIMIT_NOFILE`), at least 8.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::int::option")]
    #[cfg_attr(feature = "openapi", schema(minimum = 8, maximum = 9007199254740991_u64))]
    pub open_files: Option<u64>,
    /// Processes of the attempt (`pids.max` by cgroup); without cgroups,
    /// of the user the job runs as (`RLIMIT_NPROC` counts all of that
    /// user's processes, so it is then meant for use with `--run-as`).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::int::option")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 9007199254740991_u64))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::HttpMethod))]
    pub method: String,
    /// The URL to request: `http://` or `https://`, with a host.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::HttpUrl))]
    pub url: String,
    /// Extra request headers, by name (valid header names; values without
    /// CR, LF or NUL).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<crate::schema::HeaderName, crate::schema::HeaderValue>))]
    pub headers: BTreeMap<String, String>,
    /// The request body, sent as it is (set `Content-Type` in `headers`
    /// when the receiver needs it). Absent: no body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Expected status; when absent any 2xx succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::int::option")]
    #[cfg_attr(feature = "openapi", schema(minimum = 100, maximum = 599))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub name: String,
    /// Any JSON value, handed to the handler as it is; at most 256 KiB as
    /// JSON. Absent: `null`.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = utoipa::openapi::schema::Value))]
    pub payload: serde_json::Value,
}

/// How a run is retried after an attempt fails, times out or is lost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts a run gets in all, the first included: 1 (the default: no
    /// retry) to 100.
    #[serde(default = "one", deserialize_with = "crate::int::exact")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::BackoffInitial>))]
    pub initial: Option<String>,
    /// The longest delay: a duration, at least `initial` and at most one
    /// year (default `1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::BackoffMax>))]
    pub max: Option<String>,
    /// How much each delay grows over the one before: 1.0 (constant) to
    /// 10.0 (default 2.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1.0, maximum = 10.0))]
    pub multiplier: Option<f64>,
    /// The random spread of each delay, as a fraction: the delay is drawn
    /// uniformly from `delay × (1 ± jitter)`, never above `max`. 0.0 (none)
    /// to 1.0 (default 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 1.0))]
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
    /// of these labels with exactly this value (keys 1 to 63 characters,
    /// values at most 63). Empty: any worker.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<crate::schema::LabelKey, crate::schema::LabelValue>))]
    pub labels: BTreeMap<String, String>,
}

/// A validated job: the normalised spec plus its compiled parts.
#[derive(Debug, Clone)]
pub struct CompiledJob {
    /// The normalised spec (namespace filled in, durations and times in
    /// canonical form, no `status`): what is stored.
    pub spec: JobSpec,
    /// The compiled schedule ([`Schedule::manual`] when none is given).
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
    /// The values of a run that no trigger set (the declared defaults) as
    /// JSON, as a scheduled fire records them; `None` when the job
    /// declares no params.
    pub default_params: Option<String>,
}

/// The longest `schedule.jitter`.
pub const MAX_JITTER: Duration = Duration::from_secs(3600);

/// The catch-up window of a job that sets none: one hour.
pub const DEFAULT_CATCHUP_WINDOW: Duration = Duration::from_secs(3600);

mod compile;

pub use compile::{parse_job_json, validate_name};
