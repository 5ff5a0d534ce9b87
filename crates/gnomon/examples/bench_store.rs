//! Store benchmark: for each backend (SQLite with `synchronous=FULL`,
//! MariaDB/MySQL and PostgreSQL on the local test servers, each in a fresh
//! database, and etcd on the 3-member test cluster) it prints
//! - fires/s: 20,000 runs created by batched `fire` calls (500 a call);
//! - transitions/s: the same runs taken pending → assigned → running →
//!   succeeded in batches of 500 (60,000 transitions, with attempt rows);
//! - end-to-end runs/s: 20,000 pending runs of a handler job that does
//!   nothing, executed by a real leader (REST + gRPC listener on loopback)
//!   and one worker session of capacity 50 over the worker protocol, from
//!   the node's start to the last run recorded `succeeded`.
//!
//! Nothing is asserted. Run it with `bench/store.sh`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gnomon_backend::testing::testdb::{Server, TestDb};
use gnomon_backend::{AttemptChange, Fence, LeaderInfo, NewRun, Precondition, Store, Transition};
use gnomon_core::spec::parse_job_json;
use gnomon_core::{AttemptState, RunState};
use gnomon_server::api::{router, ApiState};
use gnomon_server::leader::LeaderConfig;
use gnomon_server::{Node, NodeConfig};
use gnomon_worker::{Handler, HandlerContext, HandlerRegistry, WorkerConfig, WorkerRuntime};

const RUNS: i64 = 20_000;
const BATCH: usize = 500;

struct Counting(Arc<AtomicUsize>);

#[async_trait::async_trait]
impl Handler for Counting {
    async fn call(&self, _ctx: HandlerContext, _payload: serde_json::Value) -> Result<String, gnomon_worker::HandlerError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(String::new())
    }
}

async fn lead(store: &dyn Store, scope: &str) -> Fence {
    let token = store.next_epoch(scope).await.expect("epoch");
    let fence = Fence { scope: scope.into(), token };
    store.fence(&fence, &LeaderInfo::default(), 0).await.expect("fence");
    fence
}

fn tr(id: &str, from: RunState, fa: u32, to: RunState, ta: u32, attempt: AttemptChange) -> Transition {
    Transition {
        run_id: id.into(),
        from,
        from_attempt: fa,
        to,
        to_attempt: ta,
        reason: None,
        next_attempt_at: None,
        attempt: Some(attempt),
        at: 1,
        notify: Vec::new(),
    }
}

