//! The model's state: the store (the truth), the leader's cache, the
//! deposed leader, the workers and the job's database.
//!
//! Every field is small and `Copy`, so a state is cheap to clone and hash.
//! Time is kept relative: each timer is an age or a time left, in ticks,
//! capped where the rules stop telling values apart, so the clock runs
//! without end and the state space stays finite.

/// Workers in the model.
pub const WORKERS: usize = 2;
/// The most runs (scheduled instants) a configuration may have.
pub const MAX_RUNS: usize = 2;
/// A run's attempts: the job's `max_attempts`.
pub const MAX_ATTEMPTS: u8 = 2;

/// A run's state in the store (the run state machine of
/// `gnomon-core/src/run.rs`, without the states no action here reaches).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RunState {
    /// Fired, waiting for a worker.
    Pending,
    /// Its current attempt is assigned to a worker.
    Assigned,
    /// Its current attempt started.
    Running,
    /// Its current attempt ended failed, lost or timed out, and attempts remain.
    Retrying,
    /// Its current attempt succeeded.
    Succeeded,
    /// Its last attempt ended failed, lost or timed out.
    Failed,
}

impl RunState {
    /// Assigned or running: the run has a live attempt.
    pub fn is_live(self) -> bool {
        matches!(self, RunState::Assigned | RunState::Running)
    }

    /// Succeeded or failed: final.
    pub fn is_terminal(self) -> bool {
        matches!(self, RunState::Succeeded | RunState::Failed)
    }
}

/// An attempt's state in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttemptState {
    /// Assigned to its worker, not started.
    Assigned,
    /// Started on its worker.
    Running,
    /// Reported succeeded.
    Succeeded,
    /// Reported failed.
    Failed,
    /// Reported timed out by its worker, or ended so by the leader's
    /// overrun backstop.
    TimedOut,
    /// Its worker's lease ran out, nobody reclaimed it after a failover, or
    /// its worker fenced itself and reported it lost.
    Lost,
}

impl AttemptState {
    /// Assigned or running.
    pub fn is_live(self) -> bool {
        matches!(self, AttemptState::Assigned | AttemptState::Running)
    }
}

/// How an attempt ends, as its worker reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// The job succeeded (after its step committed or found its record).
    Succeeded,
    /// The job failed.
    Failed,
    /// The worker's executor stopped it at its timeout.
    TimedOut,
    /// The worker killed it when fencing itself.
    Lost,
}

impl Outcome {
    /// The attempt state the outcome records.
    pub fn attempt_state(self) -> AttemptState {
        match self {
            Outcome::Succeeded => AttemptState::Succeeded,
            Outcome::Failed => AttemptState::Failed,
            Outcome::TimedOut => AttemptState::TimedOut,
            Outcome::Lost => AttemptState::Lost,
        }
    }
}

/// One attempt of a run, as the store has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attempt {
    /// The worker it was assigned to.
    pub worker: u8,
    /// The fencing token of the leader that assigned it (the attempt's
    /// `Fence` token in the job's database).
    pub token: u8,
    /// Its start is recorded (its `Started` was written).
    pub started: bool,
    /// Ticks since it began: since its start once recorded, else since its
    /// assignment (capped at the timeout + 1: overdue).
    pub age: u8,
    /// Its state.
    pub state: AttemptState,
    /// Ghost: it started on a worker that, since, was never paused, killed
    /// or cut off and whose acknowledged heartbeats never lapsed (the
    /// premise of `live_worker_attempt_never_ended_early`).
    pub healthy: bool,
}

/// A run (one per scheduled instant), as the store has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Run {
    /// Its state.
    pub state: RunState,
    /// Its current attempt's number (0 before the first assignment).
    pub attempt: u8,
    /// Its attempts, by number − 1.
    pub attempts: [Option<Attempt>; MAX_ATTEMPTS as usize],
}

impl Run {
    /// Its current attempt.
    pub fn current(&self) -> Option<&Attempt> {
        self.attempt.checked_sub(1).and_then(|i| self.attempts[usize::from(i)].as_ref())
    }

    /// Its current attempt, to change.
    pub fn current_mut(&mut self) -> Option<&mut Attempt> {
        self.attempt.checked_sub(1).and_then(|i| self.attempts[usize::from(i)].as_mut())
    }
}

/// The store: the only persistent state, and the truth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Store {
    /// The current fencing token (`fence`d by each new term).
    pub fence: u8,
    /// The runs, by instant.
    pub runs: [Option<Run>; MAX_RUNS],
    /// Ghost: run creations that landed, by instant (saturating at 2).
    pub created: [u8; MAX_RUNS],
    /// Ghost: a write landed whose token was below the fence.
    pub stale_landed: bool,
    /// Ghost: the leader ended a healthy attempt `lost` or `timed_out`
    /// before its timeout counted from its start.
    pub ended_early: bool,
}

/// Who the leader has holding a run's live attempt (`RunBook::holder`,
/// `RunBook::orphan`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Holder {
    /// No live attempt.
    #[default]
    None,
    /// Held by the worker (whose start and report count).
    Held(u8),
    /// Waiting for its worker to reclaim it (its `Hello` lists it) until
    /// its deadline has passed, then `lost`.
    Orphan {
        /// Ticks until its deadline has passed (0: passed).
        left: u8,
    },
}

/// The leader's cache of one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaderRun {
    /// Who holds its live attempt.
    pub holder: Holder,
    /// How long ago the leader believes the live attempt began, where that
    /// differs from the store (only ever set by the rebuild that forgets
    /// the start; capped like [`Attempt::age`]).
    pub began_age: Option<u8>,
}

