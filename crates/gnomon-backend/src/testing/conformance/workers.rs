//! Worker bindings: the first credential to bind a worker id keeps it,
//! through every handle, until it is released; binds racing through two
//! handles leave exactly one owner; pruning never releases one.

use std::sync::Arc;

use super::fixtures::*;
use crate::*;

/// Races per id of the concurrent case.
const RACES: usize = 20;

/// A bind as the worker service makes it: again while the store says it
/// may help (a lock wait, a deadlock, an outcome it could not learn).
async fn bind(s: &dyn Store, worker: &str, credential: &str) -> String {
    for _ in 0..50 {
        match s.bind_worker(worker, credential, 7).await {
            Err(e) if e.is_retryable() => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            Err(e) => panic!("bind {worker} to {credential}: {e}"),
            Ok(owner) => return owner,
        }
    }
    panic!("bind {worker} to {credential} never got an answer")
}

/// First bind wins; the same credential again is fine; another credential
/// is answered the first owner and changes nothing; a release frees the
/// id for the next credential; other ids are untouched.
pub(super) async fn the_first_credential_to_bind_a_worker_id_keeps_it(a: &dyn Store, b: &dyn Store) {
    let (id, other) = (unique("pool-w"), unique("pool-w"));
    assert_eq!(a.worker_owner(&id).await.expect("owner"), None, "an id nobody used has no owner");
    assert_eq!(bind(a, &id, "cred-b").await, "cred-b", "the first bind records its credential");
    assert_eq!(b.worker_owner(&id).await.expect("owner").as_deref(), Some("cred-b"), "every handle reads the binding");
    assert_eq!(bind(b, &id, "cred-b").await, "cred-b", "the owner binds again through another handle");
    assert_eq!(bind(a, &id, "cred-b").await, "cred-b");
    assert_eq!(bind(b, &id, "cred-a").await, "cred-b", "another credential is answered the owner");
    assert_eq!(a.worker_owner(&id).await.expect("owner").as_deref(), Some("cred-b"), "and changes nothing");
    assert_eq!(bind(a, &other, "cred-a").await, "cred-a", "another id is another binding");
    // Pruning everything it may leaves every binding.
    let fence = lead(a, &unique("bindings")).await;
    a.prune(&fence, 0, i64::MAX, i64::MAX, 10_000).await.expect("prune");
    assert_eq!(b.worker_owner(&id).await.expect("owner").as_deref(), Some("cred-b"), "pruning keeps bindings");
    // Released, the id goes to the next credential that binds it.
    assert!(b.unbind_worker(&id).await.expect("unbind"), "a bound id is released");
    assert!(!a.unbind_worker(&id).await.expect("unbind"), "a second release finds nothing");
    assert_eq!(a.worker_owner(&id).await.expect("owner"), None, "a released id has no owner");
    assert_eq!(bind(a, &id, "cred-a").await, "cred-a", "the next credential binds the released id");
    assert_eq!(bind(b, &id, "cred-b").await, "cred-a", "and keeps it");
    assert_eq!(b.worker_owner(&other).await.expect("owner").as_deref(), Some("cred-a"), "the other id kept its owner");
    assert!(!a.unbind_worker(&unique("pool-w")).await.expect("unbind"), "an id never bound is not released");
}

/// Two tasks bind one id at once through two handles (two servers), with
/// different credentials: both are answered the same owner, one of the
/// two, which is the stored one.
pub(super) async fn racing_binds_leave_one_owner(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let mut wins = [0usize; 2];
    for i in 0..RACES {
        let id = unique(&format!("race-{i}"));
        let (x, y) = (a.clone(), b.clone());
        let (ix, iy) = (id.clone(), id.clone());
        // Which handle goes first alternates.
        let (first, second) = if i % 2 == 0 { ("cred-x", "cred-y") } else { ("cred-y", "cred-x") };
        let tx = tokio::spawn(async move { bind(x.as_ref(), &ix, first).await });
        let ty = tokio::spawn(async move { bind(y.as_ref(), &iy, second).await });
        let (ox, oy) = (tx.await.expect("task"), ty.await.expect("task"));
        assert_eq!(ox, oy, "race {i}: both binds are answered one owner");
        assert!(ox == "cred-x" || ox == "cred-y", "race {i}: the owner is one of the two: {ox}");
        assert_eq!(a.worker_owner(&id).await.expect("owner"), Some(ox.clone()), "race {i}: the answer is the stored owner");
        assert_eq!(b.worker_owner(&id).await.expect("owner"), Some(ox.clone()), "race {i}: on every handle");
        wins[usize::from(ox == "cred-y")] += 1;
    }
    assert_eq!(wins.iter().sum::<usize>(), RACES, "{wins:?}");
}
