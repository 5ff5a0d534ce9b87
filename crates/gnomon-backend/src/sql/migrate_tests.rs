//! The migrations: the files and their numbering, an upgrade from every
//! version each database has had (old numbering included), concurrent
//! opens, and the refusal of a schema newer than this build.
//! MySQL and PostgreSQL tests run on the test servers, each case in a
//! database of its own.

use std::collections::BTreeSet;
use std::sync::Arc;

use sqlx::{Connection, Executor};

use super::migrate::{split_statements, translate_legacy, Migration, LEGACY_SERVER, LEGACY_SQLITE, MYSQL, POSTGRES, SQLITE};
use crate::mysql::MySqlStore;
use crate::postgres::PgStore;
use crate::sqlite::SqliteStore;
use crate::testing::conformance::job_spec;
use crate::testing::testdb::{Server, TestDb};
use crate::{Store, StoreError, StoreOptions};
use gnomon_core::RunState;

const LATEST: i64 = 13;

/// Old SQLite versions 1–11, by the step each added.
const OLD_SQLITE_STEPS: [&str; 11] = [
    "initial",
    "leaner_run_indexes",
    "pause_times",
    "manual_run_ids",
    "schedule_changes",
    "leader_time",
    "notifications",
    "run_params",
    "run_payload",
    "run_upstream",
    "backfills",
];

/// Old MySQL and PostgreSQL versions 1–10: never SQLite's second step.
const OLD_SERVER_STEPS: [&str; 10] = [
    "initial",
    "pause_times",
    "manual_run_ids",
    "schedule_changes",
    "leader_time",
    "notifications",
    "run_params",
    "run_payload",
    "run_upstream",
    "backfills",
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Db {
    Sqlite,
    MySql,
    Postgres,
}

impl Db {
    fn migrations(self) -> &'static [Migration] {
        match self {
            Db::Sqlite => SQLITE,
            Db::MySql => MYSQL,
            Db::Postgres => POSTGRES,
        }
    }

    fn legacy(self) -> &'static [(i64, i64)] {
        match self {
            Db::Sqlite => LEGACY_SQLITE,
            _ => LEGACY_SERVER,
        }
    }

    /// The steps each old version had, in order, as the history of the
    /// backends' migration arrays has them (independent of the mapping
    /// under test).
    fn old_steps(self) -> &'static [&'static str] {
        match self {
            Db::Sqlite => &OLD_SQLITE_STEPS,
            _ => &OLD_SERVER_STEPS,
        }
    }

    fn dir(self) -> &'static str {
        match self {
            Db::Sqlite => "sqlite",
            Db::MySql => "mysql",
            Db::Postgres => "postgres",
        }
    }
}

/// Runs SQL text (one statement or several) on the database at `url`.
async fn exec(db: Db, url: &str, sql: &str) {
    let result = match db {
        Db::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc")).await.expect("connect");
            c.execute(sqlx::raw_sql(sql)).await.map(|_| ())
        }
        Db::MySql => {
            let mut c = sqlx::MySqlConnection::connect(url).await.expect("connect");
            c.execute(sqlx::raw_sql(sql)).await.map(|_| ())
        }
        Db::Postgres => {
            let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
            c.execute(sqlx::raw_sql(sql)).await.map(|_| ())
        }
    };
    result.unwrap_or_else(|e| panic!("{db:?}: {e}\n{sql}"));
}

/// One integer a query returns.
async fn scalar(db: Db, url: &str, sql: &str) -> i64 {
    match db {
        Db::Sqlite => sqlx::query_scalar(sql).fetch_one(&mut sqlx::SqliteConnection::connect(url).await.unwrap()).await.unwrap(),
        Db::MySql => sqlx::query_scalar(sql).fetch_one(&mut sqlx::MySqlConnection::connect(url).await.unwrap()).await.unwrap(),
        Db::Postgres => sqlx::query_scalar(sql).fetch_one(&mut sqlx::PgConnection::connect(url).await.unwrap()).await.unwrap(),
    }
}

