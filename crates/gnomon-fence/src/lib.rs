//! Fenced side effects: a job's database writes that commit only while
//! their attempt is still the newest of its run.
//!
//! gnomon runs each attempt at least once. A worker frozen past its lease
//! (a VM pause, a stop signal) may wake after its run was retried
//! elsewhere and finish its attempt too. Self-fencing stops what the
//! worker controls; it cannot stop a write already on its way. This crate
//! closes that gap in the job's own database: in the same transaction as
//! the job's writes, [`guard_postgres`] / [`guard_mysql`] checks and records
//! the attempt's [`Fence`] — `(run_id, attempt, token)` — in a table,
//! `gnomon_fence`, and refuses with [`FenceError::Superseded`] when a later
//! attempt of the run, or a higher token, has already written. The caller
//! then rolls back, and none of the attempt's writes land.
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool, fence: gnomon_fence::Fence) -> Result<(), Box<dyn std::error::Error>> {
//! let mut tx = pool.begin().await?;
//! gnomon_fence::guard_postgres(&mut tx, &fence).await?;   // first, in the same transaction
//! sqlx::query("INSERT INTO payments (run_id, amount) VALUES ($1, 10)").bind(&fence.run_id).execute(&mut *tx).await?;
//! tx.commit().await?;                                     // commits only if still the newest
//! # Ok(()) }
//! ```
//!
//! # What it guarantees
//! - Of the attempts of one run, once one has committed through the guard,
//!   no earlier attempt (nor one with a lower token) commits through it.
//!   Attempts that race are serialized by the row lock the guard takes;
//!   the later one to commit sees the earlier's record.
//! - An attempt may write through the guard many times.
//!
//! # What it cannot
//! - Writes outside the guarded transaction, or to other systems, are not
//!   fenced: an email sent is sent. For an HTTP service, send the
//!   `Gnomon-Run-Id`, `Gnomon-Attempt` and `Gnomon-Fence-Token` headers
//!   (gnomon's HTTP jobs do) and have the service run the same guard in
//!   its transaction ([`fence_from_headers`]).
//! - A newer attempt that has not written yet does not stop an older one
//!   that writes first: the older commits, and the newer is refused
//!   nothing (its attempt is higher). Make the write idempotent on the run
//!   id (the same for every attempt) for that case.

/// The table the guard keeps, unless told otherwise.
pub const DEFAULT_TABLE: &str = "gnomon_fence";

pub use gnomon_core::fence::{Fence, FenceParseError};

/// The fence of the attempt that sent an HTTP request (the
/// `Gnomon-Run-Id`, `Gnomon-Attempt` and `Gnomon-Fence-Token` headers
/// gnomon's HTTP jobs carry), for a receiving service.
pub fn fence_from_headers(headers: &http::HeaderMap) -> Result<Fence, FenceError> {
    Ok(Fence::read(["gnomon-run-id", "gnomon-attempt", "gnomon-fence-token"], |k| {
        headers.get(k).and_then(|v| v.to_str().ok()).map(str::to_string)
    })?)
}

/// Why a guarded write may not commit.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// A later attempt of the run, or one with a higher token, has written
    /// already: roll back.
    #[error(
        "attempt {mine_attempt} (token {mine_token}) of run {run_id} is superseded: attempt {seen_attempt} (token {seen_token}) has written already"
    )]
    Superseded { run_id: String, mine_attempt: u32, mine_token: u64, seen_attempt: u32, seen_token: u64 },
    #[error(transparent)]
    Parse(#[from] FenceParseError),
    #[error("the fence table {0:?} is not a plain SQL name")]
    BadTable(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl FenceError {
    /// Whether the attempt was superseded (as opposed to a database error).
    pub fn is_superseded(&self) -> bool {
        matches!(self, FenceError::Superseded { .. })
    }
}

/// Compares what is recorded with this attempt.
fn admit(fence: &Fence, seen_attempt: i64, seen_token: i64) -> Result<(), FenceError> {
    let (attempt, token) = (u32::try_from(seen_attempt).unwrap_or(u32::MAX), u64::try_from(seen_token).unwrap_or(0));
    if fence.superseded_by(attempt, token) {
        return Err(FenceError::Superseded {
            run_id: fence.run_id.clone(),
            mine_attempt: fence.attempt,
            mine_token: fence.token,
            seen_attempt: attempt,
            seen_token: token,
        });
    }
    Ok(())
}

fn check_table(table: &str) -> Result<(), FenceError> {
    let ok = !table.is_empty()
        && table.len() <= 64
        && table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !table.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(FenceError::BadTable(table.to_string()))
    }
}

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
pub use postgres::{create_table_postgres, guard_postgres, guard_postgres_in};

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "mysql")]
pub use mysql::{create_table_mysql, guard_mysql, guard_mysql_in};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_attempt_or_a_higher_token_supersedes() {
        let f = Fence { run_id: "r".into(), attempt: 2, token: 5 };
        assert!(admit(&f, 2, 5).is_ok(), "the same attempt again");
        assert!(admit(&f, 1, 5).is_ok());
        assert!(admit(&f, 1, 4).is_ok());
        assert!(admit(&f, 3, 5).unwrap_err().is_superseded());
        assert!(admit(&f, 2, 6).unwrap_err().is_superseded());
    }

    #[test]
    fn fences_are_read_from_headers_and_refused_when_malformed() {
        let mut h = http::HeaderMap::new();
        h.insert("Gnomon-Run-Id", "abc-1000".parse().unwrap());
        h.insert("Gnomon-Attempt", "2".parse().unwrap());
        assert!(matches!(fence_from_headers(&h), Err(FenceError::Parse(FenceParseError::Missing(_)))));
        h.insert("Gnomon-Fence-Token", "x".parse().unwrap());
        assert!(matches!(fence_from_headers(&h), Err(FenceError::Parse(FenceParseError::Invalid(_)))));
        h.insert("Gnomon-Fence-Token", "7".parse().unwrap());
        assert_eq!(fence_from_headers(&h).unwrap(), Fence { run_id: "abc-1000".into(), attempt: 2, token: 7 });
        assert!(check_table("gnomon_fence").is_ok());
        assert!(check_table("x; drop table y").is_err());
    }
}
