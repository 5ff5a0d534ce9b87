//! The elector conformance suites against real servers: the MySQL/MariaDB
//! `GET_LOCK` elector, the PostgreSQL advisory-lock elector and the etcd
//! election (3-member cluster on loopback, with a SQLite store), plus their
//! start-up errors.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gnomon_backend::election::ElectionConfig;
use gnomon_backend::electors::lock_elector_for;
use gnomon_backend::testing::conformance::{contested_elector_suite, ElectorFixture};
use gnomon_backend::testing::testdb::{etcd_endpoints, Server, TestDb};
use gnomon_backend::{open_store, ElectionError, Elector, Store};
use sqlx::{Connection, Executor};

fn config() -> ElectionConfig {
    ElectionConfig { ttl: Duration::from_secs(3), ..Default::default() }
}

struct SqlFixture {
    db: TestDb,
    store: Arc<dyn Store>,
}

#[async_trait]
impl ElectorFixture for SqlFixture {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }
    async fn candidate(&self) -> Arc<dyn Elector> {
        Arc::new(lock_elector_for(&self.db.url, self.store.clone(), config()).await.expect("lock elector").expect("a SQL store has one"))
    }
    async fn sever(&self, scope: &str) {
        // Kill the holder's lock connection from outside, as a crash would.
        match self.db.server {
            Server::MySql => {
                let mut admin = sqlx::MySqlConnection::connect(&self.db.url).await.expect("admin");
                let holder: Option<i64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(CONCAT('gnomon/', DATABASE(), '/', ?)) AS SIGNED)")
                    .bind(scope)
                    .fetch_one(&mut admin)
                    .await
                    .expect("find holder");
                let id = holder.expect("a connection holds the lock");
                admin.execute(format!("KILL {id}").as_str()).await.expect("kill");
            }
            Server::Postgres => {
                let mut admin = sqlx::PgConnection::connect(&self.db.url).await.expect("admin");
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND granted \
                     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND pid <> pg_backend_pid()",
                )
                .fetch_one(&mut admin)
                .await
                .expect("terminate holder");
                assert_eq!(n, 1, "exactly one backend holds an advisory lock");
            }
        }
    }
    fn loss_bound(&self) -> Duration {
        Duration::from_secs(10)
    }
}

async fn sql_suite(server: Server) {
    let db = TestDb::create(server).await.unwrap_or_else(|e| panic!("{e}"));
    let store = open_store(&db.url).await.expect("open");
    let fx = SqlFixture { db, store };
    contested_elector_suite(&fx).await;
    fx.db.drop_database().await;
}

#[tokio::test]
async fn mysql_get_lock_elector_conforms() {
    sql_suite(Server::MySql).await;
}

#[tokio::test]
async fn postgres_advisory_lock_elector_conforms() {
    sql_suite(Server::Postgres).await;
}

struct EtcdFixture {
    endpoints: Vec<String>,
    cluster: String,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

#[async_trait]
impl ElectorFixture for EtcdFixture {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }
    async fn candidate(&self) -> Arc<dyn Elector> {
        let e = gnomon_backend::etcd::EtcdElector::new(self.endpoints.clone(), &self.cluster, self.store.clone(), config());
        e.client().await.unwrap_or_else(|e| panic!("{e}"));
        Arc::new(e)
    }
    async fn sever(&self, scope: &str) {
        // Revoke the leader's lease from another client, as etcd does when
        // keep-alives stop arriving.
        let mut c = etcd_client::Client::connect(&self.endpoints, None).await.expect("etcd");
        let name = format!("/gnomon/{}/election/{scope}", self.cluster);
        let leader = c.leader(name).await.expect("leader");
        let lease = leader.kv().expect("a leader key").lease();
        c.lease_revoke(lease).await.expect("revoke");
    }
    fn loss_bound(&self) -> Duration {
        Duration::from_secs(10)
    }
}

#[tokio::test]
async fn etcd_election_conforms() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = open_store(&format!("sqlite://{}", dir.path().join("s.db").display())).await.expect("sqlite");
    let endpoints = gnomon_backend::etcd::parse_endpoints(&etcd_endpoints()).expect("endpoints");
    let fx = EtcdFixture { endpoints, cluster: format!("conf-{:08x}", rand::random::<u32>()), store, _dir: dir };
    contested_elector_suite(&fx).await;
}

#[tokio::test]
async fn etcd_start_up_errors_are_clear() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let Err(e) = gnomon_backend::etcd::connect(&[format!("http://127.0.0.1:{free}")], Duration::from_secs(2)).await else {
        panic!("connected to a port nobody listens on")
    };
    assert!(matches!(e, ElectionError::Unavailable(_)), "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{free}")), "names the endpoint: {e}");
}