/// The current term's leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Leader {
    /// Its fencing token.
    pub token: u8,
    /// Ticks since its term began (capped at the lease + 1).
    pub age: u8,
    /// Each worker's session, by its lease: ticks until the lease has run
    /// out (0: run out; `None`: no session).
    pub leases: [Option<u8>; WORKERS],
    /// Its cache of each run.
    pub runs: [LeaderRun; MAX_RUNS],
}

/// A worker process's condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// Running.
    Up,
    /// Frozen (a VM pause, SIGSTOP): does nothing, its clock still runs.
    Paused,
    /// Dead, with its attempts; it does not come back in the model.
    Killed,
}

/// An assignment on its way to a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Assignment {
    /// Its run.
    pub run: u8,
    /// Its attempt number.
    pub attempt: u8,
    /// The token of the leader that sent it.
    pub token: u8,
}

/// Where a held attempt is on its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Executing for the ticks given (capped at the timeout).
    Executing(u8),
    /// Ended; its report is spooled until the leader acks it.
    Done(Outcome),
}

/// Where an attempt is with its one step `s` in the job's database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    /// Not tried yet (or its transaction was aborted).
    NotYet,
    /// Inside its transaction, holding the run's row lock.
    InTx,
    /// Committed, or found the step's record and took its result.
    Done,
    /// Refused: superseded.
    Refused,
    /// Its transaction was aborted by the database while its worker was
    /// frozen; it may try again.
    Aborted,
}

/// The attempt a worker holds (capacity 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot {
    /// Its run.
    pub run: u8,
    /// Its attempt number.
    pub attempt: u8,
    /// Its fence token.
    pub token: u8,
    /// Where it is.
    pub phase: Phase,
    /// Where its step is.
    pub step: Step,
    /// An `Abort` for it arrived and is not handled yet.
    pub aborted: bool,
}

/// A worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Worker {
    /// Its condition.
    pub status: Status,
    /// It has a session stream to the current leader.
    pub connected: bool,
    /// Ticks since its newest acknowledged heartbeat (or `Hello`) was sent
    /// (capped where its fence lapses).
    pub ack_age: u8,
    /// The highest leader token it has seen.
    pub max_token: u8,
    /// An assignment sent to it, not yet taken.
    pub inbox: Option<Assignment>,
    /// The attempt it holds.
    pub slot: Option<Slot>,
}

/// The job's own database: the fenced step `s` of each run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobDb {
    /// The worker whose attempt's open transaction holds the run's row lock.
    pub lock: [Option<u8>; MAX_RUNS],
    /// The step record of each run: the attempt that committed it (the
    /// step-record rule's `gnomon_steps` row).
    pub record: [Option<u8>; MAX_RUNS],
    /// The newest (attempt, token) of each run known to the database to
    /// have started: raised when an attempt begins and by every step
    /// commit (the step-record rule's `gnomon_fence` row).
    pub newest: [(u8, u8); MAX_RUNS],
    /// The fence row of each run: the (attempt, token) that last wrote (the
    /// old rule).
    pub row: [Option<(u8, u8)>; MAX_RUNS],
    /// Ghost: commits of the step's effect, by run (saturating at 2).
    pub commits: [u8; MAX_RUNS],
}

/// Ghost flags: things that happened, for the `sometimes` properties
/// that no state shows by itself.
pub mod seen {
    /// A run succeeded on an attempt assigned under an earlier term and
    /// reclaimed by the new leader.
    pub const SUCCEEDED_AFTER_RECLAIM: u8 = 1 << 0;
    /// The store refused a deposed leader's write.
    pub const STALE_REFUSED: u8 = 1 << 1;
    /// The leader's backstop ended an overrun attempt `timed_out`.
    pub const OVERRUN: u8 = 1 << 2;
}

/// The whole state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    /// Ticks since the start, capped one past the last instant's due tick:
    /// which instants are due, and which were due before this tick.
    pub clock: u8,
    /// The store.
    pub store: Store,
    /// The current term's leader, while one is up.
    pub leader: Option<Leader>,
    /// The token of a deposed leader that has not noticed yet (a write of
    /// it may be on its way).
    pub deposed: Option<u8>,
    /// The workers.
    pub workers: [Worker; WORKERS],
    /// The job's database.
    pub db: JobDb,
    /// Faults so far (pauses, kills, cut streams, leader crashes, store
    /// errors), bounded by [`crate::Config::faults`].
    pub faults: u8,
    /// Ghost flags ([`seen`]).
    pub seen: u8,
}

impl State {
    /// Whether a ghost flag is set.
    pub fn has_seen(&self, flag: u8) -> bool {
        self.seen & flag != 0
    }

    /// The same state with the two workers' names swapped (the model is
    /// symmetric in its workers).
    pub fn swap_workers(&self) -> State {
        let sw = |w: u8| 1 - w;
        let mut s = *self;
        s.workers.swap(0, 1);
        for run in s.store.runs.iter_mut().flatten() {
            for a in run.attempts.iter_mut().flatten() {
                a.worker = sw(a.worker);
            }
        }
        if let Some(l) = s.leader.as_mut() {
            l.leases.swap(0, 1);
            for r in l.runs.iter_mut() {
                r.holder = match r.holder {
                    Holder::Held(w) => Holder::Held(sw(w)),
                    Holder::Orphan { left } => Holder::Orphan { left },
                    Holder::None => Holder::None,
                };
            }
        }
        for l in s.db.lock.iter_mut().flatten() {
            *l = sw(*l);
        }
        s
    }

    /// The representative of the state's symmetry class: the smaller of it
    /// and its worker-swapped twin.
    pub fn representative(&self) -> State {
        let other = self.swap_workers();
        if other < *self {
            other
        } else {
            *self
        }
    }
}
