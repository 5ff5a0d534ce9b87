//! `GET_LOCK` on a dedicated MySQL/MariaDB connection.
use std::time::Duration;

use async_trait::async_trait;

use crate::election::*;
use crate::ElectionError;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Executor};
use std::str::FromStr;

#[derive(Debug)]
pub struct MySqlLock {
    options: MySqlConnectOptions,
    ttl: Duration,
}

impl MySqlLock {
    pub fn new(url: &str, ttl: Duration) -> Result<Self, ElectionError> {
        let options = MySqlConnectOptions::from_str(url)
            .map_err(|e| ElectionError::Refused(format!("invalid MySQL URL {}: {e}", crate::sql::redact(url))))?
            .log_statements(tracing::log::LevelFilter::Trace);
        Ok(Self { options, ttl })
    }
}

struct Session {
    conn: MySqlConnection,
    name: String,
}

#[async_trait]
impl LockConnector for MySqlLock {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    async fn connect(&self, scope: &str) -> Result<Box<dyn LockSession>, String> {
        let mut conn = self.options.connect().await.map_err(|e| e.to_string())?;
        // A leader that stops talking (paused, cut off) is disconnected
        // by the server after the TTL, which releases its lock.
        let ttl = self.ttl.as_secs().max(1);
        let set = format!("SET SESSION wait_timeout = {ttl}, SESSION interactive_timeout = {ttl}, SESSION net_write_timeout = {ttl}");
        conn.execute(set.as_str()).await.map_err(|e| e.to_string())?;
        let db: Option<String> = sqlx::query_scalar("SELECT DATABASE()").fetch_one(&mut conn).await.map_err(|e| e.to_string())?;
        // Lock names are server-wide: include the database. At most 64 characters.
        let mut name = format!("gnomon/{}/{scope}", db.unwrap_or_default());
        if name.len() > 64 {
            name = format!("gnomon/{:016x}", fnv1a(&name));
        }
        Ok(Box::new(Session { conn, name }))
    }
}

#[async_trait]
impl LockSession for Session {
    async fn acquire(&mut self, wait: Duration) -> Result<bool, String> {
        // 1: taken; 0: timed out; NULL: error (e.g. the thread was killed).
        let got: i64 = sqlx::query_scalar("SELECT CAST(COALESCE(GET_LOCK(?, ?), -1) AS SIGNED)")
            .bind(&self.name)
            .bind(wait.as_secs() as i64)
            .fetch_one(&mut self.conn)
            .await
            .map_err(|e| e.to_string())?;
        match got {
            1 => Ok(true),
            0 => Ok(false),
            _ => Err("GET_LOCK returned NULL".into()),
        }
    }

    async fn holds(&mut self) -> Result<bool, String> {
        let held: i64 = sqlx::query_scalar("SELECT CAST(COALESCE(IS_USED_LOCK(?) = CONNECTION_ID(), 0) AS SIGNED)")
            .bind(&self.name)
            .fetch_one(&mut self.conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(held == 1)
    }

    async fn release(&mut self) -> Result<(), String> {
        sqlx::query("SELECT RELEASE_LOCK(?)").bind(&self.name).execute(&mut self.conn).await.map_err(|e| e.to_string())?;
        Ok(())
    }
}
