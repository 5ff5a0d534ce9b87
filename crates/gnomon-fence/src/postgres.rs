//! The steps on PostgreSQL.

use std::time::Duration;

use sqlx::{Executor, PgConnection, Postgres};

use crate::dialect::{Dialect, Tables};
use crate::{BoxFuture, FenceError, Options};

/// Milliseconds for PostgreSQL's limits: rounded up, 1 to `i32::MAX`.
fn whole_millis(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.as_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX).clamp(1, i32::MAX as u64)
}

pub(crate) fn limit_sql(o: &Options) -> String {
    format!(
        "SET LOCAL lock_timeout = '{}ms'; SET LOCAL idle_in_transaction_session_timeout = '{}ms'",
        whole_millis(o.lock_wait),
        whole_millis(o.idle)
    )
}

impl Dialect for Postgres {
    fn create_sql(t: &Tables) -> [String; 2] {
        [
            format!(
                "CREATE TABLE IF NOT EXISTS {} (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL, token BIGINT NOT NULL, \
                 written_at TIMESTAMPTZ NOT NULL DEFAULT now())",
                t.fence
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (run_id TEXT NOT NULL, step TEXT NOT NULL, attempt BIGINT NOT NULL, token BIGINT NOT NULL, \
                 result TEXT, committed_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (run_id, step))",
                t.steps
            ),
        ]
    }

    fn limit<'a>(conn: &'a mut PgConnection, o: &'a Options) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            conn.execute(sqlx::raw_sql(&limit_sql(o))).await?;
            Ok(())
        })
    }

    fn insert_run_sql(fence: &str) -> String {
        format!("INSERT INTO {fence} (run_id, attempt, token) VALUES ($1, $2, $3) ON CONFLICT (run_id) DO NOTHING")
    }

    fn lock_run_sql(fence: &str) -> String {
        format!("SELECT attempt, token FROM {fence} WHERE run_id = $1 FOR UPDATE")
    }

    fn find_step_sql(steps: &str) -> String {
        format!("SELECT attempt, token, result FROM {steps} WHERE run_id = $1 AND step = $2")
    }

    fn insert_step_sql(steps: &str) -> String {
        format!("INSERT INTO {steps} (run_id, step, attempt, token) VALUES ($1, $2, $3, $4) ON CONFLICT (run_id, step) DO NOTHING")
    }

    fn raise_run_sql(fence: &str) -> String {
        format!("UPDATE {fence} SET attempt = $1, token = $2, written_at = now() WHERE run_id = $3")
    }

    fn record_sql(steps: &str) -> String {
        format!("UPDATE {steps} SET result = $1 WHERE run_id = $2 AND step = $3")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statements() {
        let t = Tables::new("gnomon").unwrap();
        assert_eq!(
            Postgres::create_sql(&t),
            [
                "CREATE TABLE IF NOT EXISTS gnomon_fence (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL, token BIGINT NOT NULL, \
                 written_at TIMESTAMPTZ NOT NULL DEFAULT now())",
                "CREATE TABLE IF NOT EXISTS gnomon_steps (run_id TEXT NOT NULL, step TEXT NOT NULL, attempt BIGINT NOT NULL, \
                 token BIGINT NOT NULL, result TEXT, committed_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (run_id, step))",
            ]
        );
        assert_eq!(
            limit_sql(&Options::default()),
            "SET LOCAL lock_timeout = '5000ms'; SET LOCAL idle_in_transaction_session_timeout = '10000ms'"
        );
    }

    #[test]
    fn limits_are_whole_milliseconds_rounded_up() {
        assert_eq!(whole_millis(Duration::from_micros(1500)), 2);
        assert_eq!(whole_millis(Duration::from_secs(5)), 5000);
        assert_eq!(whole_millis(Duration::ZERO), 1, "never 0, which is no limit");
        assert_eq!(whole_millis(Duration::from_secs(u64::MAX)), i32::MAX as u64);
    }
}
