//! What one turn plans: [`TurnPlan`], everything the turn decided, kept
//! by the part that decided it (its asks are the runtime's type `A`); the
//! runtime writes it in one fenced write and applies what committed.

use crate::dispatch::DispatchPlan;
use crate::inbox::WorkerEvent;
use crate::runbook::RunId;
use crate::HashMap;
use crate::HashSet;
use gnomon_core::Millis;
use gnomon_records::BackfillProgress;
use gnomon_records::BackfillRecord;
use gnomon_records::JobAdvance;
use gnomon_records::NewRun;
use gnomon_records::Transition;

/// One chunk of due jobs, planned and not yet written.
pub struct FirePlan {
    pub new_runs: Vec<NewRun>,
    pub advances: Vec<JobAdvance>,
    /// Per job: (uid, last scheduled time fired, more due, the previous
    /// version's instants).
    pub plans: Vec<(String, Option<Millis>, bool, bool)>,
    pub now: Millis,
    /// When the write began (each run's `fired_at`).
    pub stamp: Millis,
    /// Pending runs tracked ahead of the write.
    pub tracked: Vec<RunId>,
    /// `replace` jobs whose runs before the given instant are cancelled
    /// once this fire is written.
    pub replace: Vec<(String, Millis)>,
}

/// One chunk of one backfill, planned.
pub struct BackfillStep {
    pub record: BackfillRecord,
    /// The chunk's runs: its own instants first (`roots` of them), then
    /// their dependency runs.
    pub runs: Vec<NewRun>,
    pub roots: usize,
    /// Its cursor moved past the chunk (counts as of before it: the write
    /// adds the chunk's outcomes).
    pub progress: BackfillProgress,
    /// When its next chunk is due.
    pub next_at: Millis,
}

/// What one turn writes, by the part of the leader that planned it.
pub struct TurnPlan<A> {
    /// One chunk of due jobs (its pending runs are tracked ahead, so this
    /// turn's dispatch may place them).
    pub fire: Option<FirePlan>,
    pub asks: Vec<A>,
    pub backfills: Vec<BackfillStep>,
    /// Attempts ended by the leader (leases expired, unheld, overrun,
    /// never reclaimed).
    pub ends: Vec<Transition>,
    /// (worker, run, attempt, reason): told once the ends are written.
    pub aborts: Vec<(String, String, u32, String)>,
    /// `replace`: runs cancelled because a newer run replaced them…
    pub cancels: Vec<Transition>,
    /// …and live attempts their workers are told to cancel (run, attempt),
    /// once the write is done.
    pub cancel_sends: Vec<(String, u32)>,
    pub retries: Vec<Transition>,
    /// Waiting runs decided.
    pub releases: Vec<Transition>,
    pub events: EventBatch,
    pub dispatch: DispatchPlan,
    /// Dependency runs planned this turn (an upstream's second root
    /// makes none again).
    pub seen: HashSet<String>,
    /// Keyed runs planned this turn.
    keys: HashSet<String>,
    /// Open runs planned per namespace, counted by admission.
    runs_by_ns: HashMap<String, u64>,
    /// The params and payload bytes of the runs asks planned, per namespace.
    bytes_by_ns: HashMap<String, u64>,
    /// Backfills planned per namespace, and their instants.
    backfills_by_ns: HashMap<String, (u64, u64)>,
}

impl<A> Default for TurnPlan<A> {
    fn default() -> Self {
        TurnPlan {
            fire: None,
            asks: Vec::new(),
            backfills: Vec::new(),
            ends: Vec::new(),
            aborts: Vec::new(),
            cancels: Vec::new(),
            cancel_sends: Vec::new(),
            retries: Vec::new(),
            releases: Vec::new(),
            events: EventBatch::default(),
            dispatch: DispatchPlan::default(),
            seen: HashSet::default(),
            keys: HashSet::default(),
            runs_by_ns: HashMap::default(),
            bytes_by_ns: HashMap::default(),
            backfills_by_ns: HashMap::default(),
        }
    }
}

impl<A> TurnPlan<A> {
    pub fn ask(&mut self, ask: A) {
        self.asks.push(ask);
    }

    /// Claims a keyed run's id for this turn; `false` if an ask of this
    /// turn has it.
    pub fn claim_key(&mut self, id: String) -> bool {
        self.keys.insert(id)
    }

    pub fn count_runs(&mut self, ns: &str, n: usize) {
        *self.runs_by_ns.entry(ns.to_string()).or_default() += n as u64;
    }

    pub fn runs_planned(&self, ns: &str) -> u64 {
        self.runs_by_ns.get(ns).copied().unwrap_or(0)
    }

    pub fn count_bytes(&mut self, ns: &str, bytes: u64) {
        *self.bytes_by_ns.entry(ns.to_string()).or_default() += bytes;
    }

    pub fn bytes_planned(&self, ns: &str) -> u64 {
        self.bytes_by_ns.get(ns).copied().unwrap_or(0)
    }

    pub fn count_backfill(&mut self, ns: &str, instants: u64) {
        let e = self.backfills_by_ns.entry(ns.to_string()).or_default();
        e.0 += 1;
        e.1 += instants;
    }

    /// Backfills planned in `ns` this turn, and their instants.
    pub fn backfills_planned(&self, ns: &str) -> (u64, u64) {
        self.backfills_by_ns.get(ns).copied().unwrap_or((0, 0))
    }

    /// Nothing to write (refused reports may still want answers).
    pub fn writes_nothing(&self) -> bool {
        self.fire.is_none()
            && self.asks.is_empty()
            && self.backfills.is_empty()
            && self.ends.is_empty()
            && self.cancels.is_empty()
            && self.retries.is_empty()
            && self.releases.is_empty()
            && self.events.batch.is_empty()
            && self.dispatch.batch.is_empty()
            && self.dispatch.dropped.is_empty()
    }
}

/// Worker results on their way to the store.
#[derive(Default)]
pub struct EventBatch {
    pub events: Vec<WorkerEvent>,
    pub batch: Vec<Transition>,
    /// (worker, run, attempt, rejection) to send once written.
    pub acks: Vec<(String, String, u32, Option<&'static str>)>,
}
