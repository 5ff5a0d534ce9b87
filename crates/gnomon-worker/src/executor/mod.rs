//! The executors: `shell` (argv, process group, bounded output), `http`
//! (reqwest with rustls) and named `handler`s registered by library users.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gnomon_core::spec::{Executor, HttpSpec, ShellSpec};
use gnomon_core::{AttemptState, Millis};
use tokio::sync::watch;

mod http;
mod shell;

use http::run_http;
use shell::run_shell;

use crate::isolation::Isolation;
use crate::tail::{OutputTail, MAX_OUTPUT_BYTES};

/// Everything an attempt needs, including its idempotency key and fence.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub run_id: String,
    pub attempt: u32,
    pub job: String,
    pub namespace: String,
    pub scheduled_at: Millis,
    pub token: u64,
    pub worker_id: String,
    pub executor: Executor,
    pub timeout: Option<Duration>,
    /// How shell jobs are isolated (environment, working directory, user).
    pub isolation: Arc<Isolation>,
    /// Where HTTP jobs may connect.
    pub egress: Arc<crate::egress::Egress>,
    /// The values of the run's params; `None` for a job without params.
    pub params: Option<gnomon_core::params::Params>,
    /// The body of the webhook call that started the run; `None` for other
    /// runs.
    pub payload: Option<String>,
}

impl ExecRequest {
    /// The attempt environment (README "What a shell job sees"): the run id is the
    /// idempotency key; token and attempt let a job fence its side effects.
    pub fn gnomon_vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("RUN_ID", self.run_id.clone()),
            ("ATTEMPT", self.attempt.to_string()),
            ("SCHEDULED_AT", gnomon_core::format_millis(self.scheduled_at)),
            ("JOB", self.job.clone()),
            ("NAMESPACE", self.namespace.clone()),
            ("WORKER", self.worker_id.clone()),
            ("FENCE_TOKEN", self.token.to_string()),
        ]
    }

    /// The params as a shell job's environment has them:
    /// `GNOMON_PARAM_<NAME>` (upper case) for each, a string as it is and
    /// any other value as its JSON.
    pub fn param_vars(&self) -> Vec<(String, String)> {
        use gnomon_core::params::{env_name, env_value};
        self.params.iter().flatten().map(|(k, v)| (env_name(k), env_value(v))).collect()
    }
}

pub use gnomon_core::outcome::ExecOutcome;

/// Context handed to a handler.
#[derive(Debug, Clone)]
pub struct HandlerContext {
    pub run_id: String,
    pub attempt: u32,
    pub job: String,
    pub scheduled_at: Millis,
    pub token: u64,
    /// The values of the run's params (empty for a job without params).
    pub params: gnomon_core::params::Params,
    /// The body of the webhook call that started the run; `None` for other
    /// runs. (The job's own `payload` is the handler's second argument.)
    pub run_payload: Option<String>,
}

/// A named handler (`{"handler":{"name":…,"payload":…}}` jobs). `Ok` output
/// means success; `Err` means the attempt failed with that message.
#[async_trait::async_trait]
pub trait Handler: Send + Sync {
    async fn call(&self, ctx: HandlerContext, payload: serde_json::Value) -> Result<String, String>;
}

#[derive(Clone, Default)]
pub struct HandlerRegistry {
    handlers: HashMap<String, Arc<dyn Handler>>,
}

impl std::fmt::Debug for HandlerRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.handlers.keys()).finish()
    }
}

impl HandlerRegistry {
    pub fn register(&mut self, name: impl Into<String>, handler: Arc<dyn Handler>) {
        self.handlers.insert(name.into(), handler);
    }
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.handlers.keys().cloned().collect();
        v.sort();
        v
    }
    /// The built-ins: `noop` (succeeds at once; for benchmarks and smoke
    /// tests) and `echo` (succeeds with its payload as output).
    pub fn with_builtins() -> Self {
        let mut r = Self::default();
        r.register("noop", Arc::new(Noop));
        r.register("echo", Arc::new(Echo));
        r
    }
}

