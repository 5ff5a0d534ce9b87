//! Retention benchmark: for SQLite (`synchronous=FULL`), MariaDB/MySQL and
//! PostgreSQL (fresh databases on the local test servers) it creates
//! 1,000,000 terminal runs (500 jobs × 2,000, created as `skipped` records
//! by batched `fire` calls, with one open run per job among them) and prints
//! - a retention round with nothing to delete (what every round costs once
//!   history is within bounds): 1M runs, keep 2,000 per job, nothing too old;
//! - pruning down to the newest 1,000 runs per job and then by age to
//!   nothing, in rounds of at most 2,000 runs (what the leader does every
//!   10 s): rounds, total time, runs/s, round p50 / max;
//! - that the open runs are all still there.
//!
//! Nothing is asserted. `bench/prune.sh`; `BENCH_PRUNE_RUNS=N` for fewer runs.

use std::time::Instant;

use gnomon_backend::testing::testdb::{Server, TestDb};
use gnomon_backend::{Fence, LeaderInfo, NewRun, Precondition, RunFilter, Store};
use gnomon_core::spec::parse_job_json;
use gnomon_core::RunState;

const JOBS: usize = 500;
const ROUND: usize = 2000;

async fn lead(store: &dyn Store) -> Fence {
    let token = store.next_epoch("bench").await.expect("epoch");
    let fence = Fence { scope: "bench".into(), token };
    store.fence(&fence, &LeaderInfo::default(), 0).await.expect("fence");
    fence
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0)
}

/// Rounds of `prune` until one deletes nothing: (rounds, deleted, secs, round times in ms).
async fn prune_all(store: &dyn Store, fence: &Fence, keep: usize, before: i64) -> (usize, u64, f64, Vec<f64>) {
    let (mut deleted, mut times) = (0, Vec::new());
    let t = Instant::now();
    loop {
        let r = Instant::now();
        let n = store.prune(fence, keep, before, i64::MAX, ROUND).await.expect("prune");
        times.push(r.elapsed().as_secs_f64() * 1000.0);
        deleted += n;
        if n == 0 {
            break;
        }
    }
    (times.len(), deleted, t.elapsed().as_secs_f64(), times)
}

fn report(what: &str, (rounds, deleted, secs, mut times): (usize, u64, f64, Vec<f64>)) {
    times.sort_by(f64::total_cmp);
    println!(
        "  {what}: {deleted} runs in {rounds} rounds, {secs:.1} s ({:.0} runs/s), round p50 {:.0} ms, max {:.0} ms",
        deleted as f64 / secs.max(1e-9),
        pct(&times, 0.5),
        pct(&times, 1.0)
    );
}

async fn bench(name: &str, url: &str, total: usize) {
    let store = gnomon_backend::open_store(url).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    let fence = lead(store.as_ref()).await;
    let per_job = total / JOBS;
    let mut jobs = Vec::new();
    for j in 0..JOBS {
        let spec = parse_job_json(format!(r#"{{"name":"p{j}","executor":{{"handler":{{"name":"noop"}}}}}}"#).as_bytes()).unwrap();
        jobs.push(store.put_job(&spec, Precondition::None, 0).await.unwrap());
    }
    let t = Instant::now();
    let mut batch = Vec::with_capacity(5000);
    for i in 0..per_job {
        for job in &jobs {
            // The newest run of each job is still open: retention must keep it.
            let open = i == per_job - 1;
            batch.push(NewRun {
                job_uid: job.uid.clone(),
                namespace: job.namespace.clone(),
                job: job.name.clone(),
                scheduled_at: 1_000_000 + i as i64 * 1000,
                fired_at: 1_000_000 + i as i64 * 1000,
                state: if open { RunState::Pending } else { RunState::Skipped },
                reason: (!open).then(|| "benchmark".to_string()),
                manual: false,
                key: None,
                params: None,
                payload: None,
                upstream: None,
            });
            if batch.len() == 5000 {
                store.fire(&fence, &batch, &[]).await.expect("fire");
                batch.clear();
            }
        }
    }
    if !batch.is_empty() {
        store.fire(&fence, &batch, &[]).await.expect("fire");
    }
    println!(
        "{name}: created {} runs in {:.1} s; store size {:?} bytes",
        per_job * JOBS,
        t.elapsed().as_secs_f64(),
        store.size_bytes().await
    );
    let r = Instant::now();
    let n = store.prune(&fence, per_job, 0, i64::MAX, ROUND).await.expect("prune");
    println!("  a round with nothing to delete: {:.0} ms ({n} deleted)", r.elapsed().as_secs_f64() * 1000.0);
    report("down to 1,000 per job", prune_all(store.as_ref(), &fence, 1000, 0).await);
    report("the rest by age", prune_all(store.as_ref(), &fence, 1000, i64::MAX).await);
    let open = store.list_runs(&RunFilter { state: Some(RunState::Pending), ..Default::default() }, 1000, None).await.unwrap();
    let left = store.list_runs(&RunFilter::default(), 1000, None).await.unwrap();
    println!(
        "  left: {} runs, {} of them the open ones ({JOBS} expected); store size {:?} bytes",
        left.runs.len(),
        open.runs.len(),
        store.size_bytes().await
    );
}

#[tokio::main]
async fn main() {
    let total: usize = std::env::var("BENCH_PRUNE_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let which: Vec<String> = std::env::args().skip(1).collect();
    let want = |n: &str| which.is_empty() || which.iter().any(|w| w == n);
    if want("sqlite") {
        let dir = tempfile::tempdir().unwrap();
        bench("sqlite", &format!("sqlite://{}/bench.db", dir.path().display()), total).await;
    }
    for (name, server) in [("mysql", Server::MySql), ("postgres", Server::Postgres)] {
        if want(name) {
            let db = TestDb::create(server).await.unwrap_or_else(|e| panic!("{e}"));
            bench(name, &db.url, total).await;
            db.drop_database().await;
        }
    }
}
