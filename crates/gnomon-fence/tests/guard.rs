//! Exactly-once steps against real PostgreSQL and MariaDB servers (the ones
//! `scripts/test.sh` starts). Every scenario runs on both, each in a
//! database and under a table prefix of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gnomon_backend::testing::testdb::{Server, TestDb};
use gnomon_fence::{Backend, BoxFuture, Fence, FenceError, Options, Step};
use serde_json::{json, Value};
use sqlx::{Connection, Executor, MySql, Pool, Postgres, Transaction};

/// What the scenarios need of a database beyond the crate's API: raw SQL
/// for the job's own writes and for looking at them.
trait Db: Backend + Sized {
    const SERVER: Server;
    /// Today's fence table as the earlier version of the crate made it.
    const OLD_TABLE: &'static str;
    /// A column type for names compared byte for byte.
    const NAME_TYPE: &'static str;
    fn exec<'a>(conn: &'a mut Self::Connection, sql: String) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    fn ints<'a>(conn: &'a mut Self::Connection, sql: String) -> BoxFuture<'a, Vec<i64>>;
    /// A connection of its own, outside the pool.
    fn connect(url: &str) -> BoxFuture<'_, Self::Connection>;
    /// [`gnomon_fence::begin_attempt_with`] and
    /// [`gnomon_fence::run_step_with`] on a connection rather than a pool
    /// (`&mut PgConnection` is `Acquire`, a generic one is not known to be).
    fn begin_attempt_on<'a>(c: &'a mut Self::Connection, f: &'a Fence, o: &'a Options) -> BoxFuture<'a, Result<(), FenceError>>;
    fn run_step_on<'a>(
        c: &'a mut Self::Connection,
        f: &'a Fence,
        step: &'a str,
        o: &'a Options,
        v: i64,
    ) -> BoxFuture<'a, Result<i64, FenceError>>;
}

impl Db for Postgres {
    const SERVER: Server = Server::Postgres;
    const NAME_TYPE: &'static str = "VARCHAR(255)";
    const OLD_TABLE: &'static str =
        "CREATE TABLE IF NOT EXISTS {table} (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL, token BIGINT NOT NULL, \
         written_at TIMESTAMPTZ NOT NULL DEFAULT now())";
    fn exec<'a>(conn: &'a mut sqlx::PgConnection, sql: String) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move { conn.execute(sqlx::raw_sql(&sql)).await.map(drop) })
    }
    fn ints<'a>(conn: &'a mut sqlx::PgConnection, sql: String) -> BoxFuture<'a, Vec<i64>> {
        Box::pin(async move { sqlx::query_scalar(&sql).fetch_all(conn).await.expect(&sql) })
    }
    fn connect(url: &str) -> BoxFuture<'_, sqlx::PgConnection> {
        Box::pin(async move { sqlx::PgConnection::connect(url).await.expect("postgres") })
    }
    fn begin_attempt_on<'a>(c: &'a mut sqlx::PgConnection, f: &'a Fence, o: &'a Options) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(gnomon_fence::begin_attempt_with(c, f, o))
    }
    fn run_step_on<'a>(
        c: &'a mut sqlx::PgConnection,
        f: &'a Fence,
        step: &'a str,
        o: &'a Options,
        v: i64,
    ) -> BoxFuture<'a, Result<i64, FenceError>> {
        Box::pin(gnomon_fence::run_step_with(c, f, step, o, move |_tx| Box::pin(async move { Ok(v) })))
    }
}

impl Db for MySql {
    const SERVER: Server = Server::MySql;
    const NAME_TYPE: &'static str = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";
    const OLD_TABLE: &'static str = "CREATE TABLE IF NOT EXISTS {table} (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY, \
         attempt BIGINT NOT NULL, token BIGINT NOT NULL, written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB";
    fn exec<'a>(conn: &'a mut sqlx::MySqlConnection, sql: String) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move { conn.execute(sqlx::raw_sql(&sql)).await.map(drop) })
    }
    fn ints<'a>(conn: &'a mut sqlx::MySqlConnection, sql: String) -> BoxFuture<'a, Vec<i64>> {
        Box::pin(async move { sqlx::query_scalar(&sql).fetch_all(conn).await.expect(&sql) })
    }
    fn connect(url: &str) -> BoxFuture<'_, sqlx::MySqlConnection> {
        Box::pin(async move { sqlx::MySqlConnection::connect(url).await.expect("mysql") })
    }
    fn begin_attempt_on<'a>(c: &'a mut sqlx::MySqlConnection, f: &'a Fence, o: &'a Options) -> BoxFuture<'a, Result<(), FenceError>> {
        Box::pin(gnomon_fence::begin_attempt_with(c, f, o))
    }
    fn run_step_on<'a>(
        c: &'a mut sqlx::MySqlConnection,
        f: &'a Fence,
        step: &'a str,
        o: &'a Options,
        v: i64,
    ) -> BoxFuture<'a, Result<i64, FenceError>> {
        Box::pin(gnomon_fence::run_step_with(c, f, step, o, move |_tx| Box::pin(async move { Ok(v) })))
    }
}

