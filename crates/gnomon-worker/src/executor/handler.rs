//! Handlers: named Rust functions that `handler` jobs run, with what an
//! attempt hands them (its ids, params, fence, cancellation, a log) and
//! how they end it (output, or an error that may steer the retry).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gnomon_core::outcome::RetryHint;
use gnomon_core::Millis;
use tokio::sync::watch;

use crate::live::LiveSink;
use crate::tail::OutputTail;

/// What identifies an attempt to fenced writes (the `gnomon-fence` crate).
pub use gnomon_core::fence::Fence;

/// Context handed to a handler.
#[derive(Debug, Clone)]
pub struct HandlerContext {
    pub run_id: String,
    pub attempt: u32,
    pub job: String,
    pub namespace: String,
    pub scheduled_at: Millis,
    pub token: u64,
    /// The values of the run's params (empty for a job without params).
    pub params: gnomon_core::params::Params,
    /// The body of the webhook call that started the run; `None` for other
    /// runs. (The job's own `payload` is the handler's second argument.)
    pub run_payload: Option<String>,
    /// Turns `true` when the attempt is to stop (cancelled, timed out,
    /// superseded, or the worker fenced itself). A handler that does not
    /// return is dropped at that point, at its next `.await`.
    pub cancelled: watch::Receiver<bool>,
    /// Lines written here become the attempt's output (before what the
    /// handler returns) and are streamed live while it runs.
    pub log: HandlerLog,
}

impl HandlerContext {
    /// The attempt's fence, for the fenced-write helpers.
    pub fn fence(&self) -> Fence {
        Fence { run_id: self.run_id.clone(), attempt: self.attempt, token: self.token }
    }

    /// Whether the attempt is to stop.
    pub fn is_cancelled(&self) -> bool {
        *self.cancelled.borrow()
    }
}

/// A handler's log: kept (the last 64 KiB) for the attempt's output and
/// streamed live. Writing never waits.
#[derive(Clone, Default)]
pub struct HandlerLog {
    tail: Arc<Mutex<OutputTail>>,
    live: Option<LiveSink>,
}

impl std::fmt::Debug for HandlerLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandlerLog")
    }
}

impl HandlerLog {
    pub(crate) fn new(live: Option<LiveSink>) -> Self {
        Self { tail: Arc::default(), live }
    }

    /// Writes one line (a newline is added).
    pub fn line(&self, text: impl AsRef<str>) {
        let mut bytes = text.as_ref().as_bytes().to_vec();
        bytes.push(b'\n');
        self.tail.lock().unwrap_or_else(|p| p.into_inner()).push(&bytes);
        if let Some(live) = &self.live {
            live.push(&bytes);
        }
    }

    /// The attempt's output: the lines logged, then `returned`, bounded to
    /// the last 64 KiB.
    pub(crate) fn output_with(&self, returned: &str) -> String {
        let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner()).clone();
        tail.push(returned.as_bytes());
        // The live stream ends with it too.
        if let Some(live) = &self.live {
            live.push(returned.as_bytes());
        }
        tail.into_string()
    }
}

/// How a handler's attempt failed: the message becomes its output, and
/// `retry` may ask that the run not be retried, or be retried later than
/// its backoff says. Any `String` or `&str` converts into one that leaves
/// the retry to the job's policy, so `?` works on string errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    pub message: String,
    pub retry: RetryHint,
}

impl HandlerError {
    /// A failure the run's retry policy handles.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), retry: RetryHint::Policy }
    }

    /// A failure that ends the run: retrying cannot help (bad input, say).
    pub fn non_retryable(message: impl Into<String>) -> Self {
        Self { message: message.into(), retry: RetryHint::Never }
    }

    /// A failure to retry no sooner than `after` (a rate limit, say), in
    /// place of the job's backoff; the job's `max_attempts` still bounds
    /// the attempts, and the delay is capped at a day.
    pub fn retry_after(after: Duration, message: impl Into<String>) -> Self {
        let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX).max(1);
        Self { message: message.into(), retry: RetryHint::After(ms.min(gnomon_core::outcome::MAX_RETRY_AFTER_MS)) }
    }
}

impl From<String> for HandlerError {
    fn from(message: String) -> Self {
        Self::new(message)
    }
}

impl From<&str> for HandlerError {
    fn from(message: &str) -> Self {
        Self::new(message)
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A named handler (`{"handler":{"name":…,"payload":…}}` jobs). `Ok` output
/// means success; `Err` means the attempt failed (see [`HandlerError`]).
#[async_trait::async_trait]
pub trait Handler: Send + Sync {
    async fn call(&self, ctx: HandlerContext, payload: serde_json::Value) -> Result<String, HandlerError>;
}

#[derive(Clone, Default)]
pub struct HandlerRegistry {
    pub(super) handlers: HashMap<String, Arc<dyn Handler>>,
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
    async fn call(&self, _: HandlerContext, _: serde_json::Value) -> Result<String, HandlerError> {
        Ok(String::new())
    }
}
struct Echo;
#[async_trait::async_trait]
impl Handler for Echo {
    async fn call(&self, _: HandlerContext, payload: serde_json::Value) -> Result<String, HandlerError> {
        Ok(payload.to_string())
    }
}
