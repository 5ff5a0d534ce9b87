//! Leader time across real nodes with skewed clocks: each node's wall clock
//! is the system clock plus an offset the test sets (and steps). The nodes
//! share one SQLite store and hand leadership over with an in-process
//! elector that fences every term through the store, as the real ones do.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gnomon_backend::sqlite::SqliteStore;
use gnomon_backend::{ElectionError, Elector, Fence, LeaderInfo, Leadership, Precondition, RunFilter, Store};
use gnomon_core::spec::parse_job_json;
use gnomon_core::{Clock, Millis, SystemClock};
use gnomon_server::leader::LeaderConfig;
use gnomon_server::leader_time::{SkewLimits, Verdict};
use gnomon_server::{Node, NodeConfig, NodeHandle};
use tokio::sync::{watch, OwnedMutexGuard};

/// The system clock plus an offset.
#[derive(Debug, Default)]
struct SkewedClock(AtomicI64);

impl SkewedClock {
    fn set(&self, offset_ms: i64) {
        self.0.store(offset_ms, Ordering::SeqCst);
    }
}

impl Clock for SkewedClock {
    fn now_millis(&self) -> Millis {
        SystemClock.now_millis() + self.0.load(Ordering::SeqCst)
    }
}

/// The terms a [`BatonElector`] has handed out: the baton and the `lost` signal.
type Held = Arc<Mutex<HashMap<u64, (OwnedMutexGuard<()>, watch::Sender<bool>)>>>;

/// One baton: a campaign waits for it, takes a token from the store's epoch
/// and fences it; `resign` hands the baton on.
#[derive(Debug, Clone)]
struct BatonElector {
    store: Arc<dyn Store>,
    baton: Arc<tokio::sync::Mutex<()>>,
    held: Held,
}

#[async_trait]
impl Elector for BatonElector {
    fn backend(&self) -> &'static str {
        "baton"
    }
    async fn campaign(&self, scope: &str, me: &LeaderInfo) -> Result<Leadership, ElectionError> {
        let guard = self.baton.clone().lock_owned().await;
        let token = self.store.next_epoch(scope).await.map_err(|e| ElectionError::Unavailable(e.to_string()))?;
        let fence = Fence { scope: scope.into(), token };
        self.store.fence(&fence, me, 0).await.map_err(|e| ElectionError::Unavailable(e.to_string()))?;
        let (tx, rx) = watch::channel(false);
        self.held.lock().unwrap().insert(token, (guard, tx));
        Ok(Leadership { scope: scope.into(), token, lost: rx })
    }
    async fn resign(&self, leadership: &Leadership) -> Result<(), ElectionError> {
        if let Some((_, tx)) = self.held.lock().unwrap().remove(&leadership.token) {
            let _ = tx.send(true);
        }
        Ok(())
    }
}

struct Cluster {
    _dir: Option<tempfile::TempDir>,
    store: Arc<dyn Store>,
    elector: BatonElector,
}

struct Running {
    handle: NodeHandle,
    clock: Arc<SkewedClock>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

impl Cluster {
    async fn new() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("g.db").display());
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&url).await.unwrap());
        Cluster::on(store, Some(dir)).await
    }

    /// On a store of its own (a MySQL or PostgreSQL test database).
    async fn on(store: Arc<dyn Store>, dir: Option<tempfile::TempDir>) -> Cluster {
        let spec = parse_job_json(br#"{"name":"tick","schedule":{"every":"1s"},"executor":{"handler":{"name":"noop"}}}"#)
            .unwrap()
            .compile()
            .unwrap()
            .spec;
        store.put_job(&spec, Precondition::DoesNotExist, SystemClock.now_millis()).await.unwrap();
        let elector = BatonElector { store: store.clone(), baton: Arc::default(), held: Arc::default() };
        Cluster { _dir: dir, store, elector }
    }

    fn start(&self, name: &str, offset_ms: i64) -> Running {
        let clock = Arc::new(SkewedClock::default());
        clock.set(offset_ms);
        let config = NodeConfig {
            node_id: name.into(),
            advertise: format!("{name}:0"),
            leader: LeaderConfig::default(),
            clock: SkewLimits { warn: Duration::from_secs(1), step_down: Duration::from_secs(5) },
        };
        let node = Node::new(config, self.store.clone(), Arc::new(self.elector.clone()), clock.clone());
        let handle = node.handle.clone();
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(node.run(rx));
        Running { handle, clock, stop, task }
    }

    async fn leader_time(&self) -> Millis {
        self.store.leadership("scheduler").await.unwrap().map_or(0, |r| r.leader_time)
    }

    /// (scheduled_at, fired_at) of every run of the job.
    async fn runs(&self) -> Vec<(Millis, Millis)> {
        let filter = RunFilter { job: Some("tick".into()), ..Default::default() };
        let page = self.store.list_runs(&filter, 1000, None).await.unwrap();
        page.runs.iter().map(|r| (r.scheduled_at, r.fired_at)).collect()
    }
}