/// A scenario's database, pool, tables and options.
struct Env<D: Db> {
    db: TestDb,
    pool: Pool<D>,
    /// The job's own table: one row an effect.
    effects: String,
    opts: Options,
}

impl<D: Db> Env<D> {
    async fn new(name: &str) -> Env<D> {
        let db = TestDb::create(D::SERVER).await.unwrap_or_else(|e| panic!("a test database (scripts/test.sh starts the server): {e}"));
        let pool = Pool::<D>::connect(&db.url).await.expect("pool");
        let tag = format!("{name}_{:06x}", rand::random::<u32>() & 0xff_ffff);
        let opts = Options::default().prefix(format!("g_{tag}")).lock_wait(Duration::from_secs(60));
        gnomon_fence::create_tables(&pool, &opts.prefix).await.unwrap();
        let effects = format!("effects_{tag}");
        let mut c = pool.acquire().await.unwrap();
        D::exec(
            &mut c,
            format!("CREATE TABLE {effects} (run_id VARCHAR(255) NOT NULL, step {} NOT NULL, attempt BIGINT NOT NULL)", D::NAME_TYPE),
        )
        .await
        .unwrap();
        Env { db, pool, effects, opts }
    }

    /// The step's effect: the job's own write.
    async fn effect(&self, tx: &mut Transaction<'_, D>, f: &Fence, step: &str) {
        effect_in::<D>(tx, &self.effects, f, step).await
    }

    /// The attempts whose effect landed for the step, in order.
    async fn effects(&self, run: &str, step: &str) -> Vec<i64> {
        let mut c = self.pool.acquire().await.unwrap();
        D::ints(&mut c, format!("SELECT attempt FROM {} WHERE run_id = '{run}' AND step = '{step}' ORDER BY attempt", self.effects)).await
    }

    async fn guard(&self, tx: &mut Transaction<'_, D>, f: &Fence, step: &str) -> Result<Step, FenceError> {
        gnomon_fence::guard_with(tx, f, step, &self.opts).await
    }

    /// The whole step by hand: guard; when fresh, the effect, `result`
    /// recorded, the commit (then `None`). A recorded step's `(attempt,
    /// token, result)`.
    async fn step(&self, f: &Fence, step: &str, result: Value) -> Result<Option<(u32, u64, Value)>, FenceError> {
        let mut tx = self.pool.begin().await?;
        match self.guard(&mut tx, f, step).await? {
            Step::Fresh(fresh) => {
                assert_eq!(fresh.step(), step);
                self.effect(&mut tx, f, step).await;
                fresh.record(&mut tx, &result).await?;
                tx.commit().await?;
                Ok(None)
            }
            Step::Recorded { attempt, token, result } => Ok(Some((attempt, token, result))),
        }
    }

    async fn done(self) {
        self.pool.close().await;
        self.db.drop_database().await;
    }
}

async fn effect_in<D: Db>(tx: &mut Transaction<'_, D>, effects: &str, f: &Fence, step: &str) {
    D::exec(&mut **tx, format!("INSERT INTO {effects} (run_id, step, attempt) VALUES ('{}', '{step}', {})", f.run_id, f.attempt))
        .await
        .unwrap();
}

fn fence(run: &str, attempt: u32, token: u64) -> Fence {
    Fence { run_id: run.into(), attempt, token }
}

fn recorded(s: Step) -> (u32, u64, Value) {
    match s {
        Step::Recorded { attempt, token, result } => (attempt, token, result),
        Step::Fresh(f) => panic!("expected a record, got fresh step {:?}", f.step()),
    }
}

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name::<sqlx::Postgres>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mariadb() {
                super::$name::<sqlx::MySql>().await
            }
        }
    )*};
}

