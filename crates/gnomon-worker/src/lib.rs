//! gnomon-worker: executes attempts.
//!
//! [`execute`] runs one attempt with the `shell`, `http` or `handler`
//! executor and always returns an [`ExecOutcome`]; it never panics on job
//! input. [`LocalWorker`] is the worker runtime: it takes [`Assign`]s and
//! [`Cancel`]s and answers with [`WorkerEvent`]s, the same message shapes the
//! remote worker protocol carries.

pub mod executor;
pub mod session;
mod tail;

pub use executor::{execute, ExecOutcome, ExecRequest, Handler, HandlerContext, HandlerRegistry};
pub use session::{WorkerConfig, WorkerRuntime};
pub use tail::{OutputTail, MAX_OUTPUT_BYTES};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gnomon_core::Millis;
use tokio::sync::{mpsc, watch};

/// An attempt handed to a worker (persisted by the leader before it is sent).
#[derive(Debug, Clone)]
pub struct Assign {
    pub request: ExecRequest,
}

/// Stop a live attempt (its process group is killed).
#[derive(Debug, Clone)]
pub struct Cancel {
    pub run_id: String,
    pub attempt: u32,
}

#[derive(Debug, Clone)]
pub enum WorkerEvent {
    Started { run_id: String, attempt: u32, at: Millis },
    Finished { run_id: String, attempt: u32, outcome: ExecOutcome, at: Millis },
}

/// Cancel switches of the attempts running now, by `(run, attempt)`.
type LiveAttempts = HashMap<(String, u32), watch::Sender<bool>>;

/// An in-process worker session: executes assignments concurrently and
/// reports on `events`.
#[derive(Debug, Clone)]
pub struct LocalWorker {
    pub id: String,
    handlers: HandlerRegistry,
    http: reqwest::Client,
    live: Arc<Mutex<LiveAttempts>>,
    events: mpsc::UnboundedSender<WorkerEvent>,
}

fn now_ms() -> Millis {
    chrono::Utc::now().timestamp_millis()
}

impl LocalWorker {
    pub fn new(id: impl Into<String>, handlers: HandlerRegistry, events: mpsc::UnboundedSender<WorkerEvent>) -> Self {
        Self { id: id.into(), handlers, http: reqwest::Client::new(), live: Arc::default(), events }
    }

    /// Starts the attempt in the background.
    pub fn assign(&self, assign: Assign) {
        let (cancel_tx, cancel_rx) = watch::channel(false);
        let key = (assign.request.run_id.clone(), assign.request.attempt);
        self.live.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), cancel_tx);
        let worker = self.clone();
        tokio::spawn(async move {
            let _ = worker.events.send(WorkerEvent::Started { run_id: key.0.clone(), attempt: key.1, at: now_ms() });
            let outcome = execute(&assign.request, &worker.http, &worker.handlers, cancel_rx).await;
            worker.live.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
            let _ = worker.events.send(WorkerEvent::Finished { run_id: key.0, attempt: key.1, outcome, at: now_ms() });
        });
    }

    /// Cancels a live attempt; unknown attempts are ignored.
    pub fn cancel(&self, cancel: &Cancel) -> bool {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        match live.get(&(cancel.run_id.clone(), cancel.attempt)) {
            Some(tx) => tx.send(true).is_ok(),
            None => false,
        }
    }

    pub fn running(&self) -> usize {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
