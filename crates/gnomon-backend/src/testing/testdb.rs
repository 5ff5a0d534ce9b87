//! Throwaway databases on the MySQL/MariaDB and PostgreSQL test servers, so
//! every test (and every parallel test run) has its own schema.
//!
//! The servers come from `GNOMON_TEST_MYSQL_URL` and `GNOMON_TEST_POSTGRES_URL`,
//! defaulting to the local servers that `scripts/test.sh` installs and starts.
//! A server that cannot be reached is an error, never a silent skip.

use sqlx::{Connection, Executor};

pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";
pub const DEFAULT_POSTGRES_URL: &str = "postgres://root@127.0.0.1:5432/test";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    MySql,
    Postgres,
}

impl Server {
    pub fn base_url(self) -> String {
        let (var, default) = match self {
            Server::MySql => ("GNOMON_TEST_MYSQL_URL", DEFAULT_MYSQL_URL),
            Server::Postgres => ("GNOMON_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL),
        };
        std::env::var(var).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_string())
    }
}

/// `url` with its database (path) replaced by `name`; query parameters kept.
pub fn with_database(url: &str, name: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let authority = before_query.split('/').next().unwrap_or(before_query);
    let mut out = format!("{scheme}://{authority}/{name}");
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// A database created for one test; [`TestDb::drop_database`] removes it.
#[derive(Debug)]
pub struct TestDb {
    pub server: Server,
    pub url: String,
    pub name: String,
    admin_url: String,
}

impl TestDb {
    pub async fn create(server: Server) -> Result<TestDb, String> {
        let admin_url = server.base_url();
        let name = format!("gnomon_t_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        let sql = format!("CREATE DATABASE {name}");
        let unreachable = |e: sqlx::Error| {
            format!(
                "{server:?} test server at {admin_url} is not usable ({e}); scripts/test.sh installs and starts it, or set {}",
                match server {
                    Server::MySql => "GNOMON_TEST_MYSQL_URL",
                    Server::Postgres => "GNOMON_TEST_POSTGRES_URL",
                }
            )
        };
        match server {
            Server::MySql => {
                let mut c = sqlx::MySqlConnection::connect(&admin_url).await.map_err(unreachable)?;
                c.execute(sqlx::raw_sql(&sql)).await.map_err(unreachable)?;
                let _ = c.close().await;
            }
            Server::Postgres => {
                let mut c = sqlx::PgConnection::connect(&admin_url).await.map_err(unreachable)?;
                c.execute(sqlx::raw_sql(&sql)).await.map_err(unreachable)?;
                let _ = c.close().await;
            }
        }
        Ok(TestDb { server, url: with_database(&admin_url, &name), name, admin_url })
    }

    /// Ends every connection to this database but the caller's, as a
    /// database failover or an administrator would (PostgreSQL
    /// `pg_terminate_backend`, MySQL/MariaDB `KILL`); returns how many.
    pub async fn kill_connections(&self) -> Result<usize, String> {
        match self.server {
            Server::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.admin_url).await.map_err(|e| e.to_string())?;
                let rows =
                    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()")
                        .bind(&self.name)
                        .fetch_all(&mut c)
                        .await
                        .map_err(|e| e.to_string())?;
                let _ = c.close().await;
                Ok(rows.len())
            }
            Server::MySql => {
                use sqlx::Row;
                let mut c = sqlx::MySqlConnection::connect(&self.admin_url).await.map_err(|e| e.to_string())?;
                let rows = sqlx::query("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()")
                    .bind(&self.name)
                    .fetch_all(&mut c)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut killed = 0;
                for r in rows {
                    let id: u64 =
                        r.try_get::<u64, _>(0).or_else(|_| r.try_get::<i64, _>(0).map(|v| v as u64)).map_err(|e| e.to_string())?;
                    // A connection that ended meanwhile is not an error.
                    if c.execute(sqlx::raw_sql(&format!("KILL {id}"))).await.is_ok() {
                        killed += 1;
                    }
                }
                let _ = c.close().await;
                Ok(killed)
            }
        }
    }

    /// Drops the database (best effort: a failure is only logged).
    pub async fn drop_database(self) {
        let sql = match self.server {
            Server::MySql => format!("DROP DATABASE IF EXISTS {}", self.name),
            Server::Postgres => format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        };
        let result = match self.server {
            Server::MySql => match sqlx::MySqlConnection::connect(&self.admin_url).await {
                Ok(mut c) => c.execute(sqlx::raw_sql(&sql)).await.map(|_| ()),
                Err(e) => Err(e),
            },
            Server::Postgres => match sqlx::PgConnection::connect(&self.admin_url).await {
                Ok(mut c) => c.execute(sqlx::raw_sql(&sql)).await.map(|_| ()),
                Err(e) => Err(e),
            },
        };
        if let Err(e) = result {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
    }
}

/// The test etcd cluster: `GNOMON_TEST_ETCD`, else the 3 members that
/// `scripts/test.sh` starts on 127.0.0.1:23791-23793.
pub fn etcd_endpoints() -> String {
    std::env::var("GNOMON_TEST_ETCD")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_is_replaced_and_parameters_kept() {
        assert_eq!(with_database("mysql://root@127.0.0.1:3306/test", "x"), "mysql://root@127.0.0.1:3306/x");
        assert_eq!(with_database("postgres://u:p@h:5432/test?sslmode=disable", "x"), "postgres://u:p@h:5432/x?sslmode=disable");
        assert_eq!(with_database("postgres://h:5432", "x"), "postgres://h:5432/x");
    }
}
