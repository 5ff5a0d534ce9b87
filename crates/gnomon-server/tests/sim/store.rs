//! A store that fails on purpose: it wraps a real store and, from a seeded
//! RNG, fails calls before they reach it, fails them after they committed
//! (the caller cannot tell: an unknown outcome), and makes them slow (the
//! simulated clock moves on while they run). It also checks that no leader
//! write under a stale token is ever accepted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use gnomon_backend::*;
use gnomon_core::spec::JobSpec;
use gnomon_core::{ManualClock, Millis};
use rand::rngs::StdRng;
use rand::Rng;

/// How often each fault strikes while faults are on.
#[derive(Debug, Clone, Copy)]
pub struct FaultRates {
    /// A leader write fails before it reaches the store.
    pub write_before: f64,
    /// A leader write commits, then the caller is told it failed.
    pub write_after: f64,
    /// A read fails.
    pub read: f64,
    /// A call takes up to `max_delay_ms` of simulated time.
    pub delay: f64,
    pub max_delay_ms: i64,
}

#[derive(Debug)]
struct State {
    rng: StdRng,
    on: bool,
    /// Set by hand: every leader write fails before (`Before`) or after
    /// (`After`) it reaches the store, for the next `forced.1` writes.
    forced: (Fault, u32),
    rates: FaultRates,
    violations: Vec<String>,
    injected: u64,
    /// Turn writes still to be answered short (one outcome missing).
    short: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    Before,
    After,
}

