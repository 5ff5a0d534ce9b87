//! Step-down on loss (invariant 5) and on being fenced (invariant 2).

use std::sync::Arc;
use std::time::{Duration, Instant};

use gnomon_backend::sqlite::SqliteStore;
use gnomon_backend::Store;
use gnomon_core::ManualClock;
use gnomon_server::leader::LeaderExit;

use super::harness::*;

#[tokio::test]
async fn leader_loops_stop_within_a_second_of_loss() {
    let (_d, store) = store().await;
    let fence = term(&store).await;
    let (rt, lost, _shut) = runtime(store, fence, ManualClock::new(1_000_000));
    let task = tokio::spawn(rt.run());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    lost.send(true).unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops").unwrap();
    assert_eq!(exit, LeaderExit::Lost);
    assert!(t0.elapsed() < Duration::from_secs(1), "stopped after {:?}", t0.elapsed());
}

#[tokio::test]
async fn a_fenced_leader_steps_down_and_writes_nothing() {
    let (_d, store) = store().await;
    let clock = ManualClock::new(1_000_000);
    every_second_job(&store).await;
    let old = term(&store).await;
    let (rt, _lost, _shut) = runtime(store.clone(), old, clock.clone());
    let task = tokio::spawn(rt.run());
    // The leader fires while it holds the current token.
    clock.advance(3_000);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let before = store.list_runs(&Default::default(), 1000, None).await.unwrap().runs.len();
    assert!(before >= 3, "fired {before} runs");
    // A newer term fences it out; its next write fails and it stops.
    term(&store).await;
    clock.advance(5_000);
    let exit = tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops").unwrap();
    assert_eq!(exit, LeaderExit::Fenced);
    let after = store.list_runs(&Default::default(), 1000, None).await.unwrap().runs.len();
    assert_eq!(after, before, "no run was created under the stale token");
}

/// A partitioned database answers nothing: a leader whose store call hangs
/// must still step down the moment its elector says it lost. Here the call
/// hangs on SQLite's write lock, held by another connection for longer than
/// the test waits (the store's busy timeout is 10 s).
#[tokio::test]
async fn a_leader_blocked_in_a_store_call_steps_down_on_loss() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&format!("sqlite://{}", path.display())).await.unwrap());
    let clock = ManualClock::new(1_000_000);
    every_second_job(&store).await;
    let fence = term(&store).await;
    let (rt, lost, _shut) = runtime(store.clone(), fence, clock.clone());
    let task = tokio::spawn(rt.run());
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Another connection takes the write lock; the leader's next fire blocks.
    let mut blocker = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display())).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut blocker).await.unwrap();
    clock.advance(3_000);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished());
    lost.send(true).unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(6), task).await.expect("stepped down while its store call still hung").unwrap();
    assert_eq!(exit, LeaderExit::Lost);
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
}