async fn open(db: Db, url: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match db {
        Db::Sqlite => Arc::new(SqliteStore::open(url).await?) as Arc<dyn Store>,
        Db::MySql => Arc::new(MySqlStore::open(url, &StoreOptions::default()).await?),
        Db::Postgres => Arc::new(PgStore::open(url, &StoreOptions::default()).await?),
    })
}

/// The upstream record the fixture's dependency run carries.
const UPSTREAM: &str = r#"{"of":"u0-6000","of_uid":"u0","edges":[{"job":"extract","uid":"u0","on":"succeeded"}]}"#;

/// A database exactly as the old numbering left it at `old`: the
/// `gnomon_migrations` table with rows `1..=old`, the steps up to the one
/// `old` is, and a job with a run and its attempt (and, once runs have an
/// `upstream` column, a waiting dependency run).
async fn build_old(db: Db, url: &str, old: i64) {
    let steps = &db.old_steps()[..old as usize];
    let mut sql = String::from("CREATE TABLE gnomon_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL);\n");
    for v in 1..=old {
        sql += &format!("INSERT INTO gnomon_migrations (version, applied_at) VALUES ({v}, {v});\n");
    }
    for m in steps.iter().map(|name| db.migrations().iter().find(|m| m.name == *name).expect("a step of the files")) {
        for stmt in m.statements() {
            sql += &stmt;
            sql += ";\n";
        }
    }
    let spec = serde_json::to_string(&job_spec("nightly")).unwrap().replace('\'', "''");
    let report = r#"{"name":"report","after":[{"job":"extract"},{"job":"nightly","on":"failed"}],"executor":{"handler":{"name":"noop"}}}"#;
    let report = gnomon_core::spec::parse_job_json(report.as_bytes()).unwrap().compile().unwrap().spec;
    let report = serde_json::to_string(&report).unwrap().replace('\'', "''");
    sql += &format!(
        "INSERT INTO jobs (uid, namespace, name, spec, version, paused, created_at, updated_at, last_scheduled_at, change_seq) \
           VALUES ('u1', 'default', 'nightly', '{spec}', 1, 0, 1000, 1000, 5000, 1);
         INSERT INTO jobs (uid, namespace, name, spec, version, paused, created_at, updated_at, last_scheduled_at, change_seq) \
           VALUES ('u2', 'default', 'report', '{report}', 1, 0, 1000, 1000, NULL, 2);
         UPDATE counters SET value = 2 WHERE name = 'job_change_seq';
         INSERT INTO runs (id, job_uid, namespace, job, scheduled_at, fired_at, state, attempt, updated_at)
           VALUES ('u1-5000', 'u1', 'default', 'nightly', 5000, 5001, 'succeeded', 1, 5100);
         INSERT INTO attempts (run_id, attempt, worker, token, state, assigned_at, started_at, ended_at, exit_code, output)
           VALUES ('u1-5000', 1, 'w1', 7, 'succeeded', 5001, 5002, 5100, 0, 'hello');\n"
    );
    if steps.contains(&"run_upstream") {
        sql += &format!(
            "INSERT INTO runs (id, job_uid, namespace, job, scheduled_at, fired_at, state, attempt, updated_at, upstream)
               VALUES ('u1-d6000', 'u1', 'default', 'nightly', 6000, 6001, 'waiting', 0, 6001, '{UPSTREAM}');\n"
        );
    }
    exec(db, url, &sql).await;
}

