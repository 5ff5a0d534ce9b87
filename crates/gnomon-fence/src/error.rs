//! Why a step may not go on: [`FenceError`], and which database errors
//! are lock waits that timed out.

use crate::FenceParseError;

/// Why a step may not go on.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// A newer attempt of the run (a higher attempt, or the same attempt
    /// with a higher token) has started, and the step has no record: roll
    /// back; this attempt commits no new step.
    #[error(
        "attempt {mine_attempt} (token {mine_token}) of run {run_id} is superseded: attempt {seen_attempt} (token {seen_token}) has started"
    )]
    Superseded { run_id: String, mine_attempt: u32, mine_token: u64, seen_attempt: u32, seen_token: u64 },
    /// A lock was not had within [`Options::lock_wait`](crate::Options::lock_wait) (PostgreSQL
    /// SQLSTATE 55P03, MySQL/MariaDB error 1205): roll back, and retry the
    /// transaction.
    #[error("waited too long for a lock held by another transaction (another attempt holds the step): {0}")]
    LockTimeout(#[source] sqlx::Error),
    #[error(transparent)]
    Parse(#[from] FenceParseError),
    /// The table prefix is not a plain SQL name.
    #[error("the fence table prefix {0:?} is not a plain SQL name of at most 57 characters")]
    BadTable(String),
    /// The step name is empty or longer than [`MAX_STEP_LEN`](crate::MAX_STEP_LEN) characters.
    #[error("the step name {0:?} is not 1 to 255 characters")]
    BadStep(String),
    /// A result could not be written as JSON, or a recorded one not read
    /// as the caller's type.
    #[error("a step result: {0}")]
    BadResult(#[source] serde_json::Error),
    #[error(transparent)]
    Database(sqlx::Error),
}

impl From<sqlx::Error> for FenceError {
    fn from(e: sqlx::Error) -> Self {
        if is_lock_timeout(&e) {
            FenceError::LockTimeout(e)
        } else {
            FenceError::Database(e)
        }
    }
}

impl FenceError {
    /// Whether the attempt was superseded (as opposed to a database error).
    pub fn is_superseded(&self) -> bool {
        matches!(self, FenceError::Superseded { .. })
    }

    /// Whether the transaction may be retried as it is (a lock wait timed
    /// out).
    pub fn is_lock_timeout(&self) -> bool {
        matches!(self, FenceError::LockTimeout(_))
    }
}

/// Whether a database error is a lock wait that timed out (PostgreSQL
/// SQLSTATE 55P03 `lock_not_available`, MySQL/MariaDB error 1205).
pub fn is_lock_timeout(e: &sqlx::Error) -> bool {
    let Some(d) = e.as_database_error() else { return false };
    #[cfg(feature = "postgres")]
    if let Some(pg) = d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return pg.code() == "55P03";
    }
    #[cfg(feature = "mysql")]
    if let Some(my) = d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return my.number() == 1205;
    }
    let _ = d;
    false
}