on_both!(
    first_commit_wins,
    first_commit_wins_when_the_newer_attempt_commits_first,
    racing_attempts_wait_and_get_the_record,
    an_older_attempt_commits_no_new_step_once_a_newer_has_begun,
    a_frozen_holder_is_ended_and_the_newer_attempt_commits,
    results_round_trip_as_json,
    run_step_runs_the_closure_once,
    many_attempts_at_once_make_one_effect,
    a_table_made_by_the_earlier_version_keeps_working,
    steps_of_a_run_are_independent,
    a_guard_after_an_earlier_read_does_not_miss_a_record,
);

async fn first_commit_wins<D: Db>() {
    let e = Env::<D>::new("first").await;
    let r = "run-1";
    assert_eq!(e.step(&fence(r, 1, 5), "run", json!({"by": 1})).await.unwrap(), None);
    // The retry finds the step committed: attempt 1's result, no effect.
    assert_eq!(e.step(&fence(r, 2, 5), "run", json!({"by": 2})).await.unwrap(), Some((1, 5, json!({"by": 1}))));
    // And so does attempt 1 itself, called again.
    assert_eq!(e.step(&fence(r, 1, 5), "run", json!({"by": 1})).await.unwrap(), Some((1, 5, json!({"by": 1}))));
    assert_eq!(e.effects(r, "run").await, [1]);
    e.done().await;
}

async fn first_commit_wins_when_the_newer_attempt_commits_first<D: Db>() {
    let e = Env::<D>::new("reverse").await;
    let r = "run-2";
    // The retry commits first (attempt 1 is frozen somewhere).
    assert_eq!(e.step(&fence(r, 2, 6), "run", json!("two")).await.unwrap(), None);
    // Attempt 1 wakes: the record, not a second effect, and no error.
    assert_eq!(e.step(&fence(r, 1, 5), "run", json!("one")).await.unwrap(), Some((2, 6, json!("two"))));
    assert_eq!(e.effects(r, "run").await, [2]);
    e.done().await;
}

