//! How long the leader takes to (re)build its state from the store: what a
//! new term does, and what the leader does after any store error (the
//! crash-only rule). Creates N jobs (cron every hour, so nothing is due)
//! and N/10 open runs in an embedded SQLite store, then times the first
//! step of fresh leader runtimes (an empty cache loaded from the store, plus
//! one idle turn), then the rebuild of a runtime that already holds the
//! jobs (after a store error). Prints figures; asserts nothing.
//! `bench/rebuild.sh`.
//!
//! Usage: bench_rebuild [JOBS…]   (default: 10000 100000)

use std::sync::Arc;
use std::time::Instant;

use gnomon_backend::sqlite::SqliteStore;
use gnomon_backend::{Fence, LeaderInfo, NewRun, Precondition, Store};
use gnomon_core::spec::parse_job_json;
use gnomon_core::{ManualClock, RunState};
use gnomon_server::leader::{LeaderConfig, LeaderParts, LeaderRuntime, Step};
use tokio::sync::{mpsc, watch};

const T0: i64 = 1_800_000_000_000;

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

/// A fresh leader runtime over `store`, and the channel ends that keep it running.
#[allow(clippy::type_complexity)]
fn runtime(
    store: &Arc<dyn Store>,
    fence: &Fence,
) -> (LeaderRuntime, (mpsc::Sender<gnomon_server::leader::LeaderCommand>, watch::Sender<bool>, watch::Sender<bool>)) {
    let (tx, commands) = mpsc::channel(16);
    let (lost_tx, lost) = watch::channel(false);
    let (shut_tx, shutdown) = watch::channel(false);
    let rt = LeaderRuntime::new(LeaderParts {
        store: store.clone(),
        fence: fence.clone(),
        clock: Arc::new(ManualClock::new(T0 + 1)),
        config: LeaderConfig::default(),
        commands,
        lost,
        shutdown,
        view: Default::default(),
        live: Default::default(),
        seed: 1,
    });
    (rt, (tx, lost_tx, shut_tx))
}

async fn bench(jobs: usize) -> Result<(), String> {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.map_err(|e| e.to_string())?;
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&url).await.map_err(|e| e.to_string())?);
    let began = Instant::now();
    let mut uids = Vec::with_capacity(jobs);
    for i in 0..jobs {
        let json = format!(
            r#"{{"name":"job-{i}","schedule":{{"cron":"0 0 * * * *","timezone":"Europe/Berlin"}},
                "executor":{{"shell":{{"command":"echo","args":["{i}"]}}}},"retry":{{"max_attempts":3}}}}"#
        );
        let spec = parse_job_json(json.as_bytes()).map_err(|e| e.to_string())?.compile().map_err(|e| e.to_string())?.spec;
        uids.push(store.put_job(&spec, Precondition::DoesNotExist, T0).await.map_err(|e| e.to_string())?.uid);
    }
    let token = store.next_epoch("scheduler").await.map_err(|e| e.to_string())?;
    let fence = Fence { scope: "scheduler".into(), token };
    store.fence(&fence, &LeaderInfo::default(), T0).await.map_err(|e| e.to_string())?;
    let runs: Vec<NewRun> = uids
        .iter()
        .step_by(10)
        .enumerate()
        .map(|(i, uid)| NewRun {
            job_uid: uid.clone(),
            namespace: "default".into(),
            job: format!("job-{}", i * 10),
            scheduled_at: T0 - 1000,
            fired_at: T0,
            state: RunState::Pending,
            reason: None,
            manual: true,
            key: None,
            params: None,
            payload: None,
            upstream: None,
        })
        .collect();
    for chunk in runs.chunks(2048) {
        store.fire(&fence, chunk, &[]).await.map_err(|e| e.to_string())?;
    }
    println!("{jobs} jobs, {} open runs: created in {:.1} s", runs.len(), began.elapsed().as_secs_f64());
    let t = Instant::now();
    let changes = store.job_changes(0).await.map_err(|e| e.to_string())?;
    let read_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    for j in &changes.upserted {
        let _ = j.spec.compile();
    }
    let compile_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    let heads = store.job_heads().await.map_err(|e| e.to_string())?.heads.len();
    let heads_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    let live = store.live_attempts().await.map_err(|e| e.to_string())?.len();
    let live_ms = t.elapsed().as_secs_f64() * 1000.0;
    println!("  reading {heads} job heads {heads_ms:.0} ms, {live} live attempts {live_ms:.0} ms");
    let t = Instant::now();
    let open = store.open_runs().await.map_err(|e| e.to_string())?.len();
    println!(
        "  of which: reading the jobs {read_ms:.0} ms, compiling them {compile_ms:.0} ms, reading {open} open runs {:.0} ms",
        t.elapsed().as_secs_f64() * 1000.0
    );
    drop(changes);
    let mut times = Vec::new();
    for _ in 0..3 {
        let (mut rt, _guards) = runtime(&store, &fence);
        let t = Instant::now();
        let step = rt.step().await;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if step != Step::Done {
            return Err(format!("the first step ended {step:?}"));
        }
        times.push(ms);
        println!("  rebuild + first turn: {ms:.0} ms (process RSS {:.0} MiB)", rss_mib());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!("{jobs} jobs: new term's load min {:.0} ms, median {:.0} ms", times[0], times[1]);
    // The rebuild after a store error: jobs held at their stored version
    // keep their entries; heads, open runs and live attempts are read again.
    let (mut rt, _guards) = runtime(&store, &fence);
    if rt.step().await != Step::Done {
        return Err("the first step failed".into());
    }
    let mut times = Vec::new();
    for _ in 0..5 {
        rt.invalidate();
        let t = Instant::now();
        let step = rt.step().await;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if step != Step::Done {
            return Err(format!("a rebuild step ended {step:?}"));
        }
        times.push(ms);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!("{jobs} jobs: rebuild after a store error min {:.0} ms, median {:.0} ms", times[0], times[2]);
    Ok(())
}

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![10_000, 100_000] } else { sizes };
    for n in sizes {
        if let Err(e) = bench(n).await {
            eprintln!("bench_rebuild: {e}");
            std::process::exit(1);
        }
    }
}
