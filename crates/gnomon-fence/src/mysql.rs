//! The steps on MySQL or MariaDB (InnoDB).
//!
//! Reads of the steps table are locking reads (`LOCK IN SHARE MODE`):
//! at InnoDB's default `REPEATABLE READ` a plain read could come from a
//! snapshot taken before another attempt's step commit.

use sqlx::{Executor, MySql, MySqlConnection};

use super::sealed::{Dialect, StepRow, Tables};
use std::time::Duration;

use super::{token, BoxFuture, Fence, FenceError, Options};

/// The statements, by table names.
pub(crate) fn create_sql(t: &Tables) -> [String; 2] {
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {} (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY, \
             attempt BIGINT NOT NULL, token BIGINT NOT NULL, written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB",
            t.fence
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {} (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL, \
             step VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, attempt BIGINT NOT NULL, token BIGINT NOT NULL, \
             result TEXT, committed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), PRIMARY KEY (run_id, step)) ENGINE=InnoDB",
            t.steps
        ),
    ]
}

/// Seconds for MySQL/MariaDB's session limits: rounded up, 1 to a year.
fn whole_seconds(d: Duration) -> u64 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.clamp(1, 31_536_000)
}

/// MariaDB ends a transaction idle that long; MySQL has no such limit
/// and ends the connection (`wait_timeout`).
pub(crate) fn limit_sql(o: &Options, mariadb: bool) -> String {
    let idle = if mariadb { "idle_transaction_timeout" } else { "wait_timeout" };
    format!("SET SESSION innodb_lock_wait_timeout = {}, {idle} = {}", whole_seconds(o.lock_wait), whole_seconds(o.idle))
}

impl Dialect for MySql {
    fn create_tables<'a>(conn: &'a mut MySqlConnection, t: &'a Tables) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            for sql in create_sql(t) {
                conn.execute(sqlx::raw_sql(&sql)).await?;
            }
            Ok(())
        })
    }

    fn limit<'a>(conn: &'a mut MySqlConnection, o: &'a Options) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            let mariadb: i64 = sqlx::query_scalar("SELECT VERSION() LIKE '%MariaDB%'").fetch_one(&mut *conn).await?;
            conn.execute(sqlx::raw_sql(&limit_sql(o, mariadb != 0))).await?;
            Ok(())
        })
    }

    fn lock_run<'a>(conn: &'a mut MySqlConnection, t: &'a Tables, f: &'a Fence) -> BoxFuture<'a, Result<(i64, i64), FenceError>> {
        Box::pin(async move {
            sqlx::query(&format!(
                "INSERT INTO {} (run_id, attempt, token) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE run_id = run_id",
                t.fence
            ))
            .bind(&f.run_id)
            .bind(i64::from(f.attempt))
            .bind(token(f))
            .execute(&mut *conn)
            .await?;
            Ok(sqlx::query_as(&format!("SELECT attempt, token FROM {} WHERE run_id = ? FOR UPDATE", t.fence))
                .bind(&f.run_id)
                .fetch_one(&mut *conn)
                .await?)
        })
    }

    fn find_step<'a>(
        conn: &'a mut MySqlConnection,
        t: &'a Tables,
        run_id: &'a str,
        step: &'a str,
    ) -> BoxFuture<'a, Result<Option<StepRow>, FenceError>> {
        Box::pin(async move {
            Ok(sqlx::query_as(&format!("SELECT attempt, token, result FROM {} WHERE run_id = ? AND step = ? LOCK IN SHARE MODE", t.steps))
                .bind(run_id)
                .bind(step)
                .fetch_optional(conn)
                .await?)
        })
    }

    fn insert_step<'a>(
        conn: &'a mut MySqlConnection,
        t: &'a Tables,
        f: &'a Fence,
        step: &'a str,
    ) -> BoxFuture<'a, Result<bool, FenceError>> {
        Box::pin(async move {
            // A plain INSERT: a duplicate is the step's record (and fails
            // only this statement); INSERT IGNORE would also let a value
            // the column cannot hold through, altered.
            let insert = sqlx::query(&format!("INSERT INTO {} (run_id, step, attempt, token) VALUES (?, ?, ?, ?)", t.steps))
                .bind(&f.run_id)
                .bind(step)
                .bind(i64::from(f.attempt))
                .bind(token(f))
                .execute(conn)
                .await;
            match insert {
                Ok(_) => Ok(true),
                Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => Ok(false),
                Err(e) => Err(e.into()),
            }
        })
    }

    fn raise_run<'a>(conn: &'a mut MySqlConnection, t: &'a Tables, f: &'a Fence) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            sqlx::query(&format!("UPDATE {} SET attempt = ?, token = ?, written_at = CURRENT_TIMESTAMP(3) WHERE run_id = ?", t.fence))
                .bind(i64::from(f.attempt))
                .bind(token(f))
                .bind(&f.run_id)
                .execute(conn)
                .await?;
            Ok(())
        })
    }

    fn record<'a>(
        conn: &'a mut MySqlConnection,
        steps: &'a str,
        run_id: &'a str,
        step: &'a str,
        json: &'a str,
    ) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            // Rows matched, not changed: sqlx asks for found rows.
            let done = sqlx::query(&format!("UPDATE {steps} SET result = ? WHERE run_id = ? AND step = ?"))
                .bind(json)
                .bind(run_id)
                .bind(step)
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
                "CREATE TABLE IF NOT EXISTS gnomon_fence (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY, \
                 attempt BIGINT NOT NULL, token BIGINT NOT NULL, written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB",
                "CREATE TABLE IF NOT EXISTS gnomon_steps (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL, \
                 step VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, attempt BIGINT NOT NULL, token BIGINT NOT NULL, \
                 result TEXT, committed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), PRIMARY KEY (run_id, step)) ENGINE=InnoDB",
            ]
        );
        let o = Options::default();
        assert_eq!(limit_sql(&o, true), "SET SESSION innodb_lock_wait_timeout = 5, idle_transaction_timeout = 10");
        assert_eq!(limit_sql(&o, false), "SET SESSION innodb_lock_wait_timeout = 5, wait_timeout = 10");
    }

    #[test]
    fn limits_are_whole_seconds_rounded_up() {
        assert_eq!(whole_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(5)), 5);
        assert_eq!(whole_seconds(Duration::ZERO), 1, "never 0, which is no limit");
        assert_eq!(whole_seconds(Duration::from_secs(u64::MAX)), 31_536_000);
    }
}