/// Waits (generously: real processes share this machine) until `f` holds.
async fn until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A leader that commits its clock: the committed time moves, and is never
/// ahead of that leader's clock.
async fn first_leader(c: &Cluster) -> Running {
    let a = c.start("a", 0);
    until("a leads and commits its clock", || async { a.handle.leading_token().is_some() && c.leader_time().await > 0 }).await;
    until("a fires", || async { !c.runs().await.is_empty() }).await;
    a
}

/// A cluster whose first leader led, committed its clock and stopped: the
/// committed time and the runs it fired.
async fn after_first_leader() -> (Cluster, Millis, Vec<(Millis, Millis)>) {
    let c = Cluster::new().await;
    first_leader(&c).await.stop().await;
    let (committed, runs) = (c.leader_time().await, c.runs().await);
    (c, committed, runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_far_behind_the_committed_time_does_not_lead() {
    let (c, committed, runs) = after_first_leader().await;
    let fired = runs.len();
    let b = c.start("b", -30_000);
    until("b refuses the term", || async { b.handle.clock_status().stepped_down_at.is_some() }).await;
    let st = b.handle.clock_status();
    assert_eq!(st.verdict, Some(Verdict::StepDown));
    assert!(st.skew_ms.unwrap() < -25_000, "b knows it is about 30 s behind: {st:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(b.handle.leading_token().is_none(), "b does not lead");
    assert_eq!(c.runs().await.len(), fired, "b fired nothing");
    assert_eq!(c.leader_time().await, committed, "and the leader time did not move back");
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_a_little_behind_leads_from_the_committed_time_and_says_so() {
    let (c, committed, runs) = after_first_leader().await;
    let before: Vec<Millis> = runs.iter().map(|r| r.0).collect();
    let b = c.start("b", -2_500);
    until("b leads and fires", || async { b.handle.leading_token().is_some() && c.runs().await.iter().any(|r| !before.contains(&r.0)) })
        .await;
    let st = b.handle.clock_status();
    assert_eq!(st.verdict, Some(Verdict::Warn), "b warns: {st:?}");
    assert!(st.skew_ms.unwrap() <= -1_000, "about 2.5 s behind, less the handover: {st:?}");
    for (at, fired_at) in c.runs().await.into_iter().filter(|r| !before.contains(&r.0)) {
        assert!(fired_at >= committed, "b's run of {at} fired at {fired_at}, below the committed time {committed}");
    }
    let mut instants: Vec<Millis> = c.runs().await.iter().map(|r| r.0).collect();
    let n = instants.len();
    instants.dedup();
    assert_eq!(instants.len(), n, "no instant fired twice");
    until("b commits its clock", || async { c.leader_time().await > committed }).await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_clock_steps_ahead_steps_down_without_firing_early() {
    let c = Cluster::new().await;
    let a = first_leader(&c).await;
    a.clock.set(60_000);
    until("a steps down", || async { a.handle.leading_token().is_none() }).await;
    let st = a.handle.clock_status();
    assert!(st.stepped_down_at.is_some() && st.skew_ms.unwrap() > 50_000, "{st:?}");
    let now = SystemClock.now_millis();
    let latest = c.runs().await.iter().map(|r| r.0).max().unwrap();
    assert!(latest <= now + 1_000, "nothing fired at the stepped time: latest instant {latest}, now {now}");
    assert!(c.leader_time().await <= now + 1_000, "nor was the stepped time committed");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_ahead_of_the_leader_knows_it_and_leaves_the_term_to_another() {
    let c = Cluster::new().await;
    let a = first_leader(&c).await;
    let d = c.start("d", 30_000);
    until("d measures its skew as a standby", || async { d.handle.clock_status().verdict == Some(Verdict::StepDown) }).await;
    let st = d.handle.clock_status();
    assert!((28_000..31_500).contains(&st.skew_ms.unwrap()), "d is about 30 s ahead: {st:?}");
    a.stop().await;
    until("d refuses the term", || async { d.handle.clock_status().stepped_down_at.is_some() }).await;
    let now = SystemClock.now_millis();
    assert!(c.runs().await.iter().all(|r| r.0 <= now + 1_000), "d fired nothing ahead of time");
    // A node with a good clock takes the term d left.
    let e = c.start("e", 0);
    until("e leads", || async { e.handle.leading_token().is_some() }).await;
    assert!(d.handle.leading_token().is_none());
    let now = SystemClock.now_millis();
    assert!(c.runs().await.iter().all(|r| r.0 <= now + 1_000), "no instant fired ahead of time");
    e.stop().await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_time_a_fast_clock_left_ahead_is_waited_for_not_fired_at() {
    let c = Cluster::new().await;
    // The first leader's clock is 3 s fast: within the step-down bound, so
    // nothing stops it, and the leader time it commits is 3 s ahead.
    let a = c.start("a", 3_000);
    until("a leads and commits its clock", || async { a.handle.leading_token().is_some() && c.leader_time().await > 0 }).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    a.stop().await;
    let committed = c.leader_time().await;
    assert!(committed > SystemClock.now_millis() + 2_000, "the committed time is ahead of the true time");
    // A job due one second from now (true time), created before the good
    // node takes over.
    let due = put_at_job(&c, "once", 1_000).await;
    let b = c.start("b", 0);
    let run = fired_not_early(&c, "once", committed).await;
    assert_eq!(run.scheduled_at, due);
    assert!(run.fired_at >= committed, "fired at {} below the committed time {committed}", run.fired_at);
    assert_eq!(b.handle.clock_status().verdict, Some(Verdict::Warn), "b says it is behind the committed time");
    b.stop().await;
}

/// A job firing once, `in_ms` from now (true time); its due time.
async fn put_at_job(c: &Cluster, name: &str, in_ms: i64) -> Millis {
    let due = SystemClock.now_millis() + in_ms;
    let at = chrono::DateTime::from_timestamp_millis(due).unwrap().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let json = format!(r#"{{"name":"{name}","schedule":{{"at":"{at}"}},"executor":{{"handler":{{"name":"noop"}}}}}}"#);
    let spec = parse_job_json(json.as_bytes()).unwrap().compile().unwrap().spec;
    c.store.put_job(&spec, Precondition::DoesNotExist, SystemClock.now_millis()).await.unwrap();
    due
}

/// Waits for the job's run and asserts it was not fired before its time
/// (true time): a run read right after it was written was fired no later
/// than the read.
async fn fired_not_early(c: &Cluster, name: &str, committed: Millis) -> gnomon_backend::RunRecord {
    let filter = RunFilter { job: Some(name.into()), ..Default::default() };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page = c.store.list_runs(&filter, 10, None).await.unwrap();
        let seen_at = SystemClock.now_millis();
        if let Some(r) = page.runs.first() {
            assert!(
                r.scheduled_at <= seen_at,
                "the run due at {} was fired {} ms before its time (committed time {committed})",
                r.scheduled_at,
                r.scheduled_at - seen_at
            );
            return r.clone();
        }
        assert!(Instant::now() < deadline, "the run was never fired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A MySQL and a PostgreSQL test database, each with a cluster on it.
async fn on_database_servers() -> Vec<(gnomon_backend::testing::testdb::TestDb, Cluster)> {
    use gnomon_backend::testing::testdb::{Server, TestDb};
    let mut out = Vec::new();
    for server in [Server::MySql, Server::Postgres] {
        let db = TestDb::create(server).await.expect("the test database server is reachable");
        let store = gnomon_backend::open_store(&db.url).await.expect("opens");
        assert!(store.server_clock().await.unwrap().is_some(), "{server:?} has a clock of its own");
        out.push((db, Cluster::on(store, None).await));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_database_clock_a_first_leader_whose_clock_is_off_does_not_lead() {
    for (db, c) in on_database_servers().await {
        // No leader before it, no committed time: only the database
        // server's clock can tell this node is 30 s ahead.
        let a = c.start("a", 30_000);
        until("a refuses the term", || async { a.handle.clock_status().stepped_down_at.is_some() }).await;
        let st = a.handle.clock_status();
        assert_eq!(st.verdict, Some(Verdict::StepDown), "{:?}: {st:?}", db.server);
        assert!(st.skew_ms.unwrap() > 25_000, "{:?}: a knows it is 30 s ahead: {st:?}", db.server);
        assert!(c.runs().await.is_empty(), "{:?}: a fired nothing", db.server);
        assert_eq!(c.leader_time().await, 0, "{:?}: and committed no leader time", db.server);
        // A good node leads.
        let b = c.start("b", 0);
        until("b leads and fires", || async { b.handle.leading_token().is_some() && !c.runs().await.is_empty() }).await;
        for (at, _) in c.runs().await {
            assert!(at <= SystemClock.now_millis(), "{:?}: b fired {at} on time", db.server);
        }
        a.stop().await;
        b.stop().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_database_clock_a_committed_time_left_far_ahead_neither_stops_nor_hurries_a_good_leader() {
    for (db, c) in on_database_servers().await {
        // A wrong clock (a minute ahead) led before and committed its time.
        let token = c.store.next_epoch("scheduler").await.unwrap();
        let fence = Fence { scope: "scheduler".into(), token };
        let holder = LeaderInfo { holder: "wrong".into(), address: "wrong:0".into(), backend: "baton".into() };
        c.store.fence(&fence, &holder, 0).await.unwrap();
        let poisoned = SystemClock.now_millis() + 60_000;
        c.store.advance_leader_time(&fence, poisoned).await.unwrap();
        let due = put_at_job(&c, "once", 1_500).await;
        // A good node: it agrees with the database server, so the committed
        // time is the wrong one. It leads at once, from its own clock.
        let b = c.start("b", 0);
        let run = fired_not_early(&c, "once", poisoned).await;
        assert_eq!(run.scheduled_at, due);
        assert!(run.fired_at < due + 10_000, "{:?}: fired on time, not when the true time reaches the committed one", db.server);
        assert!(b.handle.clock_status().stepped_down_at.is_none(), "{:?}: b did not refuse the term", db.server);
        b.stop().await;
        db.drop_database().await;
    }
}