async fn racing_attempts_wait_and_get_the_record<D: Db>() {
    let e = Arc::new(Env::<D>::new("race").await);
    let r = "run-3";
    // Attempt 1 guards and writes, and holds its transaction open.
    let mut tx1 = e.pool.begin().await.unwrap();
    let Step::Fresh(step1) = e.guard(&mut tx1, &fence(r, 1, 5), "run").await.unwrap() else { panic!("fresh") };
    e.effect(&mut tx1, &fence(r, 1, 5), "run").await;
    // The retry's guard waits for the run's row (lock_wait is 60 s here)...
    let e2 = e.clone();
    let retry = tokio::spawn(async move { e2.step(&fence(r, 2, 5), "run", json!(2)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...and, once attempt 1 commits, gets its record.
    step1.record(&mut tx1, &json!(1)).await.unwrap();
    tx1.commit().await.unwrap();
    assert_eq!(retry.await.unwrap().unwrap(), Some((1, 5, json!(1))));
    assert_eq!(e.effects(r, "run").await, [1]);
    Arc::into_inner(e).expect("the only owner").done().await;
}

async fn an_older_attempt_commits_no_new_step_once_a_newer_has_begun<D: Db>() {
    let e = Env::<D>::new("older").await;
    let r = "run-4";
    assert_eq!(e.step(&fence(r, 1, 5), "a", json!("a by 1")).await.unwrap(), None);
    gnomon_fence::begin_attempt_with(&e.pool, &fence(r, 2, 5), &e.opts).await.unwrap();
    // Attempt 1 may not commit a step without a record...
    let err = e.step(&fence(r, 1, 5), "b", json!("b by 1")).await.unwrap_err();
    assert!(err.is_superseded(), "{err}");
    assert!(err.to_string().contains("attempt 2 (token 5) has started"), "{err}");
    // ...but still reads the one it committed.
    assert_eq!(e.step(&fence(r, 1, 5), "a", json!(null)).await.unwrap(), Some((1, 5, json!("a by 1"))));
    // run_step refuses it too, without running the step.
    let ran = AtomicUsize::new(0);
    let ran_ref = &ran;
    let got: Result<Value, FenceError> = gnomon_fence::run_step_with(&e.pool, &fence(r, 1, 5), "b", &e.opts, |_tx| {
        Box::pin(async move {
            ran_ref.fetch_add(1, Ordering::SeqCst);
            Ok(json!("b by 1"))
        })
    })
    .await;
    assert!(got.unwrap_err().is_superseded());
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    // Attempt 2 does it; then attempt 1 gets attempt 2's record.
    assert_eq!(e.step(&fence(r, 2, 5), "b", json!("b by 2")).await.unwrap(), None);
    assert_eq!(e.step(&fence(r, 1, 5), "b", json!(null)).await.unwrap(), Some((2, 5, json!("b by 2"))));
    assert_eq!(e.effects(r, "a").await, [1]);
    assert_eq!(e.effects(r, "b").await, [2]);
    // An older attempt cannot begin again; the same attempt may.
    assert!(gnomon_fence::begin_attempt_with(&e.pool, &fence(r, 1, 5), &e.opts).await.unwrap_err().is_superseded());
    gnomon_fence::begin_attempt_with(&e.pool, &fence(r, 2, 5), &e.opts).await.unwrap();
    // A higher token of the same attempt (a new leader reassigned it)
    // shuts out the lower one, for new steps.
    gnomon_fence::begin_attempt_with(&e.pool, &fence(r, 2, 9), &e.opts).await.unwrap();
    assert!(e.step(&fence(r, 2, 5), "c", json!(null)).await.unwrap_err().is_superseded());
    assert!(e.step(&fence(r, 3, 1), "c", json!(null)).await.is_ok(), "a higher attempt, whatever its token");
    // begin_attempt on a connection of its own (not a pool) commits too.
    let mut c = D::connect(&e.db.url).await;
    D::begin_attempt_on(&mut c, &fence("run-4b", 1, 1), &e.opts).await.unwrap();
    assert!(e.step(&fence("run-4b", 1, 0), "x", json!(null)).await.unwrap_err().is_superseded());
    e.done().await;
}

async fn a_frozen_holder_is_ended_and_the_newer_attempt_commits<D: Db>() {
    let e = Env::<D>::new("frozen").await;
    let opts = e.opts.clone().lock_wait(Duration::from_secs(1)).idle(Duration::from_secs(2));
    let r = "run-5";
    let (a1, a2) = (fence(r, 1, 5), fence(r, 2, 5));
    // Attempt 1, on a connection of its own: guards, writes, then freezes
    // with its transaction open (it sends nothing more).
    let mut c1 = D::connect(&e.db.url).await;
    let mut tx1 = c1.begin().await.unwrap();
    let Step::Fresh(step1) = gnomon_fence::guard_with(&mut tx1, &a1, "run", &opts).await.unwrap() else { panic!("fresh") };
    effect_in::<D>(&mut tx1, &e.effects, &a1, "run").await;
    // Attempt 2 retries its guard, as a job's retry would, until the
    // database has ended attempt 1's session and freed the run's row.
    let (mut timeouts, mut tries) = (0, 0);
    loop {
        tries += 1;
        assert!(tries <= 120, "attempt 2 never got the run's row ({timeouts} lock timeouts)");
        let mut tx2 = e.pool.begin().await.unwrap();
        match gnomon_fence::guard_with(&mut tx2, &a2, "run", &opts).await {
            Err(err) if err.is_lock_timeout() => {
                timeouts += 1;
                continue;
            }
            Ok(Step::Fresh(step2)) => {
                e.effect(&mut tx2, &a2, "run").await;
                step2.record(&mut tx2, &json!("attempt 2")).await.unwrap();
                tx2.commit().await.unwrap();
                break;
            }
            other => panic!("attempt 2: {other:?}"),
        }
    }
    eprintln!("attempt 2 committed after {timeouts} lock timeouts");
    // Attempt 1 wakes and finishes: its session is gone, so is its write.
    let late = async {
        step1.record(&mut tx1, &json!("attempt 1")).await?;
        tx1.commit().await?;
        Ok::<_, FenceError>(())
    };
    assert!(late.await.is_err(), "the frozen attempt's commit fails");
    assert_eq!(e.effects(r, "run").await, [2], "exactly one effect");
    assert_eq!(e.step(&a1, "run", json!(null)).await.unwrap(), Some((2, 5, json!("attempt 2"))));
    e.done().await;
}

async fn results_round_trip_as_json<D: Db>() {
    let e = Env::<D>::new("json").await;
    let r = "run-6";
    let values = [
        ("object", json!({"id": 42, "tags": ["a", "b"], "nested": {"ok": true, "none": null}, "text": "é ünï 😀 \"q\" \\"})),
        ("string", json!("a string with 'quotes'")),
        ("number", json!(-12.5)),
        ("integer", json!(9_007_199_254_740_993_u64)),
        ("null", json!(null)),
        ("array", json!([1, "two", null])),
    ];
    for (step, v) in &values {
        assert_eq!(e.step(&fence(r, 1, 1), step, v.clone()).await.unwrap(), None);
    }
    for (step, v) in &values {
        assert_eq!(e.step(&fence(r, 2, 1), step, json!("other")).await.unwrap(), Some((1, 1, v.clone())), "{step}");
    }
    // A fresh step committed without a record has the result null.
    let mut tx = e.pool.begin().await.unwrap();
    let Step::Fresh(_unrecorded) = e.guard(&mut tx, &fence(r, 2, 1), "unrecorded").await.unwrap() else { panic!("fresh") };
    tx.commit().await.unwrap();
    assert_eq!(e.step(&fence(r, 2, 1), "unrecorded", json!(1)).await.unwrap(), Some((2, 1, json!(null))));
    // Typed results through run_step: the value the closure returned, and
    // the same value decoded for the next caller.
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Receipt {
        id: i64,
        note: Option<String>,
    }
    let first: Receipt = gnomon_fence::run_step_with(&e.pool, &fence(r, 2, 1), "typed", &e.opts, |_tx| {
        Box::pin(async move { Ok::<_, FenceError>(Receipt { id: 7, note: Some("n".into()) }) })
    })
    .await
    .unwrap();
    let again: Receipt = gnomon_fence::run_step_with(&e.pool, &fence(r, 3, 1), "typed", &e.opts, |_tx| {
        Box::pin(async move { Ok::<_, FenceError>(Receipt { id: 8, note: None }) })
    })
    .await
    .unwrap();
    assert_eq!((&first, &again), (&Receipt { id: 7, note: Some("n".into()) }, &Receipt { id: 7, note: Some("n".into()) }));
    // A record that is not the caller's type is an error, not a guess.
    let wrong: Result<String, FenceError> =
        gnomon_fence::run_step_with(&e.pool, &fence(r, 3, 1), "typed", &e.opts, |_tx| Box::pin(async move { Ok(String::new()) })).await;
    assert!(matches!(wrong, Err(FenceError::BadResult(_))), "{wrong:?}");
    e.done().await;
}

async fn run_step_runs_the_closure_once<D: Db>() {
    let e = Env::<D>::new("runstep").await;
    let r = "run-7";
    let runs = AtomicUsize::new(0);
    // The closure borrows from the caller (the counter, the env).
    let call = |f: Fence, fail: bool| {
        let (runs, e) = (&runs, &e);
        async move {
            let f = &f;
            gnomon_fence::run_step_with(&e.pool, f, "charge", &e.opts, |tx| {
                Box::pin(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    effect_in::<D>(tx, &e.effects, f, "charge").await;
                    if fail {
                        return Err(FenceError::BadStep("the step failed".into()));
                    }
                    Ok(json!({"charged_by": f.attempt}))
                })
            })
            .await
        }
    };
    // A failing step rolls back: no effect, no record.
    assert!(matches!(call(fence(r, 1, 1), true).await, Err(FenceError::BadStep(_))));
    assert_eq!(e.effects(r, "charge").await, Vec::<i64>::new());
    assert_eq!(call(fence(r, 1, 1), false).await.unwrap(), json!({"charged_by": 1}));
    assert_eq!(call(fence(r, 2, 1), false).await.unwrap(), json!({"charged_by": 1}));
    assert_eq!(call(fence(r, 1, 1), false).await.unwrap(), json!({"charged_by": 1}));
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the failed run and the committed one");
    assert_eq!(e.effects(r, "charge").await, [1]);
    // The default options and the one-call form on a connection too.
    let opts = Options::default().prefix(e.opts.prefix.clone());
    let mut c = D::connect(&e.db.url).await;
    assert_eq!(D::run_step_on(&mut c, &fence(r, 2, 1), "other", &opts, 5).await.unwrap(), 5);
    assert_eq!(D::run_step_on(&mut c, &fence(r, 3, 1), "other", &opts, 6).await.unwrap(), 5);
    e.done().await;
}

async fn many_attempts_at_once_make_one_effect<D: Db>() {
    let e = Arc::new(Env::<D>::new("many").await);
    // Eight attempts of one run at once, and twelve runs at once.
    let mut tasks = Vec::new();
    for attempt in 1..=8u32 {
        let e = e.clone();
        tasks.push(tokio::spawn(async move {
            let f = fence("run-8", attempt, 1);
            gnomon_fence::run_step_with(&e.pool, &f, "run", &e.opts, |tx| {
                let e = e.clone();
                let f = f.clone();
                Box::pin(async move {
                    effect_in::<D>(tx, &e.effects, &f, "run").await;
                    Ok::<_, FenceError>(f.attempt)
                })
            })
            .await
        }));
    }
    for run in 0..12 {
        let e = e.clone();
        tasks.push(tokio::spawn(async move {
            let f = fence(&format!("many-{run}"), 1, 1);
            gnomon_fence::run_step_with(&e.pool, &f, "run", &e.opts, |tx| {
                let e = e.clone();
                let f = f.clone();
                Box::pin(async move {
                    effect_in::<D>(tx, &e.effects, &f, "run").await;
                    Ok::<_, FenceError>(1000 + run)
                })
            })
            .await
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap().unwrap());
    }
    let winner = got[0];
    assert!(got[..8].iter().all(|g| *g == winner), "every attempt got the one result: {got:?}");
    assert_eq!(e.effects("run-8", "run").await, [i64::from(winner)]);
    for run in 0..12u32 {
        assert_eq!(got[8 + run as usize], 1000 + run);
        assert_eq!(e.effects(&format!("many-{run}"), "run").await, [1]);
    }
    Arc::into_inner(e).expect("the only owner").done().await;
}

async fn a_table_made_by_the_earlier_version_keeps_working<D: Db>() {
    let db = TestDb::create(D::SERVER).await.unwrap_or_else(|e| panic!("{e}"));
    let pool = Pool::<D>::connect(&db.url).await.unwrap();
    let prefix = format!("old_{:06x}", rand::random::<u32>() & 0xff_ffff);
    let table = format!("{prefix}_fence");
    let mut c = pool.acquire().await.unwrap();
    D::exec(&mut c, D::OLD_TABLE.replace("{table}", &table)).await.unwrap();
    // A row written by the earlier guard: attempt 2 of the run wrote.
    D::exec(&mut c, format!("INSERT INTO {table} (run_id, attempt, token) VALUES ('old-run', 2, 5)")).await.unwrap();
    drop(c);
    gnomon_fence::create_tables(&pool, &prefix).await.unwrap();
    let opts = Options::default().prefix(prefix.clone());
    let step = |f: Fence, v: Value| {
        let (pool, opts) = (&pool, &opts);
        async move { gnomon_fence::run_step_with(pool, &f, "run", opts, |_tx| Box::pin(async move { Ok::<_, FenceError>(v) })).await }
    };
    // The row is read as the run's newest started attempt.
    assert!(step(fence("old-run", 1, 5), json!(1)).await.unwrap_err().is_superseded());
    assert_eq!(step(fence("old-run", 2, 5), json!(2)).await.unwrap(), json!(2));
    assert_eq!(step(fence("old-run", 3, 5), json!(3)).await.unwrap(), json!(2));
    // New runs work in the old table, and its columns are as they were.
    assert_eq!(step(fence("new-run", 1, 5), json!("new")).await.unwrap(), json!("new"));
    let mut c = pool.acquire().await.unwrap();
    let rows = D::ints(&mut c, format!("SELECT attempt FROM {table} WHERE written_at IS NOT NULL ORDER BY run_id")).await;
    assert_eq!(rows, [1, 2], "new-run at 1, old-run at 2");
    drop(c);
    pool.close().await;
    db.drop_database().await;
}

async fn steps_of_a_run_are_independent<D: Db>() {
    let e = Env::<D>::new("steps").await;
    let r = "run-9";
    assert_eq!(e.step(&fence(r, 1, 1), "reserve", json!("r1")).await.unwrap(), None);
    // Another step of the run is fresh, even with "reserve" recorded.
    assert_eq!(e.step(&fence(r, 1, 1), "charge", json!("c1")).await.unwrap(), None);
    // A step of another run with the same name is its own.
    assert_eq!(e.step(&fence("run-9b", 1, 1), "charge", json!("other")).await.unwrap(), None);
    // Names are compared byte for byte, on both databases.
    assert_eq!(e.step(&fence(r, 1, 1), "Charge", json!("C1")).await.unwrap(), None);
    assert_eq!(e.step(&fence(r, 2, 1), "Charge", json!(null)).await.unwrap(), Some((1, 1, json!("C1"))));
    assert_eq!(e.step(&fence(r, 1, 1), "chargé", json!("é")).await.unwrap(), None);
    // The retry gets each recorded step's own result, and does the rest.
    assert_eq!(e.step(&fence(r, 2, 1), "reserve", json!("r2")).await.unwrap(), Some((1, 1, json!("r1"))));
    assert_eq!(e.step(&fence(r, 2, 1), "charge", json!("c2")).await.unwrap(), Some((1, 1, json!("c1"))));
    assert_eq!(e.step(&fence(r, 2, 1), "ship", json!("s2")).await.unwrap(), None);
    // The default step, through the default-options guard.
    gnomon_fence::create_tables(&e.pool, gnomon_fence::DEFAULT_PREFIX).await.unwrap();
    let mut tx = e.pool.begin().await.unwrap();
    let Step::Fresh(s) = gnomon_fence::guard(&mut tx, &fence(r, 2, 1), gnomon_fence::DEFAULT_STEP).await.unwrap() else { panic!("fresh") };
    assert_eq!(s.step(), "run");
    s.record(&mut tx, "done").await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = e.pool.begin().await.unwrap();
    assert_eq!(recorded(gnomon_fence::guard(&mut tx, &fence(r, 3, 1), "run").await.unwrap()), (2, 1, json!("done")));
    drop(tx);
    for (step, want) in [("reserve", [1]), ("charge", [1]), ("ship", [2])] {
        assert_eq!(e.effects(r, step).await, want, "{step}");
    }
    // Names are checked.
    let mut tx = e.pool.begin().await.unwrap();
    assert!(matches!(e.guard(&mut tx, &fence(r, 2, 1), "").await, Err(FenceError::BadStep(_))));
    assert!(matches!(e.guard(&mut tx, &fence(r, 2, 1), &"s".repeat(256)).await, Err(FenceError::BadStep(_))));
    let bad = Options::default().prefix("x; drop table y");
    assert!(matches!(gnomon_fence::guard_with(&mut tx, &fence(r, 2, 1), "run", &bad).await, Err(FenceError::BadTable(_))));
    drop(tx);
    e.done().await;
}

async fn a_guard_after_an_earlier_read_does_not_miss_a_record<D: Db>() {
    let e = Env::<D>::new("snapshot").await;
    let steps = format!("{}_steps", e.opts.prefix);
    // Attempt 1's transaction reads first (MySQL/MariaDB's default
    // REPEATABLE READ takes its snapshot here), then the retry commits
    // the step, then attempt 1 guards: it gets the record, not a fresh
    // step from its old snapshot.
    let mut tx = e.pool.begin().await.unwrap();
    assert_eq!(D::ints(&mut tx, format!("SELECT COUNT(*) FROM {steps}")).await, [0]);
    assert_eq!(e.step(&fence("run-10", 2, 1), "run", json!("by 2")).await.unwrap(), None);
    assert_eq!(recorded(e.guard(&mut tx, &fence("run-10", 1, 1), "run").await.unwrap()), (2, 1, json!("by 2")));
    drop(tx);
    if D::SERVER == Server::Postgres {
        // At PostgreSQL's REPEATABLE READ the stale snapshot is an error
        // (40001), for a run new to the snapshot and for one it knew.
        for (run, before) in [("run-11", false), ("run-12", true)] {
            if before {
                gnomon_fence::begin_attempt_with(&e.pool, &fence(run, 1, 1), &e.opts).await.unwrap();
            }
            let mut tx = e.pool.begin().await.unwrap();
            D::exec(&mut tx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ".into()).await.unwrap();
            assert_eq!(D::ints(&mut tx, format!("SELECT COUNT(*) FROM {steps} WHERE run_id = '{run}'")).await, [0]);
            assert_eq!(e.step(&fence(run, 2, 1), "run", json!("by 2")).await.unwrap(), None);
            let err = e.guard(&mut tx, &fence(run, 1, 1), "run").await.unwrap_err();
            let code = match &err {
                FenceError::Database(d) => d.as_database_error().and_then(|d| d.code()).map(|c| c.to_string()),
                _ => None,
            };
            assert_eq!(code.as_deref(), Some("40001"), "{run}: {err}");
        }
    }
    assert_eq!(e.effects("run-10", "run").await, [2]);
    e.done().await;
}
