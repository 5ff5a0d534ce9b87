//! Worker session leases on etcd, and the watches that turn etcd events
//! into signals (a worker's lease gone, a job written). Both watches are
//! [`super::watching::Resumable`]: they resume after a broken stream from
//! the next revision they need, keep it current with progress
//! notifications, and answer a compacted start revision with a full read.

use async_trait::async_trait;
use std::sync::Arc;

use etcd_client::{EventType, GetOptions, Txn, TxnOp, WatchOptions};
use gnomon_core::Millis;
use serde::{Deserialize, Serialize};

use super::watching::{Next, Resumable, WatchStats};
use super::*;

/// Worker session leases: `P/workers/<worker id>` bound to an etcd lease of
/// the session's own.
#[derive(Debug)]
pub(super) struct EtcdSessions {
    pub(super) store: EtcdStore,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct EWorker {
    worker: String,
    registered_at: Millis,
}

#[async_trait]
impl SessionLeases for EtcdSessions {
    async fn register(&self, fence: &Fence, worker: &str, ttl: std::time::Duration) -> Result<i64, StoreError> {
        let s = &self.store;
        let mut c = s.c();
        let lease = tokio::time::timeout(std::time::Duration::from_secs(3), c.lease_grant(ttl.as_secs().max(1) as i64, None))
            .await
            .map_err(|_| StoreError::Unavailable("etcd: lease grant timed out".into()))?
            .map_err(unavailable)?
            .id();
        let now = gnomon_core::chrono::Utc::now().timestamp_millis();
        let value = json(&EWorker { worker: worker.to_string(), registered_at: now });
        let put = TxnOp::put(s.k(&format!("workers/{worker}")), value, Some(etcd_client::PutOptions::new().with_lease(lease)));
        let ok = s.txn(Txn::new().when(s.fence_compares(fence).await?).and_then(vec![put])).await?.succeeded();
        if !ok {
            let _ = self.release(lease).await;
            s.check_fenced(fence).await?;
            return Err(StoreError::Unavailable("worker registration did not apply".into()));
        }
        Ok(lease)
    }

    async fn refresh(&self, lease: i64) -> Result<bool, StoreError> {
        let mut c = self.store.c();
        let refreshed = tokio::time::timeout(std::time::Duration::from_secs(3), async {
            let (mut keeper, mut replies) = c.lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            replies.message().await
        })
        .await
        .map_err(|_| StoreError::Unavailable("etcd: keep-alive timed out".into()))?;
        match refreshed {
            Ok(r) => Ok(r.is_some_and(|r| r.ttl() > 0)),
            // An expired lease is reported as an error by the client.
            Err(e) if e.to_string().contains("not found") => Ok(false),
            Err(e) => Err(unavailable(e)),
        }
    }

    async fn release(&self, lease: i64) -> Result<(), StoreError> {
        let mut c = self.store.c();
        match tokio::time::timeout(std::time::Duration::from_secs(3), c.lease_revoke(lease)).await {
            Ok(Ok(_)) => Ok(()),
            // Already gone is released.
            Ok(Err(e)) if e.to_string().contains("not found") => Ok(()),
            Ok(Err(e)) => Err(unavailable(e)),
            Err(_) => Err(StoreError::Unavailable("etcd: lease revoke timed out".into())),
        }
    }

    async fn live(&self) -> Result<Vec<LiveSession>, StoreError> {
        let s = &self.store;
        let r = s.get(s.k("workers/"), Some(GetOptions::new().with_prefix())).await?;
        let mut out = Vec::new();
        for kv in r.kvs() {
            let w: EWorker = parse("worker", kv.value())?;
            let mut c = s.c();
            let ttl = match tokio::time::timeout(std::time::Duration::from_secs(3), c.lease_time_to_live(kv.lease(), None)).await {
                Ok(Ok(t)) => t.ttl(),
                _ => continue,
            };
            if ttl > 0 {
                out.push(LiveSession { worker: w.worker, lease: kv.lease(), remaining_ms: ttl * 1000 });
            }
        }
        Ok(out)
    }

    fn deletions(&self) -> tokio::sync::mpsc::Receiver<(String, i64)> {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let store = self.store.clone();
        tokio::spawn(async move { watch_worker_deletions(store, tx, Arc::default()).await });
        rx
    }
}

/// Watches `P/workers/` for deletions. It first reads the live keys, then
/// watches from the revision after that read, resuming after breaks from
/// the next revision it needs (see [`super::watching`]); after a compaction
/// (history gone) it reads the live keys again, reports the ones it knew
/// that are missing as deleted, and watches from after that read.
pub(super) async fn watch_worker_deletions(store: EtcdStore, tx: tokio::sync::mpsc::Sender<(String, i64)>, stats: Arc<WatchStats>) {
    let prefix = store.k("workers/");
    let mut known: HashMap<String, i64> = HashMap::new();
    let options = WatchOptions::new().with_prefix().with_prev_key();
    let mut w = Resumable::new(store.c(), prefix.clone(), options, stats, "workers");
    loop {
        let next = tokio::select! {
            n = w.next() => n,
            _ = tx.closed() => return,
        };
        match next {
            Next::Reload => {
                let Ok(r) = store.get(prefix.clone(), Some(GetOptions::new().with_prefix())).await else {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    continue;
                };
                let now: HashMap<String, i64> =
                    r.kvs().iter().filter_map(|kv| Some((kv.key_str().ok()?.rsplit('/').next()?.to_string(), kv.lease()))).collect();
                for (w, lease) in &known {
                    if now.get(w) != Some(lease) && tx.send((w.clone(), *lease)).await.is_err() {
                        return;
                    }
                }
                known = now;
                w.reloaded(r.header().map_or(0, |h| h.revision()));
            }
            Next::Events(events) => {
                for e in events {
                    let Some(kv) = e.kv() else { continue };
                    let Some(worker) = kv.key_str().ok().and_then(|k| k.rsplit('/').next()).map(str::to_string) else { continue };
                    match e.event_type() {
                        EventType::Put => {
                            known.insert(worker, kv.lease());
                        }
                        EventType::Delete => {
                            let lease = e.prev_kv().map(|p| p.lease()).or_else(|| known.get(&worker).copied()).unwrap_or(0);
                            known.remove(&worker);
                            if tx.send((worker, lease)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Signals every write under `P/job` (jobs, their names, tombstones). The
/// change feed itself reads current keys by `mod_revision`, so the watch
/// needs no history: it reads the prefix's revision, signals once (a
/// subscriber that read before that read re-reads) and watches from the
/// next revision, resuming after breaks from the next revision it needs;
/// after a compaction it does the same again (see [`super::watching`]).
pub(super) async fn watch_job_writes(store: EtcdStore, tx: tokio::sync::mpsc::Sender<()>, stats: Arc<WatchStats>) {
    let prefix = store.k("job");
    let mut w = Resumable::new(store.c(), prefix.clone(), WatchOptions::new().with_prefix(), stats, "jobs");
    loop {
        let next = tokio::select! {
            n = w.next() => n,
            _ = tx.closed() => return,
        };
        match next {
            Next::Reload => {
                let Ok(r) = store.get(prefix.clone(), Some(GetOptions::new().with_prefix().with_count_only())).await else {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    continue;
                };
                w.reloaded(r.header().map_or(0, |h| h.revision()));
                let _ = tx.try_send(());
            }
            // Coalesced: one pending signal is enough.
            Next::Events(_) => {
                let _ = tx.try_send(());
            }
        }
    }
}
