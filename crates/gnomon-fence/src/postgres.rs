//! The guard on PostgreSQL.

use sqlx::PgConnection;

use super::{admit, check_table, Fence, FenceError, DEFAULT_TABLE};

/// Creates the fence table if it is missing (`table`: a plain name).
pub async fn create_table_postgres(conn: &mut PgConnection, table: &str) -> Result<(), FenceError> {
    check_table(table)?;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL, token BIGINT NOT NULL, \
         written_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    ))
    .execute(conn)
    .await?;
    Ok(())
}

/// Checks and records `fence` in [`DEFAULT_TABLE`], inside the caller's
/// transaction: refused ([`FenceError::Superseded`]) when a later attempt
/// of the run, or a higher token, has written. Holds the run's row lock
/// until the transaction ends.
pub async fn guard_postgres(tx: &mut PgConnection, fence: &Fence) -> Result<(), FenceError> {
    guard_postgres_in(tx, fence, DEFAULT_TABLE).await
}

/// [`guard_postgres`] with a table of the caller's choosing.
pub async fn guard_postgres_in(tx: &mut PgConnection, fence: &Fence, table: &str) -> Result<(), FenceError> {
    check_table(table)?;
    let token = i64::try_from(fence.token).unwrap_or(i64::MAX);
    // The row exists (ours, or another attempt's, waited for if it is
    // being inserted), then is locked and read as last committed.
    sqlx::query(&format!("INSERT INTO {table} (run_id, attempt, token) VALUES ($1, $2, $3) ON CONFLICT (run_id) DO NOTHING"))
        .bind(&fence.run_id)
        .bind(i64::from(fence.attempt))
        .bind(token)
        .execute(&mut *tx)
        .await?;
    let (seen_attempt, seen_token): (i64, i64) =
        sqlx::query_as(&format!("SELECT attempt, token FROM {table} WHERE run_id = $1 FOR UPDATE"))
            .bind(&fence.run_id)
            .fetch_one(&mut *tx)
            .await?;
    admit(fence, seen_attempt, seen_token)?;
    sqlx::query(&format!("UPDATE {table} SET attempt = $2, token = $3, written_at = now() WHERE run_id = $1"))
        .bind(&fence.run_id)
        .bind(i64::from(fence.attempt))
        .bind(token)
        .execute(&mut *tx)
        .await?;
    Ok(())
}
