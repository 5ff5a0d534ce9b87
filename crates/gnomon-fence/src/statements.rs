//! The statements a guard runs, the same on every database: each takes
//! its SQL from the database's [`Dialect`] and binds the same parameters.

use crate::dialect::{Dialect, StepRow, Tables};
use crate::driver::Arg;
use crate::fence::token;
use crate::{Fence, FenceError};

/// Creates the tables if they are missing.
pub(crate) async fn create_tables<DB: Dialect>(conn: &mut DB::Connection, t: &Tables) -> Result<(), FenceError> {
    for sql in DB::create_sql(t) {
        DB::raw(conn, &sql).await?;
    }
    Ok(())
}

/// Inserts the run's row if it is missing, then locks and reads it.
pub(crate) async fn lock_run<DB: Dialect>(conn: &mut DB::Connection, t: &Tables, f: &Fence) -> Result<(i64, i64), FenceError> {
    let row = [Arg::Text(&f.run_id), Arg::Int(i64::from(f.attempt)), Arg::Int(token(f))];
    DB::execute(conn, &DB::insert_run_sql(&t.fence), &row).await?;
    Ok(DB::fetch_run(conn, &DB::lock_run_sql(&t.fence), &[Arg::Text(&f.run_id)]).await?)
}

/// The step's record, as last committed.
pub(crate) async fn find_step<DB: Dialect>(
    conn: &mut DB::Connection,
    t: &Tables,
    run_id: &str,
    step: &str,
) -> Result<Option<StepRow>, FenceError> {
    Ok(DB::fetch_step(conn, &DB::find_step_sql(&t.steps), &[Arg::Text(run_id), Arg::Text(step)]).await?)
}

/// Inserts the step's record (result `NULL`) unless it exists; whether it
/// did.
pub(crate) async fn insert_step<DB: Dialect>(conn: &mut DB::Connection, t: &Tables, f: &Fence, step: &str) -> Result<bool, FenceError> {
    let record = [Arg::Text(&f.run_id), Arg::Text(step), Arg::Int(i64::from(f.attempt)), Arg::Int(token(f))];
    match DB::execute(conn, &DB::insert_step_sql(&t.steps), &record).await {
        Ok(rows) => Ok(rows == 1),
        // The record is there: the statement failed alone.
        Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Sets the run's row to `f`.
pub(crate) async fn raise_run<DB: Dialect>(conn: &mut DB::Connection, t: &Tables, f: &Fence) -> Result<(), FenceError> {
    let row = [Arg::Int(i64::from(f.attempt)), Arg::Int(token(f)), Arg::Text(&f.run_id)];
    DB::execute(conn, &DB::raise_run_sql(&t.fence), &row).await?;
    Ok(())
}

/// Sets the step's result.
pub(crate) async fn record<DB: Dialect>(
    conn: &mut DB::Connection,
    steps: &str,
    run_id: &str,
    step: &str,
    json: &str,
) -> Result<(), FenceError> {
    let rows = DB::execute(conn, &DB::record_sql(steps), &[Arg::Text(json), Arg::Text(run_id), Arg::Text(step)]).await?;
    if rows != 1 {
        return Err(FenceError::Database(sqlx::Error::RowNotFound));
    }
    Ok(())
}
