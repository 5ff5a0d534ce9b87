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
    /// Every namespace with open runs or running backfills, by name.
    pub namespaces: BTreeMap<String, NamespaceUsage>,
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
        self.engine.cache.runs.release_kept(self.engine.now);
        let capacity = self.engine.sessions.capacity();
        let pending = self.engine.cache.runs.ready_len();
        let (before, after) = self.engine.admission.update(self.engine.cache.runs.ns_tally(), self.engine.free_slots(), capacity);
        let max_pending = self.engine.admission.pressure().config.max_pending;
        if after != before {
            if after == Pressure::Red || before == Pressure::Red {
                tracing::warn!(from = before.as_str(), to = after.as_str(), pending, max_pending, "backpressure changed");
            } else {
                tracing::info!(from = before.as_str(), to = after.as_str(), pending, max_pending, "backpressure changed");
            }
        }
        metrics::gauge!("gnomon_backpressure_state").set(after.level());
        metrics::gauge!("gnomon_pending_runs").set(pending as f64);
        let namespaces = self.engine.namespace_usage();
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        view.pressure = Some(PressureInfo { state: after, pending, max_pending });
        for gone in view.namespaces.keys().filter(|ns| !namespaces.contains_key(*ns)) {
            usage_metrics(&NamespaceUsage { namespace: gone.clone(), ..NamespaceUsage::empty(self.engine.admission.quota(gone)) });
        }
        for usage in namespaces.values().filter(|u| view.namespaces.get(&u.namespace) != Some(*u)) {
            usage_metrics(usage);
        }
        view.namespaces = namespaces;
    }

    pub(super) fn publish_view(&mut self) {
        // Both flags are taken: either says the view is out of date.
        let sessions_changed = self.engine.sessions.take_dirty() | self.engine.cache.runs.take_holds_changed();
        let notes = self.engine.notes.take();
        if notes.is_none() && !sessions_changed {
            return;
        }
        let list = worker_infos(&self.engine.sessions, &self.engine.cache.runs);
        metrics::gauge!("gnomon_workers", "state" => "live").set(list.iter().filter(|w| w.connected).count() as f64);
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        view.workers = list;
        if let Some(waiting) = notes {
            view.waiting = waiting;
        }
    }
}

/// Sets a namespace's gauges.
fn usage_metrics(u: &NamespaceUsage) {
    let ns = u.namespace.clone();
    metrics::gauge!("gnomon_namespace_open_runs", "namespace" => ns.clone()).set(u.open_runs as f64);
    metrics::gauge!("gnomon_namespace_open_bytes", "namespace" => ns.clone()).set(u.runs.bytes as f64);
    metrics::gauge!("gnomon_namespace_backlog", "namespace" => ns.clone()).set(u.runs.backlog() as f64);
    metrics::gauge!("gnomon_namespace_backfills", "namespace" => ns.clone()).set(u.backfills as f64);
    metrics::gauge!("gnomon_namespace_backpressure_state", "namespace" => ns.clone()).set(u.pressure.level());
    for q in gnomon_core::quota::QuotaName::ALL {
        metrics::gauge!("gnomon_namespace_quota", "namespace" => ns.clone(), "quota" => q.as_str()).set(u.quota.limit(q) as f64);
    }
}

/// The sessions as `GET /v1/workers` shows them, by worker id.
fn worker_infos(sessions: &Sessions, runs: &RunBook) -> Vec<WorkerInfo> {
    let sorted = |set: &HashSet<String>| {
        let mut v: Vec<String> = set.iter().cloned().collect();
        v.sort();
        v
    };
    let mut list: Vec<WorkerInfo> = sessions
        .iter()
        .map(|(id, s)| WorkerInfo {
            id: id.clone(),
            session: s.session_id.clone(),
            labels: s.labels.clone(),
            namespaces: s.namespaces.as_ref().map(|n| n.to_vec()),
            capacity: s.capacity,
            prefetch: s.prefetch,
            running: runs.held_by(id),
            load: runs.held_by(id) as f64 / s.capacity.max(1) as f64,
            executors: sorted(&s.executors),
            handlers: sorted(&s.handlers),
            connected: s.stream != Stream::Down,
            draining: s.draining,
            lease_expires_at: s.lease_until,
        })
        .collect();
    list.sort_by(|a, b| a.id.cmp(&b.id));
    list
}
