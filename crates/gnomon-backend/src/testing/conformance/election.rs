//! The elector suites: one leader at a time, hand-over, growing tokens,
//! a severed leader fenced.

use std::future::Future;
use std::sync::Arc;

use super::fixtures::*;
use crate::*;

/// Runs every elector test against `elector`, which must be backed by `store`.
pub async fn elector_suite(store: Arc<dyn Store>, elector: Arc<dyn Elector>) {
    let scope = unique("scope");
    let me = LeaderInfo { holder: "node-a".into(), address: "127.0.0.1:7400".into(), backend: String::new() };
    let first = elector.campaign(&scope, &me).await.expect("campaign");
    assert!(!*first.lost.borrow(), "a fresh term is not lost");
    let record = store.leadership(&scope).await.expect("leadership").expect("fenced on win");
    assert_eq!(record.token, first.token, "the elector fences the store before returning");
    assert_eq!(record.holder, "node-a");
    let mut lost = first.lost.clone();
    elector.resign(&first).await.expect("resign");
    tokio::time::timeout(std::time::Duration::from_secs(5), lost.wait_for(|l| *l))
        .await
        .expect("loss is signalled promptly")
        .expect("watch");
    let second = elector.campaign(&scope, &me).await.expect("campaign again");
    assert!(second.token > first.token, "tokens strictly increase across terms");
    let fence = Fence { scope: scope.clone(), token: first.token };
    assert!(matches!(store.fire(&fence, &[], &[]).await, Err(StoreError::Fenced { .. })), "the old term's writes are fenced");
    store.fire(&Fence { scope: scope.clone(), token: second.token }, &[], &[]).await.expect("the new term writes");
    elector.resign(&second).await.expect("resign");
}

/// A backend's hooks for [`contested_elector_suite`].
#[async_trait::async_trait]
pub trait ElectorFixture: Send + Sync {
    /// The store every candidate fences.
    fn store(&self) -> Arc<dyn Store>;
    /// A new candidate with connections of its own, as another server would have.
    async fn candidate(&self) -> Arc<dyn Elector>;
    /// Takes leadership of `scope` away from its holder from outside (kills
    /// its lock connection, revokes its lease), as a crash or partition would.
    async fn sever(&self, scope: &str);
    /// The longest a holder may take to notice a sever (generous: shared machines).
    fn loss_bound(&self) -> std::time::Duration;
}

pub(super) async fn within<T>(what: &str, bound: std::time::Duration, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(bound, f).await.unwrap_or_else(|_| panic!("{what} did not happen within {bound:?}"))
}

/// The elector tests that need competing candidates: one leader at a time;
/// resign hands over promptly; tokens strictly grow across terms and
/// candidates; a severed leader is told it lost, and its writes are fenced
/// once the next leader starts.
pub async fn contested_elector_suite(fx: &dyn ElectorFixture) {
    use std::time::Duration;
    let store = fx.store();
    let scope = unique("contest");
    let info = |n: &str| LeaderInfo { holder: n.into(), address: format!("{n}.invalid:7400"), backend: String::new() };
    let (a, b, c) = (fx.candidate().await, fx.candidate().await, fx.candidate().await);
    // The single-candidate properties hold for this backend too.
    elector_suite(store.clone(), a.clone()).await;

    let first = within("the first campaign", Duration::from_secs(20), a.campaign(&scope, &info("a"))).await.expect("a campaigns");
    let (b2, c2, scope2) = (b.clone(), c.clone(), scope.clone());
    let mut b_task = tokio::spawn(async move { b2.campaign(&scope2, &info("b")).await });
    let scope3 = scope.clone();
    let mut c_task = tokio::spawn(async move { c2.campaign(&scope3, &info("c")).await });
    // While `a` leads, neither contender wins (3 s of the lock being held).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!b_task.is_finished() && !c_task.is_finished(), "a second candidate won while the first still leads");
    assert!(!*first.lost.borrow(), "the leader lost its term while nobody touched it");

    // Resign hands over promptly to exactly one contender.
    let mut first_lost = first.lost.clone();
    let t0 = std::time::Instant::now();
    a.resign(&first).await.expect("resign");
    within("loss after resign", Duration::from_secs(2), first_lost.wait_for(|l| *l)).await.expect("watch");
    let (second, waiting, loser) = tokio::select! {
        r = &mut b_task => (r.expect("join").expect("b campaigns"), c_task, c.clone()),
        r = &mut c_task => (r.expect("join").expect("c campaigns"), b_task, b.clone()),
        _ = tokio::time::sleep(Duration::from_secs(10)) => panic!("nobody took over within 10 s of a resign"),
    };
    let handover = t0.elapsed();
    assert!(handover < Duration::from_secs(10), "handover took {handover:?}");
    assert!(second.token > first.token, "the next term's token {} is not above {}", second.token, first.token);
    let mut waiting = waiting;
    tokio::time::sleep(Duration::from_secs(2)).await;
    if waiting.is_finished() {
        match (&mut waiting).await.expect("join") {
            Ok(l) => panic!("two candidates lead at once after a handover: tokens {} and {}", second.token, l.token),
            Err(e) => panic!("a waiting candidate's campaign failed after a handover: {e}"),
        }
    }
    let winner = if Arc::ptr_eq(&loser, &b) { c.clone() } else { b.clone() };

    // A severed leader learns it lost; the next one is fenced in above it.
    let mut second_lost = second.lost.clone();
    fx.sever(&scope).await;
    within("loss after a sever", fx.loss_bound(), second_lost.wait_for(|l| *l)).await.expect("watch");
    let third = within("takeover after a sever", fx.loss_bound() + Duration::from_secs(10), &mut waiting)
        .await
        .expect("join")
        .expect("the waiting candidate campaigns");
    assert!(third.token > second.token, "token after a sever: {} is not above {}", third.token, second.token);
    let stale = Fence { scope: scope.clone(), token: second.token };
    assert!(matches!(store.fire(&stale, &[], &[]).await, Err(StoreError::Fenced { .. })), "the severed leader's writes are fenced");
    store.fire(&Fence { scope: scope.clone(), token: third.token }, &[], &[]).await.expect("the new leader writes");
    let _ = winner.resign(&second).await;
    loser.resign(&third).await.expect("resign");
    assert_eq!(store.leadership(&scope).await.expect("leadership").map(|r| r.token), Some(third.token));
}