struct Noop;
#[async_trait::async_trait]
impl Handler for Noop {
    async fn call(&self, _: HandlerContext, _: serde_json::Value) -> Result<String, String> {
        Ok(String::new())
    }
}
struct Echo;
#[async_trait::async_trait]
impl Handler for Echo {
    async fn call(&self, _: HandlerContext, payload: serde_json::Value) -> Result<String, String> {
        Ok(payload.to_string())
    }
}

/// Runs one attempt to its end. Cancellation (`cancel` turning `true`) and
/// the timeout both stop the attempt; for `shell` the whole process group is
/// killed.
pub async fn execute(req: &ExecRequest, http: &reqwest::Client, handlers: &HandlerRegistry, cancel: watch::Receiver<bool>) -> ExecOutcome {
    match &req.executor {
        Executor::Shell(spec) => run_shell(req, spec, cancel).await,
        Executor::Http(spec) => bounded(req.timeout, cancel, run_http(req, spec, http)).await,
        Executor::Handler(h) => match handlers.handlers.get(&h.name) {
            None => ExecOutcome::failed(format!(
                "no handler named {:?} on worker {} (it has: {})",
                h.name,
                req.worker_id,
                handlers.names().join(", ")
            )),
            Some(handler) => {
                let ctx = HandlerContext {
                    run_id: req.run_id.clone(),
                    attempt: req.attempt,
                    job: req.job.clone(),
                    scheduled_at: req.scheduled_at,
                    token: req.token,
                    params: req.params.clone().unwrap_or_default(),
                    run_payload: req.payload.clone(),
                };
                let handler = handler.clone();
                let payload = h.payload.clone();
                bounded(req.timeout, cancel, async move {
                    match handler.call(ctx, payload).await {
                        Ok(out) => ExecOutcome { state: AttemptState::Succeeded, exit_code: None, output: truncate(out) },
                        Err(e) => ExecOutcome::failed(truncate(e)),
                    }
                })
                .await
            }
        },
    }
}

pub(super) fn truncate(mut s: String) -> String {
    if s.len() > MAX_OUTPUT_BYTES {
        let mut t = OutputTail::default();
        t.push(s.as_bytes());
        s = t.into_string();
    }
    s
}

pub(super) async fn wait_cancel(mut cancel: watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        // The sender is gone: nobody can cancel any more.
        std::future::pending::<()>().await;
    }
}

pub(super) async fn sleep_opt(timeout: Option<Duration>) {
    match timeout {
        Some(t) => tokio::time::sleep(t).await,
        None => std::future::pending().await,
    }
}