/// Opens the database the old numbering left at `old` and checks that it
/// is at the last step with every step recorded once, and that its rows
/// read back whole.
async fn upgrades_from(db: Db, url: &str, old: i64) {
    let store = open(db, url).await.unwrap_or_else(|e| panic!("{db:?} from old version {old}: {e}"));
    let run = store.get_run("u1-5000").await.unwrap().unwrap_or_else(|| panic!("{db:?} {old}: the run survives"));
    assert_eq!((run.run.state, run.run.attempt, run.run.upstream.as_ref()), (RunState::Succeeded, 1, None), "{db:?} {old}");
    assert_eq!(run.attempts.len(), 1, "{db:?} {old}");
    assert_eq!((run.attempts[0].worker.as_str(), run.attempts[0].output.as_str(), run.attempts[0].token), ("w1", "hello", 7));
    let job = store.get_job("default", "nightly").await.unwrap().unwrap_or_else(|| panic!("{db:?} {old}: the job survives"));
    assert_eq!((job.uid.as_str(), job.last_scheduled_at, job.paused_at), ("u1", Some(5000), None), "{db:?} {old}");
    if db.old_steps()[..old as usize].contains(&"run_upstream") {
        let dep = store.get_run("u1-d6000").await.unwrap().expect("the dependency run survives").run;
        let after = dep.upstream.expect("its upstream record");
        assert_eq!((after.of.as_str(), after.edges.len()), ("u0-6000", 1), "{db:?} {old}");
    }
    // The later steps' tables are there and read; the edges index holds
    // the edges of the jobs stored before it.
    assert!(store.list_backfills(None).await.unwrap().is_empty());
    for upstream in ["extract", "nightly"] {
        let after: Vec<String> = store.dependents("default", upstream).await.unwrap().into_iter().map(|j| j.name).collect();
        assert_eq!(after, ["report"], "{db:?} {old}: the jobs after {upstream}");
    }
    assert!(store.dependents("default", "report").await.unwrap().is_empty());
    // The worker bindings table (step 13) is there, empty, and written.
    assert_eq!(store.worker_owner("w1").await.unwrap(), None, "{db:?} {old}: no binding yet");
    assert_eq!(store.bind_worker("w1", "pool", 9).await.unwrap(), "pool", "{db:?} {old}");
    assert!(store.unbind_worker("w1").await.unwrap(), "{db:?} {old}");
    drop(store);
    let steps = scalar(db, url, "SELECT COUNT(*) FROM gnomon_schema").await;
    let max = scalar(db, url, "SELECT MAX(version) FROM gnomon_schema").await;
    assert_eq!((steps, max), (LATEST, LATEST), "{db:?} from old version {old}: every step recorded once");
    assert_eq!(scalar(db, url, "SELECT MAX(version) FROM gnomon_migrations").await, old, "the old record is left as it was");
    if db == Db::Sqlite {
        let rowid = "SELECT COUNT(*) FROM sqlite_master WHERE name = 'attempts' AND sql LIKE '%WITHOUT ROWID%'";
        assert_eq!(scalar(db, url, rowid).await, 1, "attempts are rebuilt WITHOUT ROWID (step 2)");
    }
    // Opening again changes nothing.
    open(db, url).await.expect("reopen");
    assert_eq!(scalar(db, url, "SELECT COUNT(*) FROM gnomon_schema").await, LATEST);
}

/// Every old version of a server database, each in a database of its own.
async fn server_upgrades(db: Db, server: Server) {
    for &(old, _) in LEGACY_SERVER {
        let t = TestDb::create(server).await.unwrap_or_else(|e| panic!("{e}"));
        build_old(db, &t.url, old).await;
        upgrades_from(db, &t.url, old).await;
        t.drop_database().await;
    }
}

#[test]
fn migration_files_are_numbered_alike_on_every_database() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let names = |db: Db| db.migrations().iter().map(|m| (m.version, m.name)).collect::<Vec<_>>();
    for db in [Db::Sqlite, Db::MySql, Db::Postgres] {
        let mut files: Vec<String> =
            std::fs::read_dir(root.join(db.dir())).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        files.sort();
        let listed: Vec<String> = db.migrations().iter().map(|m| format!("{:03}_{}.sql", m.version, m.name)).collect();
        assert_eq!(files, listed, "{db:?}: every file is listed, in order");
        for (i, m) in db.migrations().iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1, "{db:?}: consecutive from 1");
            let text = std::fs::read_to_string(root.join(db.dir()).join(&listed[i])).unwrap();
            assert_eq!(text, m.sql, "{db:?} {}: the embedded text is the file's", m.version);
            assert!(text.starts_with("--"), "{db:?} {}: a file says what its step is", m.version);
            assert!(
                !m.statements().iter().any(|s| ["BEGIN", "COMMIT"].contains(&s.to_uppercase().as_str())),
                "the runner owns transactions"
            );
        }
        assert_eq!(names(db), names(Db::Sqlite), "{db:?}: the same steps as SQLite");
        // Every old version lands on the step it last applied, the last on
        // the last.
        for (i, name) in db.old_steps().iter().enumerate() {
            let old = i as i64 + 1;
            let step = translate_legacy(db.legacy(), old).unwrap_or_else(|| panic!("{db:?}: old version {old} is mapped"));
            assert_eq!(db.migrations()[step as usize - 1].name, *name, "{db:?}: old version {old}");
        }
        assert_eq!(db.legacy().len(), db.old_steps().len(), "{db:?}: no other old version");
        assert_eq!(db.legacy().last().unwrap().1, 11, "{db:?}: the last old version is step 11");
    }
    // SQLite's step 2 is a no-op elsewhere.
    assert!(MYSQL[1].statements().is_empty() && POSTGRES[1].statements().is_empty());
    assert_eq!(SQLITE[1].statements().len(), 7);
}

