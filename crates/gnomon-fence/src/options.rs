//! Where the tables are and how long a guard may wait: [`Options`] and
//! its defaults.

use std::time::Duration;

/// The prefix of the tables, unless told otherwise: `gnomon_fence` and
/// `gnomon_steps`.
pub const DEFAULT_PREFIX: &str = "gnomon";

/// How long a guard waits for the run's row, unless told otherwise.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(5);

/// How long a guarded transaction may sit between statements before the
/// database ends its session, unless told otherwise.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(10);

/// Where the tables are and how long a guard may wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The tables are `<prefix>_fence` and `<prefix>_steps`: a plain SQL
    /// name (letters, digits, `_`; not starting with a digit), at most 57
    /// characters. [`DEFAULT_PREFIX`] by default.
    pub prefix: String,
    /// The longest wait for a lock (the run's row, and the caller's own
    /// writes in the transaction), then
    /// [`FenceError::LockTimeout`](crate::FenceError::LockTimeout).
    /// Rounded up to a millisecond on PostgreSQL, to a second on
    /// MySQL/MariaDB. [`DEFAULT_LOCK_WAIT`] by default.
    pub lock_wait: Duration,
    /// The longest pause between two statements of the guarded
    /// transaction before the database ends the session (and so the
    /// transaction, and its locks). Rounded up like `lock_wait`.
    /// [`DEFAULT_IDLE`] by default.
    pub idle: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options { prefix: DEFAULT_PREFIX.to_string(), lock_wait: DEFAULT_LOCK_WAIT, idle: DEFAULT_IDLE }
    }
}

impl Options {
    /// These options with the tables `<prefix>_fence` and `<prefix>_steps`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// These options with another lock wait.
    pub fn lock_wait(mut self, lock_wait: Duration) -> Self {
        self.lock_wait = lock_wait;
        self
    }

    /// These options with another idle limit.
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }
}
