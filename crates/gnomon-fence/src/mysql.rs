//! The guard on MySQL or MariaDB.

use sqlx::MySqlConnection;

use super::{admit, check_table, Fence, FenceError, DEFAULT_TABLE};

/// Creates the fence table if it is missing (`table`: a plain name).
pub async fn create_table_mysql(conn: &mut MySqlConnection, table: &str) -> Result<(), FenceError> {
    check_table(table)?;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY, \
         attempt BIGINT NOT NULL, token BIGINT NOT NULL, written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB"
    ))
    .execute(conn)
    .await?;
    Ok(())
}

/// Checks and records `fence` in [`DEFAULT_TABLE`], inside the caller's
/// transaction: refused ([`FenceError::Superseded`]) when a later attempt
/// of the run, or a higher token, has written. Holds the run's row lock
/// until the transaction ends.
pub async fn guard_mysql(tx: &mut MySqlConnection, fence: &Fence) -> Result<(), FenceError> {
    guard_mysql_in(tx, fence, DEFAULT_TABLE).await
}

/// [`guard_mysql`] with a table of the caller's choosing.
pub async fn guard_mysql_in(tx: &mut MySqlConnection, fence: &Fence, table: &str) -> Result<(), FenceError> {
    check_table(table)?;
    let token = i64::try_from(fence.token).unwrap_or(i64::MAX);
    // The row exists (ours, or another attempt's, waited for if it is
    // being inserted), then is locked and read as last committed.
    sqlx::query(&format!("INSERT INTO {table} (run_id, attempt, token) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE run_id = run_id"))
        .bind(&fence.run_id)
        .bind(i64::from(fence.attempt))
        .bind(token)
        .execute(&mut *tx)
        .await?;
    let (seen_attempt, seen_token): (i64, i64) = sqlx::query_as(&format!("SELECT attempt, token FROM {table} WHERE run_id = ? FOR UPDATE"))
        .bind(&fence.run_id)
        .fetch_one(&mut *tx)
        .await?;
    admit(fence, seen_attempt, seen_token)?;
    sqlx::query(&format!("UPDATE {table} SET attempt = ?, token = ?, written_at = CURRENT_TIMESTAMP(3) WHERE run_id = ?"))
        .bind(i64::from(fence.attempt))
        .bind(token)
        .bind(&fence.run_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}