async fn bench(name: &str, url: &str) {
    let store = gnomon_backend::open_store(url).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    let fence = lead(store.as_ref(), "bench").await;
    let spec = parse_job_json(br#"{"name":"micro","executor":{"handler":{"name":"noop"}}}"#).unwrap();
    let job = store.put_job(&spec, Precondition::None, 0).await.unwrap();
    let runs: Vec<NewRun> = (0..RUNS)
        .map(|i| NewRun {
            job_uid: job.uid.clone(),
            namespace: job.namespace.clone(),
            job: job.name.clone(),
            scheduled_at: 1_000_000 + i,
            fired_at: 1_000_000 + i,
            state: RunState::Pending,
            reason: None,
            manual: false,
            key: None,
            params: None,
            payload: None,
            upstream: None,
        })
        .collect();
    let t = Instant::now();
    for chunk in runs.chunks(BATCH) {
        store.fire(&fence, chunk, &[]).await.expect("fire");
    }
    let fire_secs = t.elapsed().as_secs_f64();
    let ids: Vec<String> = runs.iter().map(|r| r.id()).collect();
    let t = Instant::now();
    for chunk in ids.chunks(BATCH) {
        let assign: Vec<Transition> = chunk
            .iter()
            .map(|id| {
                tr(
                    id,
                    RunState::Pending,
                    0,
                    RunState::Assigned,
                    1,
                    AttemptChange::Assign { attempt: 1, worker: "w".into(), token: fence.token },
                )
            })
            .collect();
        store.transition(&fence, &assign).await.expect("assign");
        let start: Vec<Transition> =
            chunk.iter().map(|id| tr(id, RunState::Assigned, 1, RunState::Running, 1, AttemptChange::Start { attempt: 1 })).collect();
        store.transition(&fence, &start).await.expect("start");
        let end: Vec<Transition> = chunk
            .iter()
            .map(|id| {
                tr(
                    id,
                    RunState::Running,
                    1,
                    RunState::Succeeded,
                    1,
                    AttemptChange::End {
                        attempt: 1,
                        state: AttemptState::Succeeded,
                        exit_code: None,
                        output: "ok".into(),
                        started_at: None,
                    },
                )
            })
            .collect();
        store.transition(&fence, &end).await.expect("end");
    }
    let transition_secs = t.elapsed().as_secs_f64();

    // End to end: pending runs executed by a real leader and worker.
    let spec = parse_job_json(br#"{"name":"e2e","overlap":"allow","executor":{"handler":{"name":"count"}}}"#).unwrap();
    let job = store.put_job(&spec, Precondition::None, 0).await.unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    let pending: Vec<NewRun> = (0..RUNS)
        .map(|i| NewRun {
            job_uid: job.uid.clone(),
            namespace: job.namespace.clone(),
            job: job.name.clone(),
            scheduled_at: now - RUNS + i,
            fired_at: now,
            state: RunState::Pending,
            reason: None,
            manual: true,
            key: None,
            params: None,
            payload: None,
            upstream: None,
        })
        .collect();
    let setup = lead(store.as_ref(), gnomon_server::node::SCOPE).await;
    for chunk in pending.chunks(BATCH) {
        store.fire(&setup, chunk, &[]).await.expect("fire pending");
    }
    let count = Arc::new(AtomicUsize::new(0));
    let mut handlers = HandlerRegistry::with_builtins();
    handlers.register("count", Arc::new(Counting(count.clone())));
    let config =
        NodeConfig { node_id: "bench".into(), advertise: "127.0.0.1:0".into(), leader: LeaderConfig::default(), clock: Default::default() };
    let elector = Arc::new(gnomon_backend::election::LocalElector::new(store.clone()));
    let node = Node::new(config, store.clone(), elector, Arc::new(gnomon_core::SystemClock));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let api = router(ApiState::new(node.handle.clone(), None, None));
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = tokio::spawn(async move { axum::serve(listener, api).await });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let t = Instant::now();
    let task = tokio::spawn(node.run(stop_rx.clone()));
    let mut wc = WorkerConfig::new("bench-worker", vec![addr.to_string()]);
    wc.capacity = 50;
    let worker = tokio::spawn(WorkerRuntime::new(wc, handlers).run(stop_rx));
    while count.load(Ordering::Relaxed) < RUNS as usize && t.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while !store.open_runs().await.expect("open runs").is_empty() && t.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let e2e_secs = t.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    let _ = worker.await;
    let _ = task.await;
    server.abort();
    println!(
        "{name:<10} fires/s {:>8.0}   transitions/s {:>8.0}   end-to-end runs/s {:>7.0}  ({} runs in {:.1}s, capacity 50)",
        RUNS as f64 / fire_secs,
        3.0 * RUNS as f64 / transition_secs,
        RUNS as f64 / e2e_secs,
        count.load(Ordering::Relaxed),
        e2e_secs
    );
}

#[tokio::main]
async fn main() {
    let only: Vec<String> = std::env::args().skip(1).collect();
    let wants = |n: &str| only.is_empty() || only.iter().any(|o| o == n);
    println!("gnomon store benchmark: {RUNS} runs, batches of {BATCH}");
    if wants("sqlite") {
        let dir = tempfile::tempdir().unwrap();
        bench("sqlite", &format!("sqlite://{}", dir.path().join("bench.db").display())).await;
    }
    for (name, server) in [("mariadb", Server::MySql), ("postgres", Server::Postgres)] {
        if !wants(name) {
            continue;
        }
        let db = TestDb::create(server).await.unwrap_or_else(|e| panic!("{e}"));
        bench(name, &db.url).await;
        db.drop_database().await;
    }
    if wants("etcd") {
        // The 3-member test cluster on loopback (each write a Raft commit
        // with fsync on all three members), under a cluster name of its own,
        // removed afterwards.
        let cluster = format!("bench-{:08x}", rand::random::<u32>());
        let endpoints = gnomon_backend::testing::testdb::etcd_endpoints();
        bench("etcd", &format!("etcd://{endpoints}/{cluster}")).await;
        let list = gnomon_backend::etcd::parse_endpoints(&endpoints).expect("endpoints");
        if let Ok(mut c) = etcd_client::Client::connect(&list, None).await {
            let _ = c.delete(format!("/gnomon/{cluster}/"), Some(etcd_client::DeleteOptions::new().with_prefix())).await;
        }
    }
}