#[derive(Debug, Clone)]
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    clock: ManualClock,
    state: Arc<Mutex<State>>,
    /// The newest token the simulation installed with `fence`.
    current: Arc<AtomicU64>,
    /// Fenced writes asked of the store (failed ones included).
    writes: Arc<AtomicU64>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>, clock: ManualClock, rng: StdRng, rates: FaultRates) -> Self {
        let state = State { rng, on: true, forced: (Fault::None, 0), rates, violations: Vec::new(), injected: 0, short: 0 };
        Self { inner, clock, state: Arc::new(Mutex::new(state)), current: Arc::default(), writes: Arc::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many fenced writes were asked of the store so far.
    #[allow(dead_code)] // tests/leader.rs
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    pub fn set_faults(&self, on: bool) {
        self.lock().on = on;
    }

    /// The next `n` leader writes fail before they reach the store.
    #[allow(dead_code)] // tests/leader.rs
    pub fn fail_next_writes(&self, n: u32) {
        self.lock().forced = (Fault::Before, n);
    }

    /// The next `n` leader writes commit, and then the caller is told they
    /// failed (the outcome it sees is unknown).
    #[allow(dead_code)] // tests/leader.rs
    pub fn fail_next_writes_after_commit(&self, n: u32) {
        self.lock().forced = (Fault::After, n);
    }

    /// The next `n` turn writes commit, and their answer lacks its last
    /// outcome (a store that answered for other rows than it was asked).
    #[allow(dead_code)] // tests/leader.rs
    pub fn answer_next_turns_short(&self, n: u32) {
        self.lock().short = n;
    }

    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    /// Decides this call's fault, and advances the clock for a slow call.
    fn decide(&self, write: bool) -> Fault {
        let mut s = self.lock();
        if write && s.forced.1 > 0 {
            s.forced.1 -= 1;
            s.injected += 1;
            return s.forced.0;
        }
        if !s.on {
            return Fault::None;
        }
        let r = s.rates;
        if s.rng.gen_bool(r.delay) {
            let d = s.rng.gen_range(1..=r.max_delay_ms);
            self.clock.advance(d);
        }
        let fault = if write {
            if s.rng.gen_bool(r.write_before) {
                Fault::Before
            } else if s.rng.gen_bool(r.write_after) {
                Fault::After
            } else {
                Fault::None
            }
        } else if s.rng.gen_bool(r.read) {
            Fault::Before
        } else {
            Fault::None
        };
        if fault != Fault::None {
            s.injected += 1;
        }
        fault
    }

    fn read_fault(&self) -> Result<(), StoreError> {
        match self.decide(false) {
            Fault::None => Ok(()),
            _ => Err(StoreError::Unavailable("injected: read failed".into())),
        }
    }

    /// A leader write: the fault, the call, and the stale-token check.
    /// A call that creates nothing issues no write: a keyed run (a key's
    /// or a webhook call's) the store holds already must not be written
    /// again by the leader that holds the fence (its repeat read the store
    /// first). A deposed leader's write is fenced, and checked there.
    async fn no_write_for_nothing(&self, fence: &Fence, runs: &[NewRun]) {
        if fence.token < self.current.load(Ordering::SeqCst) {
            return;
        }
        for run in runs.iter().filter(|r| r.key.is_some() && r.upstream.is_none()) {
            if let Ok(Some(_)) = self.inner.get_run(&run.id()).await {
                self.lock().violations.push(format!("a write for a call that created nothing: keyed run {} exists", run.id()));
            }
        }
    }

    async fn write<T, F>(&self, fence: &Fence, call: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        self.writes.fetch_add(1, Ordering::SeqCst);
        let fault = self.decide(true);
        if fault == Fault::Before {
            return Err(StoreError::Unavailable("injected: failed before the store".into()));
        }
        let result = call.await;
        if result.is_ok() {
            let current = self.current.load(Ordering::SeqCst);
            if fence.token < current {
                self.lock().violations.push(format!("a write under stale token {} was accepted (current {current})", fence.token));
            }
        }
        match fault {
            Fault::After if !matches!(result, Err(StoreError::Fenced { .. })) => {
                Err(StoreError::Unavailable("injected: connection lost during commit (outcome unknown)".into()))
            }
            _ => result,
        }
    }
}

#[async_trait]
impl JobStore for FaultyStore {
    async fn put_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError> {
        self.inner.put_job(spec, precondition, now).await
    }

    async fn set_job_paused(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError> {
        self.inner.set_job_paused(namespace, name, paused, now).await
    }

    async fn delete_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError> {
        self.inner.delete_job(namespace, name, precondition).await
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
        self.read_fault()?;
        self.inner.get_job(namespace, name).await
    }

    async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>, StoreError> {
        self.inner.list_jobs(namespace).await
    }

    async fn job_changes(&self, since: u64) -> Result<JobChanges, StoreError> {
        self.read_fault()?;
        self.inner.job_changes(since).await
    }

    async fn job_heads(&self) -> Result<JobHeads, StoreError> {
        self.read_fault()?;
        self.inner.job_heads().await
    }

    async fn jobs_by_uid(&self, uids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
        self.read_fault()?;
        self.inner.jobs_by_uid(uids).await
    }
}

#[async_trait]
impl LeadershipStore for FaultyStore {
    async fn next_epoch(&self, scope: &str) -> Result<u64, StoreError> {
        self.inner.next_epoch(scope).await
    }

    async fn fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError> {
        self.inner.fence(fence, holder, now).await?;
        self.current.fetch_max(fence.token, Ordering::SeqCst);
        Ok(())
    }

    async fn leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError> {
        self.inner.leadership(scope).await
    }

    async fn advance_leader_time(&self, fence: &Fence, at: Millis) -> Result<Millis, StoreError> {
        self.write(fence, self.inner.advance_leader_time(fence, at)).await
    }
}

#[async_trait]
impl LeaderWrites for FaultyStore {
    async fn fire(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
        self.no_write_for_nothing(fence, runs).await;
        self.write(fence, self.inner.fire(fence, runs, advances)).await
    }

    async fn transition(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
        self.write(fence, self.inner.transition(fence, transitions)).await
    }

    async fn write_turn(&self, fence: &Fence, batch: &TurnBatch) -> Result<TurnWrite, StoreError> {
        self.no_write_for_nothing(fence, &batch.runs).await;
        let mut answer = self.write(fence, self.inner.write_turn(fence, batch)).await;
        if let Ok(w) = answer.as_mut() {
            let mut s = self.lock();
            if s.short > 0 {
                s.short -= 1;
                s.injected += 1;
                match w.applied.as_mut() {
                    Ok(applied) if !applied.is_empty() => drop(applied.pop()),
                    _ => drop(w.fired.pop()),
                }
            }
        }
        answer
    }
}

#[async_trait]
impl RunStore for FaultyStore {
    async fn request_cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
        self.inner.request_cancel(run_id, now).await
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError> {
        self.read_fault()?;
        self.inner.get_run(run_id).await
    }

    async fn list_runs(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError> {
        self.inner.list_runs(filter, limit, cursor).await
    }

    async fn open_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.read_fault()?;
        self.inner.open_runs().await
    }

    async fn cancel_requests(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.read_fault()?;
        self.inner.cancel_requests().await
    }

    async fn live_attempts(&self) -> Result<Vec<LiveAttempt>, StoreError> {
        self.read_fault()?;
        self.inner.live_attempts().await
    }

    async fn kept_keyed_runs(&self, since: Millis) -> Result<Vec<KeptRun>, StoreError> {
        self.read_fault()?;
        self.inner.kept_keyed_runs(since).await
    }
}

#[async_trait]
impl NotificationStore for FaultyStore {
    async fn due_notifications(&self, now: Millis, limit: u32) -> Result<Vec<Notification>, StoreError> {
        self.read_fault()?;
        self.inner.due_notifications(now, limit).await
    }

    async fn settle_notification(&self, fence: &Fence, delivery: &Delivery) -> Result<bool, StoreError> {
        self.write(fence, self.inner.settle_notification(fence, delivery)).await
    }

    async fn run_notifications(&self, run_id: &str) -> Result<Vec<Notification>, StoreError> {
        self.inner.run_notifications(run_id).await
    }
}

#[async_trait]
impl RetentionStore for FaultyStore {}

#[async_trait]
impl BackfillStore for FaultyStore {
    async fn create_backfill(&self, b: &NewBackfill, now: Millis) -> Result<BackfillRecord, StoreError> {
        self.inner.create_backfill(b, now).await
    }

    async fn get_backfill(&self, id: &str) -> Result<Option<BackfillRecord>, StoreError> {
        self.read_fault()?;
        self.inner.get_backfill(id).await
    }

    async fn list_backfills(&self, namespace: Option<&str>) -> Result<Vec<BackfillRecord>, StoreError> {
        self.inner.list_backfills(namespace).await
    }

    async fn cancel_backfill(&self, id: &str, now: Millis) -> Result<BackfillRecord, StoreError> {
        self.inner.cancel_backfill(id, now).await
    }

    async fn running_backfills(&self) -> Result<Vec<BackfillRecord>, StoreError> {
        self.read_fault()?;
        self.inner.running_backfills().await
    }

    async fn advance_backfill(&self, fence: &Fence, progress: &BackfillProgress) -> Result<bool, StoreError> {
        self.write(fence, self.inner.advance_backfill(fence, progress)).await
    }
}

#[async_trait]
impl WorkerStore for FaultyStore {
    async fn bind_worker(&self, worker: &str, credential: &str, now: Millis) -> Result<String, StoreError> {
        self.inner.bind_worker(worker, credential, now).await
    }

    async fn unbind_worker(&self, worker: &str) -> Result<bool, StoreError> {
        self.inner.unbind_worker(worker).await
    }

    async fn worker_owner(&self, worker: &str) -> Result<Option<String>, StoreError> {
        self.inner.worker_owner(worker).await
    }
}

#[async_trait]
impl StoreProbes for FaultyStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
}
