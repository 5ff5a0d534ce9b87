//! What differs between the databases: a [`Dialect`] gives the SQL of
//! each statement a guard runs and bounds the guarded transaction;
//! [`Backend`] names the databases that have one.

use crate::driver::Driver;
use crate::{BoxFuture, FenceError, Options};

/// A database the steps are kept in: PostgreSQL or MySQL/MariaDB.
pub trait Backend: Dialect {}

impl<D: Dialect> Backend for D {}

/// The tables of a prefix.
#[derive(Debug, Clone)]
pub struct Tables {
    pub fence: String,
    pub steps: String,
}

impl Tables {
    pub fn new(prefix: &str) -> Result<Tables, FenceError> {
        let ok = !prefix.is_empty()
            && prefix.len() <= 57
            && prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !prefix.starts_with(|c: char| c.is_ascii_digit());
        if !ok {
            return Err(FenceError::BadTable(prefix.to_string()));
        }
        Ok(Tables { fence: format!("{prefix}_fence"), steps: format!("{prefix}_steps") })
    }
}

/// A run's row as `(attempt, token)`; a step's record as `(attempt,
/// token, result)`.
pub type StepRow = (i64, i64, Option<String>);

/// A database's own SQL. The statements ([`crate::statements`] runs them,
/// the same on every database) are each made for a table's name and bind
/// their parameters in the order given here.
pub trait Dialect: Driver {
    /// Creates the fence and the steps tables if they are missing.
    fn create_sql(t: &Tables) -> [String; 2];
    /// Bounds lock waits and pauses: for the transaction where the
    /// database can, else for the session.
    fn limit<'a>(conn: &'a mut Self::Connection, o: &'a Options) -> BoxFuture<'a, Result<(), FenceError>>;
    /// Inserts the run's row (`run_id`, `attempt`, `token`) if it is
    /// missing; an existing row is left as it is.
    fn insert_run_sql(fence: &str) -> String;
    /// Reads the run's row as `(attempt, token)` and locks it (`run_id`).
    fn lock_run_sql(fence: &str) -> String;
    /// Reads the step's record as last committed, as `(attempt, token,
    /// result)` (`run_id`, `step`).
    fn find_step_sql(steps: &str) -> String;
    /// Inserts the step's record with a `NULL` result (`run_id`, `step`,
    /// `attempt`, `token`). A record already there is left as it is: the
    /// statement changes no row, or fails alone with a unique violation.
    fn insert_step_sql(steps: &str) -> String;
    /// Sets the run's row to an attempt, now (`attempt`, `token`,
    /// `run_id`).
    fn raise_run_sql(fence: &str) -> String;
    /// Sets the step's result (`result`, `run_id`, `step`); the row counts
    /// as changed when the result is the same.
    fn record_sql(steps: &str) -> String;
}
