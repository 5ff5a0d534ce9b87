//! The steps on MySQL or MariaDB (InnoDB).
//!
//! Reads of the steps table are locking reads (`LOCK IN SHARE MODE`):
//! at InnoDB's default `REPEATABLE READ` a plain read could come from a
//! snapshot taken before another attempt's step commit.

use std::time::Duration;

use sqlx::{Executor, MySql, MySqlConnection};

use crate::dialect::{Dialect, Tables};
use crate::{BoxFuture, FenceError, Options};

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
    fn create_sql(t: &Tables) -> [String; 2] {
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

    fn limit<'a>(conn: &'a mut MySqlConnection, o: &'a Options) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(async move {
            let mariadb: i64 = sqlx::query_scalar("SELECT VERSION() LIKE '%MariaDB%'").fetch_one(&mut *conn).await?;
            conn.execute(sqlx::raw_sql(&limit_sql(o, mariadb != 0))).await?;
            Ok(())
        })
    }

    fn insert_run_sql(fence: &str) -> String {
        format!("INSERT INTO {fence} (run_id, attempt, token) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE run_id = run_id")
    }

    fn lock_run_sql(fence: &str) -> String {
        format!("SELECT attempt, token FROM {fence} WHERE run_id = ? FOR UPDATE")
    }

    fn find_step_sql(steps: &str) -> String {
        format!("SELECT attempt, token, result FROM {steps} WHERE run_id = ? AND step = ? LOCK IN SHARE MODE")
    }

    fn insert_step_sql(steps: &str) -> String {
        // A plain INSERT: a duplicate is the step's record (and fails
        // only this statement); INSERT IGNORE would also let a value
        // the column cannot hold through, altered.
        format!("INSERT INTO {steps} (run_id, step, attempt, token) VALUES (?, ?, ?, ?)")
    }

    fn raise_run_sql(fence: &str) -> String {
        format!("UPDATE {fence} SET attempt = ?, token = ?, written_at = CURRENT_TIMESTAMP(3) WHERE run_id = ?")
    }

    fn record_sql(steps: &str) -> String {
        // Rows matched, not changed: sqlx asks for found rows.
        format!("UPDATE {steps} SET result = ? WHERE run_id = ? AND step = ?")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statements() {
        let t = Tables::new("gnomon").unwrap();
        assert_eq!(
            MySql::create_sql(&t),
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
