//! The public operations: creating the tables, guarding a step in the
//! caller's transaction, marking an attempt started, and doing a step
//! whole.

use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::{Acquire, Transaction};

use crate::dialect::Tables;
use crate::fence::{check_fence, newer, superseded};
use crate::step::{check_step, recorded};
use crate::{statements, Backend, BoxFuture, Fence, FenceError, Fresh, Options, Step};

/// Creates `<prefix>_fence` and `<prefix>_steps` if they are missing (a
/// pool, a connection, or a transaction). An existing `<prefix>_fence`
/// made by an earlier version of this crate is kept as it is.
///
/// PostgreSQL:
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS gnomon_fence (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL,
///   token BIGINT NOT NULL, written_at TIMESTAMPTZ NOT NULL DEFAULT now());
/// CREATE TABLE IF NOT EXISTS gnomon_steps (run_id TEXT NOT NULL, step TEXT NOT NULL,
///   attempt BIGINT NOT NULL, token BIGINT NOT NULL, result TEXT,
///   committed_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (run_id, step));
/// ```
///
/// MySQL/MariaDB:
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS gnomon_fence (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY,
///   attempt BIGINT NOT NULL, token BIGINT NOT NULL,
///   written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB;
/// CREATE TABLE IF NOT EXISTS gnomon_steps (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL,
///   step VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, attempt BIGINT NOT NULL,
///   token BIGINT NOT NULL, result TEXT, committed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
///   PRIMARY KEY (run_id, step)) ENGINE=InnoDB;
/// ```
pub async fn create_tables<'a, A, DB>(conn: A, prefix: &str) -> Result<(), FenceError>
where
    A: Acquire<'a, Database = DB>,
    DB: Backend,
{
    let tables = Tables::new(prefix)?;
    let mut conn = conn.acquire().await?;
    statements::create_tables::<DB>(&mut *conn, &tables).await
}

/// Guards `step` of `fence`'s run in the caller's transaction, before the
/// step's writes, with the default [`Options`]: see [`guard_with`].
pub async fn guard<DB: Backend>(tx: &mut Transaction<'_, DB>, fence: &Fence, step: &str) -> Result<Step, FenceError> {
    guard_with(tx, fence, step, &Options::default()).await
}

/// Guards `step` of `fence`'s run in the caller's transaction, before the
/// step's writes ([the rule](crate#the-rule)):
///
/// - [`Step::Recorded`]: the step is committed already; write nothing,
///   use the result (and commit or roll back, it makes no difference).
/// - [`Step::Fresh`]: the step is the caller's; do its writes,
///   [`Fresh::record`] the result and commit.
/// - [`FenceError::Superseded`]: a newer attempt has started and the step
///   has no record; roll back.
/// - [`FenceError::LockTimeout`]: the run's row was held longer than
///   [`Options::lock_wait`]; roll back and retry.
///
/// The transaction holds the run's row lock until it ends, and from here
/// on its lock waits and pauses are bounded by `options`.
pub async fn guard_with<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    fence: &Fence,
    step: &str,
    options: &Options,
) -> Result<Step, FenceError> {
    let tables = Tables::new(&options.prefix)?;
    check_fence(fence)?;
    check_step(step)?;
    let conn = &mut **tx;
    DB::limit(conn, options).await?;
    let (seen_attempt, seen_token) = statements::lock_run::<DB>(conn, &tables, fence).await?;
    if newer(fence, seen_attempt, seen_token) {
        // Refused a new step; a recorded one is still the caller's to read.
        return match statements::find_step::<DB>(conn, &tables, &fence.run_id, step).await? {
            Some(found) => recorded(found),
            None => Err(superseded(fence, seen_attempt, seen_token)),
        };
    }
    if !statements::insert_step::<DB>(conn, &tables, fence, step).await? {
        let found = statements::find_step::<DB>(conn, &tables, &fence.run_id, step).await?;
        // The row was there a statement ago and the run's lock is held.
        return recorded(found.ok_or(FenceError::Database(sqlx::Error::RowNotFound))?);
    }
    statements::raise_run::<DB>(conn, &tables, fence).await?;
    Ok(Step::Fresh(Fresh { run_id: fence.run_id.clone(), step: step.to_string(), steps_table: tables.steps }))
}

/// Marks `fence`'s attempt as started, with the default [`Options`]: see
/// [`begin_attempt_with`].
pub async fn begin_attempt<'a, A, DB>(conn: A, fence: &Fence) -> Result<(), FenceError>
where
    A: Acquire<'a, Database = DB>,
    DB: Backend,
{
    begin_attempt_with(conn, fence, &Options::default()).await
}

/// Marks `fence`'s attempt as the run's newest started one, in a short
/// transaction of its own (pass a pool or a connection, not a transaction,
/// whose commit would be the caller's): from its commit on, older
/// attempts of the run commit no new step. Refused with
/// [`FenceError::Superseded`] when a newer attempt is marked already; a
/// lock wait is bounded as in [`guard_with`].
pub async fn begin_attempt_with<'a, A, DB>(conn: A, fence: &Fence, options: &Options) -> Result<(), FenceError>
where
    A: Acquire<'a, Database = DB>,
    DB: Backend,
{
    let tables = Tables::new(&options.prefix)?;
    check_fence(fence)?;
    let mut tx = conn.begin().await?;
    DB::limit(&mut *tx, options).await?;
    let (seen_attempt, seen_token) = statements::lock_run::<DB>(&mut *tx, &tables, fence).await?;
    if newer(fence, seen_attempt, seen_token) {
        return Err(superseded(fence, seen_attempt, seen_token));
    }
    statements::raise_run::<DB>(&mut *tx, &tables, fence).await?;
    tx.commit().await?;
    Ok(())
}

/// Does `step` of `fence`'s run exactly once, with the default [`Options`]:
/// see [`run_step_with`].
pub async fn run_step<'a, A, DB, T, E, F>(conn: A, fence: &Fence, step: &str, f: F) -> Result<T, E>
where
    A: Acquire<'a, Database = DB>,
    DB: Backend,
    T: Serialize + DeserializeOwned,
    E: From<FenceError>,
    F: for<'c> FnOnce(&'c mut Transaction<'a, DB>) -> BoxFuture<'c, Result<T, E>>,
{
    run_step_with(conn, fence, step, &Options::default(), f).await
}

/// Does `step` of `fence`'s run exactly once: begins a transaction on
/// `conn` (a pool or a connection), guards the step ([`guard_with`]), and
/// when the step is fresh runs `f` in the transaction, records what it
/// returns and commits. Returns that, or the result an earlier commit of
/// the step recorded (then `f` is not run).
///
/// `f` gets the transaction (`&mut **tx` is the connection to write
/// through) and returns a boxed future: `|tx| Box::pin(async move { … })`.
/// An error from `f`, or from the guard (as `E::from`), rolls the
/// transaction back.
pub async fn run_step_with<'a, A, DB, T, E, F>(conn: A, fence: &Fence, step: &str, options: &Options, f: F) -> Result<T, E>
where
    A: Acquire<'a, Database = DB>,
    DB: Backend,
    T: Serialize + DeserializeOwned,
    E: From<FenceError>,
    F: for<'c> FnOnce(&'c mut Transaction<'a, DB>) -> BoxFuture<'c, Result<T, E>>,
{
    let mut tx = conn.begin().await.map_err(FenceError::from)?;
    match guard_with(&mut tx, fence, step, options).await? {
        Step::Recorded { result, .. } => {
            // Nothing of the caller's to keep.
            let _ = tx.rollback().await;
            Ok(serde_json::from_value(result).map_err(FenceError::BadResult)?)
        }
        Step::Fresh(fresh) => {
            let value = f(&mut tx).await?;
            fresh.record(&mut tx, &value).await?;
            tx.commit().await.map_err(FenceError::from)?;
            Ok(value)
        }
    }
}
