//! `pg_try_advisory_lock` on a dedicated PostgreSQL connection.
use std::time::Duration;

use async_trait::async_trait;

use crate::election::*;
use crate::ElectionError;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Executor};
use std::str::FromStr;

#[derive(Debug)]
pub struct PgLock {
    options: PgConnectOptions,
    ttl: Duration,
}

impl PgLock {
    pub fn new(url: &str, ttl: Duration) -> Result<Self, ElectionError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| ElectionError::Refused(format!("invalid PostgreSQL URL {}: {e}", crate::sql::redact(url))))?
            .log_statements(tracing::log::LevelFilter::Trace);
        Ok(Self { options, ttl })
    }
}

struct Session {
    conn: PgConnection,
    key: i64,
}

/// How often a waiting candidate retries `pg_try_advisory_lock`.
const POLL: Duration = Duration::from_millis(200);

#[async_trait]
impl LockConnector for PgLock {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn connect(&self, scope: &str) -> Result<Box<dyn LockSession>, String> {
        let mut conn = self.options.connect().await.map_err(|e| e.to_string())?;
        let ttl_ms = self.ttl.as_millis().max(1000);
        let ttl_s = self.ttl.as_secs().max(1);
        // TCP keepalives bound a hold across a dead network path; the
        // idle-session timeout (PostgreSQL 14+) bounds it for a leader
        // that is alive but silent (paused, or behind a black hole).
        let set = format!(
            "SET tcp_keepalives_idle = 1; SET tcp_keepalives_interval = 1; SET tcp_keepalives_count = {ttl_s}; SET statement_timeout = {ttl_ms}"
        );
        conn.execute(set.as_str()).await.map_err(|e| e.to_string())?;
        let idle = format!("SET idle_session_timeout = {ttl_ms}");
        if let Err(e) = conn.execute(idle.as_str()).await {
            tracing::warn!(error = %e, "PostgreSQL before 14 has no idle_session_timeout: a paused leader holds the advisory lock until its TCP connection dies");
        }
        Ok(Box::new(Session { conn, key: fnv1a(&format!("gnomon/{scope}")) as i64 }))
    }
}

#[async_trait]
impl LockSession for Session {
    async fn acquire(&mut self, wait: Duration) -> Result<bool, String> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(self.key)
                .fetch_one(&mut self.conn)
                .await
                .map_err(|e| e.to_string())?;
            if got {
                return Ok(true);
            }
            if tokio::time::Instant::now() + POLL > deadline {
                return Ok(false);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn holds(&mut self) -> Result<bool, String> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
             AND classid = (($1::bigint >> 32) & 4294967295)::bigint::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1)",
        )
        .bind(self.key)
        .fetch_one(&mut self.conn)
        .await
        .map_err(|e| e.to_string())
    }

    async fn release(&mut self) -> Result<(), String> {
        sqlx::query("SELECT pg_advisory_unlock($1)").bind(self.key).execute(&mut self.conn).await.map_err(|e| e.to_string())?;
        Ok(())
    }
}
