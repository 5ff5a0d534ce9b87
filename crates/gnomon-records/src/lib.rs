//! gnomon-records: the records that cross the store boundary (runs,
//! attempts, jobs as stored, backfills, a turn's batch and its answer) and
//! the store's errors. Plain data, with no I/O: the leader's engine plans
//! in these types, and every store reads and writes them.

mod backfill;
pub mod model;

pub use backfill::*;
pub use model::*;

/// Errors of the store. Each says whether retrying may help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum StoreError {
    /// A leader write carried a token that is no longer the scope's current one.
    #[error("fenced: token {token} is not the current token {current} of scope {scope:?}")]
    Fenced { scope: String, token: u64, current: u64 },
    /// `fence` was called with a token not higher than the stored one.
    #[error("stale token: {token} is not higher than the current token {current} of scope {scope:?}")]
    StaleToken { scope: String, token: u64, current: u64 },
    #[error("not found: {0}")]
    NotFound(String),
    #[error("already exists: {0}")]
    AlreadyExists(String),
    #[error("version conflict on {what}: expected version {expected}, found {actual}")]
    VersionConflict { what: String, expected: u64, actual: u64 },
    #[error("invalid transition of run {run}: {from} -> {to}")]
    InvalidTransition { run: String, from: String, to: String },
    #[error("run {0} is already in a terminal state")]
    Terminal(String),
    /// The backend could not be reached or timed out; retrying may help.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store error: {0}")]
    Backend(String),
    #[error("corrupt record: {0}")]
    Corrupt(String),
    #[error("backend {0:?} is not compiled into this build (enable its cargo feature)")]
    NotCompiled(String),
    #[error("invalid store URL: {0}")]
    InvalidUrl(String),
    /// A job write's `after` edges do not fit its namespace's stored jobs
    /// (`unknown_upstream`, `dependency_cycle` with its path), as checked
    /// in the write's own transaction; nothing was written.
    #[error("{0}")]
    Graph(#[serde(with = "spec_error")] gnomon_core::SpecError),
    /// A delete refused because other jobs of the namespace run after the
    /// job (`dependents`, by name), as checked in the delete's own
    /// transaction; nothing was deleted.
    #[error("{} run after {namespace}/{name}: remove it from their `after` first", .dependents.join(", "))]
    HasDependents { namespace: String, name: String, dependents: Vec<String> },
    /// The database's schema is at a version past the last migration this
    /// build has: a newer gnomon migrated it, and this one would misread it.
    #[error("the {backend} database's schema is at version {found}, newer than the {known} this build knows: run a gnomon at least as new as the one that migrated it")]
    SchemaTooNew { backend: String, found: i64, known: i64 },
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// Precondition of a job write (in the manner of restate's metadata store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Precondition {
    None,
    DoesNotExist,
    MatchesVersion(u64),
}

/// Everything one leader turn writes, made as one fenced write
/// (`gnomon_backend::LeaderWrites::write_turn`): runs fired (with their jobs' advances),
/// run transitions (which may move the runs just fired), backfill
/// progress and backfills started.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct TurnBatch {
    pub runs: Vec<NewRun>,
    pub advances: Vec<JobAdvance>,
    pub transitions: Vec<Transition>,
    /// Backfill cursors moved, each a compare-and-swap from the cursor read.
    #[serde(default)]
    pub backfills: Vec<BackfillProgress>,
    /// Per backfill progress (when given), the runs of this batch that are
    /// its chunk's instants: the write adds those it created to the
    /// progress's `created` and the others to its `kept`
    /// ([`TurnBatch::counted_progress`]).
    #[serde(default)]
    pub backfill_runs: Vec<std::ops::Range<usize>>,
    /// Backfills started (created if their id is free).
    #[serde(default)]
    pub new_backfills: Vec<NewBackfill>,
    /// When the write is made (the new backfills' creation time).
    #[serde(default)]
    pub at: gnomon_core::Millis,
}

impl TurnBatch {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
            && self.advances.is_empty()
            && self.transitions.is_empty()
            && self.backfills.is_empty()
            && self.new_backfills.is_empty()
    }

    /// How many rows it writes (for metrics).
    pub fn rows(&self) -> usize {
        self.runs.len() + self.advances.len() + self.transitions.len() + self.backfills.len() + self.new_backfills.len()
    }

    /// The backfills' progress with their chunks' outcomes counted in, as
    /// the write records it: each run of its chunk `fired` created adds to
    /// `created`, each that existed to `kept`.
    pub fn counted_progress(&self, fired: &[FireOutcome]) -> Vec<BackfillProgress> {
        let mut out = self.backfills.clone();
        for (p, range) in out.iter_mut().zip(&self.backfill_runs) {
            for outcome in fired.get(range.clone()).unwrap_or_default() {
                match outcome {
                    FireOutcome::Created => p.created += 1,
                    FireOutcome::Existed => p.kept += 1,
                }
            }
        }
        out
    }

    /// Only runs, advances and transitions (what every store's fast path writes).
    pub fn is_runs_only(&self) -> bool {
        self.backfills.is_empty() && self.new_backfills.is_empty()
    }
}

/// What `gnomon_backend::LeaderWrites::write_turn` wrote.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct TurnWrite {
    /// Per new run, as `gnomon_backend::LeaderWrites::fire` answers.
    pub fired: Vec<FireOutcome>,
    /// Per transition, as `gnomon_backend::LeaderWrites::transition` answers; an error here means
    /// the fire committed and the transitions did not.
    pub applied: Result<Vec<bool>, StoreError>,
    /// Per backfill progress, whether it applied (as
    /// `gnomon_backend::BackfillStore::advance_backfill` answers).
    #[serde(default)]
    pub advanced: Vec<bool>,
    /// Per new backfill, whether it was created (`false`: its id was taken).
    #[serde(default)]
    pub created: Vec<bool>,
}

/// A worker session's lease as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSession {
    pub worker: String,
    pub lease: i64,
    /// Milliseconds the lease has left.
    pub remaining_ms: i64,
}

/// A [`gnomon_core::SpecError`] inside a [`StoreError`] as
/// `(code, field, message)`: a replicated store's refusal travels to the
/// member that proposed the write. Its code is one of the graph checks'
/// (a static string on the way back).
pub mod spec_error {
    use gnomon_core::SpecError;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// The codes a graph refusal carries; anything else reads as the
    /// generic `invalid_after`.
    const CODES: &[&str] = &["unknown_upstream", "dependency_cycle", "cross_namespace", "invalid_after"];

    pub fn serialize<S: Serializer>(e: &SpecError, s: S) -> Result<S::Ok, S::Error> {
        (e.code, &e.field, &e.message).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SpecError, D::Error> {
        let (code, field, message) = <(String, String, String)>::deserialize(d)?;
        let code = CODES.iter().copied().find(|c| *c == code).unwrap_or("invalid_after");
        Ok(SpecError::new(code, field, message))
    }
}
