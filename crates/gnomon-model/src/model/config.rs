//! What the model is checked with: [`Config`], its bounds and rules, and
//! the [`StepRule`] of the job's database.

use super::AttemptModel;
use crate::state::MAX_RUNS;

/// The rule the job's database applies to a step commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepRule {
    /// The step-record rule: the first attempt to commit a (run, step)
    /// record wins; any other attempt, older or newer, finds the record,
    /// writes nothing and takes the recorded result; an attempt older than
    /// the run's newest started attempt may not commit a step that has no
    /// record.
    Record,
    /// The old guard rule: refused only when a later attempt (or a higher
    /// token) has already written through the guard; no step record.
    LaterAttemptOnly,
}

/// The bounds and the rules the model is checked with.
#[derive(Clone, Debug)]
pub struct Config {
    /// The scheduled instants, one run each: the tick each is due (the
    /// first should be 0).
    pub due: Vec<u8>,
    /// Leadership terms (tokens `1..=terms`); term 1 leads from the start.
    pub terms: u8,
    /// A worker session's lease, in ticks: the leader ends a session when a
    /// full lease has passed since its last heartbeat (`lease_until < now`),
    /// and a new term's orphans wait as long from the term's start.
    pub lease: u8,
    /// Ticks without an acknowledged heartbeat after which a worker's fence
    /// has lapsed (`self_fence_fraction` × the lease, rounded up). The
    /// protocol needs it at most the lease; a larger one is a defect.
    pub self_fence_after: u8,
    /// The job's timeout, in ticks, counted from an attempt's start.
    pub timeout: u8,
    /// The leader may rebuild its cache from the store within a term (a
    /// store error), keeping each worker's session; each rebuild spends a
    /// fault.
    pub rebuilds: bool,
    /// The defect: a rebuild forgets when live attempts began (an orphan
    /// counts from the epoch, so it is overdue at once; an attempt whose
    /// worker has a session here counts from the rebuild), as `recover`
    /// did when it loaded them with `assigned_at = 0`.
    pub rebuild_forgets_start: bool,
    /// The rule of the job's database for step commits.
    pub step_rule: StepRule,
    /// The store refuses a leader write whose token is not the current fence.
    pub store_checks_tokens: bool,
    /// Faults a behaviour may have: a worker paused (also inside its step
    /// transaction), killed or cut off, a leader crash, a store error (a
    /// rebuild). New terms are bounded by `terms` alone.
    pub faults: u8,
    /// Explore one state per pair of states that differ only by the
    /// workers' names.
    pub symmetry: bool,
}

impl Config {
    /// The fixed protocol at the default bound: one instant, two workers,
    /// two terms, two attempts, a lease of 2 ticks, a fence lapsing after 2
    /// ticks without an ack, a timeout of 3 ticks, one fault.
    pub fn fixed() -> Self {
        Config {
            due: vec![0],
            terms: 2,
            lease: 2,
            self_fence_after: 2,
            timeout: 3,
            rebuilds: true,
            rebuild_forgets_start: false,
            step_rule: StepRule::Record,
            store_checks_tokens: true,
            faults: 1,
            symmetry: true,
        }
    }

    /// The model.
    pub fn model(self) -> AttemptModel {
        assert!(!self.due.is_empty() && self.due.len() <= MAX_RUNS, "1 to {MAX_RUNS} instants");
        assert!(self.terms >= 1 && self.lease >= 1 && self.timeout >= 1);
        assert!(self.self_fence_after >= 1);
        AttemptModel { cfg: self }
    }
}