pub(super) async fn bounded(
    timeout: Option<Duration>,
    cancel: watch::Receiver<bool>,
    work: impl std::future::Future<Output = ExecOutcome>,
) -> ExecOutcome {
    tokio::select! {
        out = work => out,
        _ = sleep_opt(timeout) => ExecOutcome { state: AttemptState::TimedOut, exit_code: None, output: format!("timed out after {}", gnomon_core::duration::format_duration(timeout.unwrap_or_default())) },
        _ = wait_cancel(cancel) => ExecOutcome { state: AttemptState::Cancelled, exit_code: None, output: "cancelled".into() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gnomon_core::spec::HandlerSpec;

    fn req(executor: Executor, timeout: Option<Duration>) -> ExecRequest {
        ExecRequest {
            run_id: "job1-1000".into(),
            attempt: 2,
            job: "tick".into(),
            namespace: "default".into(),
            scheduled_at: 1000,
            token: 7,
            worker_id: "w-test".into(),
            executor,
            timeout,
            isolation: Arc::default(),
            egress: Arc::new(crate::egress::Egress::with_defaults()),
            params: None,
            payload: None,
        }
    }

    fn shell(command: &str, args: &[&str]) -> Executor {
        Executor::Shell(ShellSpec {
            command: command.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Default::default(),
            cwd: None,
            keep_workdir: false,
            limits: None,
        })
    }

    fn never() -> watch::Receiver<bool> {
        watch::channel(false).1
    }

    #[tokio::test]
    async fn shell_runs_argv_with_gnomon_env_and_no_interpolation() {
        let client = reqwest::Client::new();
        let out = execute(&req(shell("echo", &["hi", "$HOME"]), None), &client, &HandlerRegistry::default(), never()).await;
        assert_eq!((out.state, out.exit_code, out.output.as_str()), (AttemptState::Succeeded, Some(0), "hi $HOME\n"));
        let out = execute(
            &req(shell("sh", &["-c", "echo $GNOMON_RUN_ID $GNOMON_ATTEMPT $GNOMON_SCHEDULED_AT $GNOMON_JOB $GNOMON_WORKER $GNOMON_FENCE_TOKEN; echo err >&2; exit 3"]), None),
            &client,
            &HandlerRegistry::default(),
            never(),
        )
        .await;
        assert_eq!(out.state, AttemptState::Failed);
        assert_eq!(out.exit_code, Some(3));
        assert!(out.output.contains("job1-1000 2 1970-01-01T00:00:01.000Z tick w-test 7\n"), "{}", out.output);
        assert!(out.output.contains("err\n"));
    }

    #[tokio::test]
    async fn a_job_gets_a_clean_environment_and_a_private_directory_of_its_own() {
        std::env::set_var("GNOMON_TOKEN", "the-workers-own-credential");
        let root = tempfile::tempdir().unwrap();
        let iso = Arc::new(Isolation { work_root: Some(root.path().to_path_buf()), run_as: None, cgroups: None });
        let mut r = req(shell("sh", &["-c", "env; echo cwd=$(pwd); touch here"]), None);
        r.isolation = iso.clone();
        let out = execute(&r, &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
        assert_eq!(out.state, AttemptState::Succeeded, "{}", out.output);
        assert!(!out.output.contains("the-workers-own-credential"), "{}", out.output);
        assert!(out.output.contains("GNOMON_FENCE_TOKEN=7") && out.output.contains("PATH="), "{}", out.output);
        let cwd = out.output.lines().find_map(|l| l.strip_prefix("cwd=")).unwrap().to_string();
        assert!(cwd.starts_with(root.path().to_str().unwrap()), "{cwd}");
        assert!(!std::path::Path::new(&cwd).exists(), "the directory is removed after the attempt");
        // keep_workdir keeps it.
        let Executor::Shell(mut spec) = shell("sh", &["-c", "pwd"]) else { unreachable!() };
        spec.keep_workdir = true;
        let mut r = req(Executor::Shell(spec), None);
        r.isolation = iso;
        let out = execute(&r, &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
        assert!(std::path::Path::new(out.output.trim()).is_dir(), "{}", out.output);
    }

    #[tokio::test]
    async fn limits_apply_to_the_job() {
        let Executor::Shell(mut spec) = shell("sh", &["-c", "ulimit -n; ulimit -v"]) else { unreachable!() };
        spec.limits = Some(gnomon_core::spec::Limits { open_files: Some(64), memory: Some("256MiB".into()), ..Default::default() });
        let out = execute(&req(Executor::Shell(spec), None), &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
        assert_eq!(out.output, "64\n262144\n", "{}", out.output);
        // Past its CPU time the job is killed (SIGXCPU), long before the timeout.
        let Executor::Shell(mut spec) = shell("sh", &["-c", "while :; do :; done"]) else { unreachable!() };
        spec.limits = Some(gnomon_core::spec::Limits { cpu_seconds: Some(1), ..Default::default() });
        let out = execute(
            &req(Executor::Shell(spec), Some(Duration::from_secs(120))),
            &reqwest::Client::new(),
            &HandlerRegistry::default(),
            never(),
        )
        .await;
        assert_eq!(out.state, AttemptState::Failed, "{}", out.output);
    }

    #[tokio::test]
    async fn run_as_drops_root() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("run_as_drops_root: not root here; nothing to drop");
            return;
        }
        let user = crate::isolation::RunAs::lookup("nobody").unwrap();
        let root = tempfile::tempdir().unwrap();
        let mut r = req(shell("sh", &["-c", "id -u; echo $HOME $USER; touch x && echo wrote"]), None);
        r.isolation = Arc::new(Isolation { work_root: Some(root.path().to_path_buf()), run_as: Some(user.clone()), cgroups: None });
        let out = execute(&r, &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
        assert_eq!(out.state, AttemptState::Succeeded, "{}", out.output);
        assert!(
            out.output.starts_with(&format!("{}\n", user.uid)) && out.output.contains("nobody") && out.output.contains("wrote"),
            "{}",
            out.output
        );
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_process_group() {
        let marker = std::env::temp_dir().join(format!("gnomon-pg-{}", rand_suffix()));
        let script = format!("sleep 60 & echo $! > {}; wait", marker.display());
        let out = execute(
            &req(shell("sh", &["-c", &script]), Some(Duration::from_millis(500))),
            &reqwest::Client::new(),
            &HandlerRegistry::default(),
            never(),
        )
        .await;
        assert_eq!(out.state, AttemptState::TimedOut);
        let pid: i32 = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
        let _ = std::fs::remove_file(&marker);
        // The grandchild `sleep 60` is gone too (allow a moment for reaping).
        assert!(gone(pid).await, "background child {pid} survived the timeout");
    }

    /// Waits (bounded) for `pid` to be gone; false if it is still alive.
    async fn gone(pid: i32) -> bool {
        for _ in 0..50 {
            // SAFETY: signal 0 only checks for existence.
            if unsafe { libc::kill(pid, 0) } != 0 || is_zombie(pid) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    #[tokio::test]
    async fn with_cgroups_nothing_an_attempt_started_outlives_it_even_outside_its_process_group() {
        let cgroups = match crate::cgroup::Cgroups::shared(crate::cgroup::Mode::Auto) {
            Ok(Some(c)) => c,
            other => {
                eprintln!("no usable cgroup v2 here ({other:?}); the setrlimit path is what runs");
                return;
            }
        };
        let root = tempfile::tempdir().unwrap();
        let marker = root.path().join("escaped");
        // `setsid` puts the sleeper in a session and group of its own: the
        // process-group kill cannot reach it; the cgroup's kill does.
        let script = format!("setsid sleep 300 > /dev/null 2>&1 & echo $! > {}; cat /proc/self/cgroup", marker.display());
        let mut r = req(shell("sh", &["-c", &script]), None);
        r.isolation = Arc::new(Isolation { work_root: Some(root.path().to_path_buf()), run_as: None, cgroups: Some(cgroups.clone()) });
        let out = execute(&r, &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
        assert_eq!(out.state, AttemptState::Succeeded, "{}", out.output);
        let rel = cgroups.base.file_name().unwrap().to_string_lossy().to_string();
        assert!(out.output.contains(&format!("/gnomon-jobs/{rel}/job1-1000-2-")), "the job ran in its attempt's cgroup: {}", out.output);
        let pid: i32 = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
        assert!(gone(pid).await, "the escaped process {pid} survived its attempt");
        // The attempt's cgroup is removed.
        let left: Vec<_> = std::fs::read_dir(&cgroups.base).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(!left.iter().any(|n| n.to_string_lossy().starts_with("job1-1000-2-")), "{left:?}");
    }

    fn is_zombie(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| s.contains(") Z ")).unwrap_or(true)
    }

    fn rand_suffix() -> String {
        format!("{}-{:?}", std::process::id(), std::time::SystemTime::now()).chars().filter(|c| c.is_ascii_alphanumeric()).collect()
    }

    #[tokio::test]
    async fn cancel_stops_shell() {
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            execute(&req(shell("sleep", &["60"]), None), &reqwest::Client::new(), &HandlerRegistry::default(), rx).await
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        tx.send(true).unwrap();
        let out = tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
        assert_eq!(out.state, AttemptState::Cancelled);
    }

    #[tokio::test]
    async fn missing_command_fails_cleanly() {
        let out =
            execute(&req(shell("/nonexistent/binary", &[]), None), &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
        assert_eq!(out.state, AttemptState::Failed);
        assert!(out.output.contains("cannot start"));
    }

    #[tokio::test]
    async fn http_sends_gnomon_headers_and_checks_status() {
        use axum::{http::HeaderMap, routing::any, Router};
        let app = Router::new()
            .route(
                "/ok",
                any(|h: HeaderMap| async move {
                    format!("run={} token={}", h["gnomon-run-id"].to_str().unwrap(), h["gnomon-fence-token"].to_str().unwrap())
                }),
            )
            .route("/teapot", any(|| async { (axum::http::StatusCode::IM_A_TEAPOT, "short and stout") }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let http = |path: &str, expect: Option<u16>| {
            Executor::Http(HttpSpec {
                method: "POST".into(),
                url: format!("http://{addr}{path}"),
                headers: Default::default(),
                body: Some("{}".into()),
                expect_status: expect,
            })
        };
        let client = reqwest::Client::new();
        let out = execute(&req(http("/ok", None), None), &client, &HandlerRegistry::default(), never()).await;
        assert_eq!((out.state, out.exit_code, out.output.as_str()), (AttemptState::Succeeded, Some(200), "run=job1-1000 token=7"));
        let out = execute(&req(http("/teapot", None), None), &client, &HandlerRegistry::default(), never()).await;
        assert_eq!((out.state, out.exit_code), (AttemptState::Failed, Some(418)));
        let out = execute(&req(http("/teapot", Some(418)), None), &client, &HandlerRegistry::default(), never()).await;
        assert_eq!(out.state, AttemptState::Succeeded);
    }

    fn with_params(mut r: ExecRequest) -> ExecRequest {
        r.params = Some(serde_json::from_value(serde_json::json!({"region": "eu west", "limit": 5, "opts": {"dry": true}})).unwrap());
        r
    }

    #[tokio::test]
    async fn a_shell_job_gets_its_params_in_the_environment_and_a_private_file() {
        let script = r#"echo "$GNOMON_PARAM_REGION|$GNOMON_PARAM_LIMIT|$GNOMON_PARAM_OPTS"; stat -c %a "$GNOMON_PARAMS_FILE"; cat "$GNOMON_PARAMS_FILE""#;
        let client = reqwest::Client::new();
        // In the fresh working directory, and beside a job's own `cwd`.
        for cwd in [None, Some(std::env::temp_dir().display().to_string())] {
            let Executor::Shell(mut spec) = shell("sh", &["-c", script]) else { unreachable!() };
            spec.cwd = cwd.clone();
            let out = execute(&with_params(req(Executor::Shell(spec), None)), &client, &HandlerRegistry::default(), never()).await;
            assert_eq!(out.state, AttemptState::Succeeded, "{cwd:?}: {}", out.output);
            let lines: Vec<&str> = out.output.lines().collect();
            assert_eq!(lines[0], r#"eu west|5|{"dry":true}"#, "{cwd:?}");
            assert_eq!(lines[1], "600", "the params file is the job's alone");
            assert_eq!(lines[2], r#"{"limit":5,"opts":{"dry":true},"region":"eu west"}"#);
        }
        let out =
            execute(&req(shell("sh", &["-c", "echo ${GNOMON_PARAMS_FILE:-none}"]), None), &client, &HandlerRegistry::default(), never())
                .await;
        assert_eq!(out.output.trim(), "none", "a run without params has no params file");
    }

    /// A body-less POST job to a loopback server that answers with the
    /// request's content type and body.
    async fn echo_server() -> HttpSpec {
        use axum::{http::HeaderMap, routing::any, Router};
        let app = Router::new()
            .route("/p", any(|h: HeaderMap, body: String| async move { format!("{} {body}", h["content-type"].to_str().unwrap_or("")) }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        HttpSpec { method: "POST".into(), url: format!("http://{addr}/p"), headers: Default::default(), body: None, expect_status: None }
    }

    #[tokio::test]
    async fn an_http_job_without_a_body_is_sent_its_params_and_a_handler_sees_them() {
        let spec = echo_server().await;
        let out =
            execute(&with_params(req(Executor::Http(spec), None)), &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
        assert_eq!(out.output, r#"application/json {"limit":5,"opts":{"dry":true},"region":"eu west"}"#);

        struct Params;
        #[async_trait::async_trait]
        impl Handler for Params {
            async fn call(&self, ctx: HandlerContext, _: serde_json::Value) -> Result<String, String> {
                Ok(serde_json::to_string(&ctx.params).unwrap())
            }
        }
        let mut reg = HandlerRegistry::default();
        reg.register("params", Arc::new(Params));
        let h = Executor::Handler(HandlerSpec { name: "params".into(), payload: serde_json::Value::Null });
        let out = execute(&with_params(req(h, None)), &reqwest::Client::new(), &reg, never()).await;
        assert_eq!(out.output, r#"{"limit":5,"opts":{"dry":true},"region":"eu west"}"#);
    }

    #[tokio::test]
    async fn handlers_and_unknown_handler() {
        let reg = HandlerRegistry::with_builtins();
        let h = |name: &str| Executor::Handler(HandlerSpec { name: name.into(), payload: serde_json::json!({"a": 1}) });
        let out = execute(&req(h("echo"), None), &reqwest::Client::new(), &reg, never()).await;
        assert_eq!((out.state, out.output.as_str()), (AttemptState::Succeeded, r#"{"a":1}"#));
        let out = execute(&req(h("missing"), None), &reqwest::Client::new(), &reg, never()).await;
        assert_eq!(out.state, AttemptState::Failed);
        assert!(out.output.contains("no handler named"));
    }

    #[tokio::test]
    async fn a_webhook_payload_reaches_shell_http_and_handler_jobs() {
        let payload = "{\"ref\":\"main\",\"note\":\"caf\u{e9}\"}";
        let with_payload = |mut r: ExecRequest| {
            r.payload = Some(payload.to_string());
            r
        };
        let client = reqwest::Client::new();
        let script = r#"stat -c %a "$GNOMON_PAYLOAD_FILE"; cat "$GNOMON_PAYLOAD_FILE"; echo; echo "${GNOMON_PARAMS_FILE:-no params}""#;
        for cwd in [None, Some(std::env::temp_dir().display().to_string())] {
            let Executor::Shell(mut spec) = shell("sh", &["-c", script]) else { unreachable!() };
            spec.cwd = cwd.clone();
            let out = execute(&with_payload(req(Executor::Shell(spec), None)), &client, &HandlerRegistry::default(), never()).await;
            assert_eq!(out.state, AttemptState::Succeeded, "{cwd:?}: {}", out.output);
            let lines: Vec<&str> = out.output.lines().collect();
            assert_eq!(lines, ["600", payload, "no params"], "{cwd:?}");
        }
        let out =
            execute(&req(shell("sh", &["-c", "echo ${GNOMON_PAYLOAD_FILE:-none}"]), None), &client, &HandlerRegistry::default(), never())
                .await;
        assert_eq!(out.output.trim(), "none", "a run without a payload has no payload file");

        let spec = echo_server().await;
        // The payload wins over the params for the body; text that is not
        // JSON goes as text.
        let out =
            execute(&with_payload(with_params(req(Executor::Http(spec.clone()), None))), &client, &HandlerRegistry::default(), never())
                .await;
        assert_eq!(out.output, format!("application/json {payload}"));
        let mut text = req(Executor::Http(spec), None);
        text.payload = Some("plain words".into());
        let out = execute(&text, &client, &HandlerRegistry::default(), never()).await;
        assert_eq!(out.output, "text/plain; charset=utf-8 plain words");

        struct Echo;
        #[async_trait::async_trait]
        impl Handler for Echo {
            async fn call(&self, ctx: HandlerContext, own: serde_json::Value) -> Result<String, String> {
                Ok(format!("{} {own}", ctx.run_payload.unwrap_or_default()))
            }
        }
        let mut reg = HandlerRegistry::default();
        reg.register("echo", Arc::new(Echo));
        let h = Executor::Handler(HandlerSpec { name: "echo".into(), payload: serde_json::json!({"own": 1}) });
        let out = execute(&with_payload(req(h, None)), &client, &reg, never()).await;
        assert_eq!(out.output, format!("{payload} {{\"own\":1}}"));
    }
}
