//! The store and elector conformance suites against the real MySQL/MariaDB
//! and PostgreSQL servers, each test in a database of its own, plus the
//! start-up errors a user sees for a bad URL, credentials or privileges.

use std::sync::Arc;

use gnomon_backend::election::LocalElector;
use gnomon_backend::testing::conformance::{elector_suite, store_suite};
use gnomon_backend::testing::testdb::{with_database, Server, TestDb};
use gnomon_backend::{open_store, open_store_with, Store, StoreError, StoreOptions};

async fn suites_pass_on(server: Server) {
    let db = TestDb::create(server).await.unwrap_or_else(|e| panic!("{e}"));
    let url = db.url.clone();
    store_suite(move || {
        let url = url.clone();
        async move { open_store(&url).await.unwrap_or_else(|e| panic!("opening {url}: {e}")) }
    })
    .await;
    let store: Arc<dyn Store> = open_store(&db.url).await.expect("open");
    elector_suite(store.clone(), Arc::new(LocalElector::new(store))).await;
    db.drop_database().await;
}

#[tokio::test]
async fn conformance_suites_pass_on_mysql() {
    suites_pass_on(Server::MySql).await;
}

#[tokio::test]
async fn conformance_suites_pass_on_postgres() {
    suites_pass_on(Server::Postgres).await;
}

#[tokio::test]
async fn migrations_are_idempotent_and_concurrent_opens_agree() {
    for server in [Server::MySql, Server::Postgres] {
        let db = TestDb::create(server).await.unwrap_or_else(|e| panic!("{e}"));
        let (a, b, c) = tokio::join!(open_store(&db.url), open_store(&db.url), open_store(&db.url));
        for s in [a, b, c] {
            s.unwrap_or_else(|e| panic!("{server:?}: concurrent open failed: {e}"));
        }
        open_store(&db.url).await.expect("re-open");
        db.drop_database().await;
    }
}

fn quick() -> StoreOptions {
    StoreOptions { connect_timeout: std::time::Duration::from_secs(3), ..Default::default() }
}

#[tokio::test]
async fn start_up_errors_are_clear() {
    // Nothing listens on this port: unreachable, said so.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    for url in [format!("mysql://root@127.0.0.1:{free}/test"), format!("postgres://root@127.0.0.1:{free}/test")] {
        let e = open_store_with(&url, &quick()).await.expect_err("unreachable");
        assert!(matches!(e, StoreError::Unavailable(_)) && e.to_string().contains("unreachable"), "{url}: {e}");
        assert!(!e.to_string().contains("root@"), "credentials are not echoed: {e}");
    }
    // Wrong credentials.
    let mysql = Server::MySql.base_url().replacen("mysql://root@", "mysql://root:definitely-wrong@", 1);
    let e = open_store_with(&mysql, &quick()).await.expect_err("bad password");
    assert!(e.to_string().contains("authentication failed"), "{e}");
    assert!(!e.to_string().contains("definitely-wrong"), "the password is not echoed: {e}");
    let pg = Server::Postgres.base_url().replacen("postgres://root@", "postgres://no_such_role_gnomon@", 1);
    let e = open_store_with(&pg, &quick()).await.expect_err("bad role");
    assert!(e.to_string().contains("authentication failed"), "{e}");
    // A database that does not exist.
    for server in [Server::MySql, Server::Postgres] {
        let url = with_database(&server.base_url(), "gnomon_no_such_db");
        let e = open_store_with(&url, &quick()).await.expect_err("missing database");
        assert!(e.to_string().contains("does not exist"), "{server:?}: {e}");
    }
    // Bad pool sizes and a malformed URL.
    let bad = StoreOptions { pool_max: 0, ..Default::default() };
    assert!(matches!(open_store_with(&Server::MySql.base_url(), &bad).await, Err(StoreError::InvalidUrl(_))));
    assert!(matches!(open_store("postgres://127.0.0.1:notaport/x").await, Err(StoreError::InvalidUrl(_))));
}

#[tokio::test]
async fn a_user_without_write_privileges_is_refused_at_start() {
    use sqlx::{Connection, Executor};
    // MySQL: a user that may only read gnomon's (already migrated) tables.
    let db = TestDb::create(Server::MySql).await.unwrap_or_else(|e| panic!("{e}"));
    open_store(&db.url).await.expect("migrate as root");
    let user = format!("gnomon_ro_{:06x}", rand::random::<u32>() & 0xffffff);
    let mut admin = sqlx::MySqlConnection::connect(&Server::MySql.base_url()).await.expect("admin");
    admin.execute(sqlx::raw_sql(&format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'; CREATE USER '{user}'@'localhost' IDENTIFIED BY 'pw'; GRANT SELECT ON {}.* TO '{user}'@'%'; GRANT SELECT ON {}.* TO '{user}'@'localhost'", db.name, db.name))).await.expect("create user");
    let url = db.url.replacen("mysql://root@", &format!("mysql://{user}:pw@"), 1);
    let e = open_store_with(&url, &quick()).await.expect_err("read-only user");
    assert!(e.to_string().to_lowercase().contains("privilege") || e.to_string().contains("denied"), "{e}");
    admin.execute(sqlx::raw_sql(&format!("DROP USER '{user}'@'%'; DROP USER '{user}'@'localhost'"))).await.expect("drop user");
    db.drop_database().await;

    // PostgreSQL: a role with SELECT only.
    let db = TestDb::create(Server::Postgres).await.unwrap_or_else(|e| panic!("{e}"));
    open_store(&db.url).await.expect("migrate as root");
    let mut admin = sqlx::PgConnection::connect(&db.url).await.expect("admin");
    admin
        .execute(sqlx::raw_sql(&format!(
            "CREATE ROLE {user} LOGIN; GRANT SELECT ON ALL TABLES IN SCHEMA public TO {user}; GRANT CONNECT ON DATABASE {} TO {user}",
            db.name
        )))
        .await
        .expect("create role");
    let url = db.url.replacen("postgres://root@", &format!("postgres://{user}@"), 1);
    let e = open_store_with(&url, &quick()).await.expect_err("read-only role");
    assert!(e.to_string().to_lowercase().contains("privilege") || e.to_string().contains("denied"), "{e}");
    let _ = admin.close().await;
    db.drop_database().await;
    let mut admin = sqlx::PgConnection::connect(&Server::Postgres.base_url()).await.expect("admin");
    admin.execute(sqlx::raw_sql(&format!("DROP ROLE IF EXISTS {user}"))).await.expect("drop role");
}

/// A fire and a turn of 150 runs of 128 KiB each (19 MiB of params and
/// payloads, then 9.6 MiB of outputs) are written whole on every SQL store:
/// a statement is bounded by bytes as well as by rows (MySQL's default
/// `max_allowed_packet` is 16 MiB).
#[tokio::test]
async fn a_turn_larger_than_one_statement_is_written() {
    use gnomon_backend::testing::conformance::a_turn_of_the_largest_runs_is_written;
    for server in [Server::MySql, Server::Postgres] {
        let db = TestDb::create(server).await.unwrap_or_else(|e| panic!("{e}"));
        let store = open_store(&db.url).await.expect("open");
        a_turn_of_the_largest_runs_is_written(store.as_ref(), 150).await;
        db.drop_database().await;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&format!("sqlite://{}", dir.path().join("s.db").display())).await.expect("open sqlite");
    a_turn_of_the_largest_runs_is_written(store.as_ref(), 150).await;
}
