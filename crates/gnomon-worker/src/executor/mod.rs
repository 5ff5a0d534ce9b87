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
mod tests;
