use super::*;

/// The backpressure state as `/v1/leader` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PressureInfo {
    pub state: Pressure,
    pub pending: usize,
    pub max_pending: usize,
}

/// What the leader publishes for the API.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub workers: Vec<WorkerInfo>,
    pub pressure: Option<PressureInfo>,
    /// Why runs of a job are waiting in `pending`, by job uid.
    pub waiting: HashMap<String, String>,
}

/// One worker session as `GET /v1/workers` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerInfo {
    pub id: String,
    pub session: String,
    pub labels: BTreeMap<String, String>,
    /// The namespaces whose runs it may be given (`None`: all).
    pub namespaces: Option<Vec<String>>,
    pub capacity: usize,
    /// Assignments it queues beyond its capacity.
    pub prefetch: usize,
    /// Attempts it holds now (executing or queued).
    pub running: usize,
    pub load: f64,
    pub executors: Vec<String>,
    pub handlers: Vec<String>,
    pub connected: bool,
    pub draining: bool,
    pub lease_expires_at: Millis,
}

impl LeaderRuntime {
    pub(super) fn update_pressure(&mut self) {
        let before = self.pressure.state();
        let capacity = self.sessions.capacity();
        let pending = self.cache.runs.ready_len();
        let after = self.pressure.update(pending, self.free_slots(), capacity);
        if after != before {
            let max_pending = self.pressure.config.max_pending;
            if after == Pressure::Red || before == Pressure::Red {
                tracing::warn!(from = before.as_str(), to = after.as_str(), pending, max_pending, "backpressure changed");
            } else {
                tracing::info!(from = before.as_str(), to = after.as_str(), pending, max_pending, "backpressure changed");
            }
        }
        metrics::gauge!("gnomon_backpressure_state").set(after.level());
        metrics::gauge!("gnomon_pending_runs").set(pending as f64);
        self.view.write().unwrap_or_else(|p| p.into_inner()).pressure =
            Some(PressureInfo { state: after, pending, max_pending: self.pressure.config.max_pending });
    }

    pub(super) fn publish_view(&mut self) {
        // Both flags are taken: either says the view is out of date.
        let sessions_changed = self.sessions.take_dirty();
        if !std::mem::take(&mut self.view_dirty) && !sessions_changed {
            return;
        }
        let list = self.sessions.infos();
        metrics::gauge!("gnomon_workers", "state" => "live").set(list.iter().filter(|w| w.connected).count() as f64);
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        view.workers = list;
        view.waiting = self.cache.waiting.clone();
    }
}
