//! The executors: `shell` (argv, process group, bounded output), `http`
//! (reqwest with rustls) and named `handler`s registered by library users.

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
use crate::tail::OutputTail;

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
    /// Where the attempt's output also goes as it is written (streamed to
    /// the leader); `None`: only kept for the report.
    pub live: Option<crate::live::LiveSink>,
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

mod handler;
pub use handler::{Fence, Handler, HandlerContext, HandlerError, HandlerLog, HandlerRegistry};

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
                let log = HandlerLog::new(req.live.clone());
                let ctx = HandlerContext {
                    run_id: req.run_id.clone(),
                    attempt: req.attempt,
                    job: req.job.clone(),
                    namespace: req.namespace.clone(),
                    scheduled_at: req.scheduled_at,
                    token: req.token,
                    params: req.params.clone().unwrap_or_default(),
                    run_payload: req.payload.clone(),
                    cancelled: cancel.clone(),
                    log: log.clone(),
                };
                let handler = handler.clone();
                let payload = h.payload.clone();
                let stopped = cancel.clone();
                let mut outcome = bounded(req.timeout, cancel, async move {
                    match handler.call(ctx, payload).await {
                        Ok(out) => ExecOutcome::ended(AttemptState::Succeeded, out),
                        Err(e) => ExecOutcome { retry: e.retry, ..ExecOutcome::failed(e.message) },
                    }
                })
                .await;
                // A handler that returns once told to stop was stopped:
                // what it returns does not make the attempt a success.
                if *stopped.borrow() && outcome.state != AttemptState::TimedOut {
                    outcome.state = AttemptState::Cancelled;
                    outcome.retry = Default::default();
                }
                outcome.output = log.output_with(&outcome.output);
                outcome
            }
        },
    }
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
        _ = sleep_opt(timeout) => ExecOutcome::ended(AttemptState::TimedOut, format!("timed out after {}", gnomon_core::duration::format_duration(timeout.unwrap_or_default()))),
        _ = wait_cancel(cancel) => ExecOutcome::ended(AttemptState::Cancelled, "cancelled"),
    }
}

#[cfg(test)]
mod tests;