#[test]
fn statements_are_split_without_comments() {
    let sql = "-- a comment; with a semicolon\nCREATE TABLE a (x INT);\n\n  -- another\nALTER TABLE a ADD COLUMN y INT;\n";
    assert_eq!(split_statements(sql), ["CREATE TABLE a (x INT)", "ALTER TABLE a ADD COLUMN y INT"]);
    assert!(split_statements("-- only a comment\n").is_empty());
}

#[tokio::test]
async fn sqlite_upgrades_from_every_old_version() {
    for &(old, _) in LEGACY_SQLITE {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("gnomon.db").display());
        build_old(Db::Sqlite, &url, old).await;
        upgrades_from(Db::Sqlite, &url, old).await;
    }
}

/// Old version 10 first recreated `runs_open` with `waiting` in it (the
/// step was changed later): a database it migrated upgrades too.
#[tokio::test]
async fn sqlite_upgrades_from_the_first_form_of_old_version_10() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("gnomon.db").display());
    build_old(Db::Sqlite, &url, 10).await;
    exec(
        Db::Sqlite,
        &url,
        "CREATE INDEX runs_open ON runs (state) WHERE state IN ('waiting', 'pending', 'assigned', 'running', 'retrying')",
    )
    .await;
    upgrades_from(Db::Sqlite, &url, 10).await;
}

#[tokio::test]
async fn mysql_upgrades_from_every_old_version() {
    server_upgrades(Db::MySql, Server::MySql).await;
}

#[tokio::test]
async fn postgres_upgrades_from_every_old_version() {
    server_upgrades(Db::Postgres, Server::Postgres).await;
}

/// A MySQL step is not transactional: one whose changes were made but
/// whose version was not recorded (the server stopped between them) runs
/// again at the next open and completes.
#[tokio::test]
async fn mysql_step_cut_off_before_its_record_completes_at_the_next_open() {
    let t = TestDb::create(Server::MySql).await.unwrap_or_else(|e| panic!("{e}"));
    // At old version 2 (step 3), with steps 4-7 made (an index dropped,
    // columns added, a table created) and none recorded.
    build_old(Db::MySql, &t.url, 2).await;
    for m in &MYSQL[3..7] {
        for stmt in m.statements() {
            exec(Db::MySql, &t.url, &stmt).await;
        }
    }
    upgrades_from(Db::MySql, &t.url, 2).await;
    t.drop_database().await;
}

