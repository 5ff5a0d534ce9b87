//! The guard against real PostgreSQL and MariaDB servers (the ones
//! `scripts/test.sh` starts): attempts in turn, attempts that race for the
//! run's row, and tokens.

use std::future::Future;
use std::time::Duration;

use gnomon_backend::testing::testdb::{Server, TestDb};
use gnomon_fence::{Fence, FenceError};
use sqlx::{Connection, MySqlConnection, PgConnection};

fn fence(run: &str, attempt: u32, token: u64) -> Fence {
    Fence { run_id: run.into(), attempt, token }
}

/// One database's guard, table creation and "the job's own write".
trait Db: Sized + Send {
    fn open(url: &str) -> impl Future<Output = Self> + Send;
    fn setup(&mut self) -> impl Future<Output = ()> + Send;
    /// In one transaction: the guard, then the job's row; committed only
    /// if the guard admits it. `hold` keeps the transaction open (after
    /// the guard) until it fires.
    fn write(&mut self, f: &Fence, hold: Option<Hold>) -> impl Future<Output = Result<(), FenceError>> + Send;
    fn rows(&mut self, run: &str) -> impl Future<Output = Vec<i64>> + Send;
}

type Hold = tokio::sync::oneshot::Receiver<()>;

impl Db for PgConnection {
    async fn open(url: &str) -> Self {
        PgConnection::connect(url).await.expect("postgres")
    }
    async fn setup(&mut self) {
        gnomon_fence::create_table_postgres(self, "gnomon_fence").await.unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS effects (run_id TEXT NOT NULL, attempt BIGINT NOT NULL)").execute(self).await.unwrap();
    }
    async fn write(&mut self, f: &Fence, hold: Option<Hold>) -> Result<(), FenceError> {
        let mut tx = self.begin().await?;
        gnomon_fence::guard_postgres(&mut tx, f).await?;
        if let Some(h) = hold {
            let _ = h.await;
        }
        sqlx::query("INSERT INTO effects (run_id, attempt) VALUES ($1, $2)")
            .bind(&f.run_id)
            .bind(i64::from(f.attempt))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
    async fn rows(&mut self, run: &str) -> Vec<i64> {
        sqlx::query_scalar("SELECT attempt FROM effects WHERE run_id = $1 ORDER BY attempt").bind(run).fetch_all(self).await.unwrap()
    }
}

impl Db for MySqlConnection {
    async fn open(url: &str) -> Self {
        MySqlConnection::connect(url).await.expect("mysql")
    }
    async fn setup(&mut self) {
        gnomon_fence::create_table_mysql(self, "gnomon_fence").await.unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS effects (run_id VARCHAR(255) NOT NULL, attempt BIGINT NOT NULL)")
            .execute(self)
            .await
            .unwrap();
    }
    async fn write(&mut self, f: &Fence, hold: Option<Hold>) -> Result<(), FenceError> {
        let mut tx = self.begin().await?;
        gnomon_fence::guard_mysql(&mut tx, f).await?;
        if let Some(h) = hold {
            let _ = h.await;
        }
        sqlx::query("INSERT INTO effects (run_id, attempt) VALUES (?, ?)")
            .bind(&f.run_id)
            .bind(i64::from(f.attempt))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
    async fn rows(&mut self, run: &str) -> Vec<i64> {
        sqlx::query_scalar("SELECT attempt FROM effects WHERE run_id = ? ORDER BY attempt").bind(run).fetch_all(self).await.unwrap()
    }
}

async fn suite<D: Db + 'static>(url: &str) {
    let mut a = D::open(url).await;
    a.setup().await;
    // In turn: the retry writes after the first attempt; the first
    // attempt, back, is refused and its write rolled back.
    a.write(&fence("r1", 1, 5), None).await.unwrap();
    a.write(&fence("r1", 1, 5), None).await.expect("an attempt may write again");
    a.write(&fence("r1", 2, 5), None).await.unwrap();
    let e = a.write(&fence("r1", 1, 5), None).await.unwrap_err();
    assert!(e.is_superseded(), "{e}");
    assert!(e.to_string().contains("attempt 2"), "{e}");
    assert_eq!(a.rows("r1").await, [1, 1, 2]);
    // A higher token of the same attempt (a new leader reassigned it).
    a.write(&fence("r2", 1, 7), None).await.unwrap();
    assert!(a.write(&fence("r2", 1, 6), None).await.unwrap_err().is_superseded());
    assert_eq!(a.rows("r2").await, [1]);

    // Racing: the first attempt holds the row (guarded, not committed);
    // the retry waits for it, then commits after it.
    let (release, hold) = tokio::sync::oneshot::channel();
    let url1 = url.to_string();
    let first = tokio::spawn(async move { D::open(&url1).await.write(&fence("r3", 1, 5), Some(hold)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let url2 = url.to_string();
    let second = tokio::spawn(async move { D::open(&url2).await.write(&fence("r3", 2, 5), None).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "the retry waits for the row");
    release.send(()).unwrap();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(a.rows("r3").await, [1, 2]);
    // The other way round: the retry holds the row; the stale attempt
    // waits, then is refused.
    let (release, hold) = tokio::sync::oneshot::channel();
    let url1 = url.to_string();
    let retry = tokio::spawn(async move { D::open(&url1).await.write(&fence("r4", 2, 5), Some(hold)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let url2 = url.to_string();
    let stale = tokio::spawn(async move { D::open(&url2).await.write(&fence("r4", 1, 5), None).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    release.send(()).unwrap();
    retry.await.unwrap().unwrap();
    assert!(stale.await.unwrap().unwrap_err().is_superseded());
    assert_eq!(a.rows("r4").await, [2]);
}

#[tokio::test]
async fn the_guard_on_postgres() {
    let db = TestDb::create(Server::Postgres).await.expect("a PostgreSQL test database (scripts/test.sh starts the server)");
    suite::<PgConnection>(&db.url).await;
    db.drop_database().await;
}

#[tokio::test]
async fn the_guard_on_mariadb() {
    let db = TestDb::create(Server::MySql).await.expect("a MariaDB test database (scripts/test.sh starts the server)");
    suite::<MySqlConnection>(&db.url).await;
    db.drop_database().await;
}
