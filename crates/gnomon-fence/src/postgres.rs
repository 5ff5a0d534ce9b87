//! The steps on PostgreSQL.

use sqlx::{Executor, PgConnection, Postgres};

use super::sealed::{Dialect, StepRow, Tables};
use std::time::Duration;

use super::{token, BoxFuture, Fence, FenceError, Options};

/// The statements, by table names.
pub(crate) fn create_sql(t: &Tables) -> [String; 2] {
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
    fn create_tables<'a>(conn: &'a mut PgConnection, t: &'a Tables) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            for sql in create_sql(t) {
                conn.execute(sqlx::raw_sql(&sql)).await?;
            }
            Ok(())
        })
    }

    fn limit<'a>(conn: &'a mut PgConnection, o: &'a Options) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            conn.execute(sqlx::raw_sql(&limit_sql(o))).await?;
            Ok(())
        })
    }

    fn lock_run<'a>(conn: &'a mut PgConnection, t: &'a Tables, f: &'a Fence) -> BoxFuture<'a, Result<(i64, i64), FenceError>> {
        Box::pin(async move {
            sqlx::query(&format!("INSERT INTO {} (run_id, attempt, token) VALUES ($1, $2, $3) ON CONFLICT (run_id) DO NOTHING", t.fence))
                .bind(&f.run_id)
                .bind(i64::from(f.attempt))
                .bind(token(f))
                .execute(&mut *conn)
                .await?;
            Ok(sqlx::query_as(&format!("SELECT attempt, token FROM {} WHERE run_id = $1 FOR UPDATE", t.fence))
                .bind(&f.run_id)
                .fetch_one(&mut *conn)
                .await?)
        })
    }

    fn find_step<'a>(
        conn: &'a mut PgConnection,
        t: &'a Tables,
        run_id: &'a str,
        step: &'a str,
    ) -> BoxFuture<'a, Result<Option<StepRow>, FenceError>> {
        Box::pin(async move {
            Ok(sqlx::query_as(&format!("SELECT attempt, token, result FROM {} WHERE run_id = $1 AND step = $2", t.steps))
                .bind(run_id)
                .bind(step)
                .fetch_optional(conn)
                .await?)
        })
    }

    fn insert_step<'a>(conn: &'a mut PgConnection, t: &'a Tables, f: &'a Fence, step: &'a str) -> BoxFuture<'a, Result<bool, FenceError>> {
        Box::pin(async move {
            let done = sqlx::query(&format!(
                "INSERT INTO {} (run_id, step, attempt, token) VALUES ($1, $2, $3, $4) ON CONFLICT (run_id, step) DO NOTHING",
                t.steps
            ))
            .bind(&f.run_id)
            .bind(step)
            .bind(i64::from(f.attempt))
            .bind(token(f))
            .execute(conn)
            .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn raise_run<'a>(conn: &'a mut PgConnection, t: &'a Tables, f: &'a Fence) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            sqlx::query(&format!("UPDATE {} SET attempt = $2, token = $3, written_at = now() WHERE run_id = $1", t.fence))
                .bind(&f.run_id)
                .bind(i64::from(f.attempt))
                .bind(token(f))
                .execute(conn)
                .await?;
            Ok(())
        })
    }

    fn record<'a>(
        conn: &'a mut PgConnection,
        steps: &'a str,
        run_id: &'a str,
        step: &'a str,
        json: &'a str,
    ) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            let done = sqlx::query(&format!("UPDATE {steps} SET result = $3 WHERE run_id = $1 AND step = $2"))
                .bind(run_id)
                .bind(step)
                .bind(json)
                .execute(conn)
                .await?;
            if done.rows_affected() != 1 {
                return Err(FenceError::Database(sqlx::Error::RowNotFound));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statements() {
        let t = Tables::new("gnomon").unwrap();
        assert_eq!(
            create_sql(&t),
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