/// Servers opening one database at once: each step is applied by one of
/// them (from an empty database and from an old one).
async fn concurrent_migrations_apply_each_step_once(db: Db, server: Server) {
    for old in [None, Some(4)] {
        let t = TestDb::create(server).await.unwrap_or_else(|e| panic!("{e}"));
        if let Some(old) = old {
            build_old(db, &t.url, old).await;
        }
        let options = StoreOptions::default();
        let applied: Vec<Vec<i64>> = match db {
            Db::MySql => {
                let (a, b, c) = tokio::join!(
                    MySqlStore::connect(&t.url, &options),
                    MySqlStore::connect(&t.url, &options),
                    MySqlStore::connect(&t.url, &options)
                );
                let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
                let (x, y, z) = tokio::join!(a.migrate(), b.migrate(), c.migrate());
                vec![x.unwrap(), y.unwrap(), z.unwrap()]
            }
            _ => {
                let (a, b, c) = tokio::join!(
                    PgStore::connect(&t.url, &options),
                    PgStore::connect(&t.url, &options),
                    PgStore::connect(&t.url, &options)
                );
                let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
                let (x, y, z) = tokio::join!(a.migrate(), b.migrate(), c.migrate());
                vec![x.unwrap(), y.unwrap(), z.unwrap()]
            }
        };
        let all: Vec<i64> = applied.iter().flatten().copied().collect();
        let unique: BTreeSet<i64> = all.iter().copied().collect();
        let first = old.and_then(|o| translate_legacy(db.legacy(), o)).unwrap_or(0) + 1;
        assert_eq!(all.len(), unique.len(), "{db:?} from {old:?}: no step applied twice: {applied:?}");
        assert_eq!(unique, (first..=LATEST).collect(), "{db:?} from {old:?}: every step applied: {applied:?}");
        assert_eq!(scalar(db, &t.url, "SELECT COUNT(*) FROM gnomon_schema").await, LATEST);
        if let Some(old) = old {
            upgrades_from(db, &t.url, old).await;
        }
        t.drop_database().await;
    }
}

#[tokio::test]
async fn concurrent_migrations_apply_each_step_once_on_mysql() {
    concurrent_migrations_apply_each_step_once(Db::MySql, Server::MySql).await;
}

#[tokio::test]
async fn concurrent_migrations_apply_each_step_once_on_postgres() {
    concurrent_migrations_apply_each_step_once(Db::Postgres, Server::Postgres).await;
}

/// A schema past the last step this build knows is refused, naming both
/// versions; so is an old record no build had.
async fn a_newer_schema_is_refused(db: Db, url: &str) {
    open(db, url).await.expect("a fresh database");
    exec(db, url, "INSERT INTO gnomon_schema (version, name, applied_at) VALUES (14, 'from_a_newer_build', 0)").await;
    let Err(e) = open(db, url).await else { panic!("{db:?}: a newer schema is refused") };
    assert!(matches!(&e, StoreError::SchemaTooNew { found: 14, known: LATEST, .. }), "{db:?}: {e:?}");
    assert!(e.to_string().contains("version 14") && e.to_string().contains("13"), "{e}");
}

#[tokio::test]
async fn a_newer_schema_is_refused_on_every_sql_database() {
    let dir = tempfile::tempdir().unwrap();
    a_newer_schema_is_refused(Db::Sqlite, &format!("sqlite://{}", dir.path().join("a.db").display())).await;
    for (db, server) in [(Db::MySql, Server::MySql), (Db::Postgres, Server::Postgres)] {
        let t = TestDb::create(server).await.unwrap_or_else(|e| panic!("{e}"));
        a_newer_schema_is_refused(db, &t.url).await;
        t.drop_database().await;
    }
    // An old record past the last old version.
    let url = format!("sqlite://{}", dir.path().join("b.db").display());
    build_old(Db::Sqlite, &url, 11).await;
    exec(Db::Sqlite, &url, "INSERT INTO gnomon_migrations (version, applied_at) VALUES (12, 12)").await;
    let Err(e) = open(Db::Sqlite, &url).await else { panic!("an unknown old version is refused") };
    assert!(e.to_string().contains("version 12") && e.to_string().contains("gnomon_migrations"), "{e}");
}

/// A run whose stored upstream record is not one reads as a corrupt
/// record, never as a run without upstreams.
#[tokio::test]
async fn a_corrupt_upstream_record_is_an_error_on_every_sql_database() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("c.db").display());
    let mysql = TestDb::create(Server::MySql).await.unwrap_or_else(|e| panic!("{e}"));
    let postgres = TestDb::create(Server::Postgres).await.unwrap_or_else(|e| panic!("{e}"));
    for (db, url) in [(Db::Sqlite, sqlite.as_str()), (Db::MySql, mysql.url.as_str()), (Db::Postgres, postgres.url.as_str())] {
        let store = open(db, url).await.expect("open");
        exec(
            db,
            url,
            "INSERT INTO runs (id, job_uid, namespace, job, scheduled_at, fired_at, state, attempt, updated_at, upstream)
               VALUES ('u1-d7000', 'u1', 'default', 'nightly', 7000, 7001, 'waiting', 0, 7001, '{\"of\": 3')",
        )
        .await;
        let e = store.get_run("u1-d7000").await.expect_err("corrupt");
        assert!(matches!(&e, StoreError::Corrupt(m) if m.contains("upstream")), "{db:?}: {e:?}");
        assert!(store.open_runs().await.is_err(), "{db:?}: the open runs are not read without it");
    }
    mysql.drop_database().await;
    postgres.drop_database().await;
}

/// A database the files left at step 12 (`job_edges`), with a job in it:
/// the next open applies step 13 alone, the job is kept, and the worker
/// bindings it writes are there at the open after (and none was lost to a
/// second migration).
async fn step_12_gains_the_worker_bindings(db: Db, url: &str) {
    let mut sql = String::new();
    for m in db.migrations().iter().take_while(|m| m.version <= 12) {
        for stmt in m.statements() {
            sql += &stmt;
            sql += ";\n";
        }
    }
    sql +=
        "CREATE TABLE IF NOT EXISTS gnomon_schema (version BIGINT PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at BIGINT NOT NULL);\n";
    for m in db.migrations().iter().take_while(|m| m.version <= 12) {
        sql += &format!("INSERT INTO gnomon_schema (version, name, applied_at) VALUES ({}, '{}', 1);\n", m.version, m.name);
    }
    let spec = serde_json::to_string(&job_spec("nightly")).unwrap().replace('\'', "''");
    sql += &format!(
        "INSERT INTO jobs (uid, namespace, name, spec, version, paused, created_at, updated_at, last_scheduled_at, change_seq) \
           VALUES ('u1', 'default', 'nightly', '{spec}', 1, 0, 1000, 1000, 5000, 1);
         UPDATE counters SET value = 1 WHERE name = 'job_change_seq';\n"
    );
    exec(db, url, &sql).await;
    let store = open(db, url).await.unwrap_or_else(|e| panic!("{db:?}: {e}"));
    assert_eq!(scalar(db, url, "SELECT MAX(version) FROM gnomon_schema").await, 13, "{db:?}: step 13 applied");
    assert!(store.get_job("default", "nightly").await.unwrap().is_some(), "{db:?}: the job is kept");
    assert_eq!(store.bind_worker("pool-b-1", "worker-b", 2000).await.unwrap(), "worker-b", "{db:?}");
    assert_eq!(store.bind_worker("pool-b-1", "worker-a", 3000).await.unwrap(), "worker-b", "{db:?}: the first owner keeps it");
    drop(store);
    let store = open(db, url).await.expect("reopen");
    assert_eq!(store.worker_owner("pool-b-1").await.unwrap().as_deref(), Some("worker-b"), "{db:?}: the binding outlives the open");
    assert_eq!(scalar(db, url, "SELECT COUNT(*) FROM worker_bindings").await, 1, "{db:?}");
    assert_eq!(scalar(db, url, "SELECT COUNT(*) FROM gnomon_schema").await, LATEST, "{db:?}: every step recorded once");
}

#[tokio::test]
async fn a_database_at_step_12_gains_the_worker_bindings_on_every_sql_database() {
    let dir = tempfile::tempdir().unwrap();
    step_12_gains_the_worker_bindings(Db::Sqlite, &format!("sqlite://{}", dir.path().join("w.db").display())).await;
    for (db, server) in [(Db::MySql, Server::MySql), (Db::Postgres, Server::Postgres)] {
        let t = TestDb::create(server).await.unwrap_or_else(|e| panic!("{e}"));
        step_12_gains_the_worker_bindings(db, &t.url).await;
        t.drop_database().await;
    }
}
