//! Worker session leases on etcd, and the watches that turn etcd events
//! into signals (a worker's lease gone, a job written).

use async_trait::async_trait;
use etcd_client::{GetOptions, Txn, TxnOp};
use gnomon_core::Millis;
use serde::{Deserialize, Serialize};

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
        tokio::spawn(async move { watch_worker_deletions(store, tx).await });
        rx
    }
}

/// Watches `P/workers/` for deletions, resuming from the last revision seen
/// when the stream breaks; after a compaction (history gone) it compares
/// the live keys with the ones it knew and reports the missing as deleted.
pub(super) async fn watch_worker_deletions(store: EtcdStore, tx: tokio::sync::mpsc::Sender<(String, i64)>) {
    use etcd_client::{EventType, WatchOptions};
    let prefix = store.k("workers/");
    let mut known: HashMap<String, i64> = HashMap::new();
    let mut from: i64 = 0;
    loop {
        if tx.is_closed() {
            return;
        }
        // (Re)load: the live keys and the revision to watch from.
        if from == 0 {
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
            from = r.header().map(|h| h.revision() + 1).unwrap_or(1);
        }
        let mut c = store.c();
        let opts = WatchOptions::new().with_prefix().with_prev_key().with_progress_notify().with_start_revision(from);
        let Ok(Ok((_watcher, mut stream))) =
            tokio::time::timeout(std::time::Duration::from_secs(3), c.watch(prefix.clone(), Some(opts))).await
        else {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            continue;
        };
        loop {
            let msg = tokio::select! {
                m = stream.message() => m,
                _ = tx.closed() => return,
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                _ => break, // broken stream: resume from `from`
            };
            if resp.compact_revision() > 0 {
                tracing::warn!(compacted = resp.compact_revision(), "worker watch: history compacted; reloading");
                from = 0;
                break;
            }
            if resp.canceled() {
                break;
            }
            if let Some(h) = resp.header() {
                from = from.max(h.revision() + 1);
            }
            for e in resp.events() {
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
                from = from.max(kv.mod_revision() + 1);
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Signals every write under `P/job` (jobs, their names, tombstones). The
/// watch resumes from the last revision it saw when its stream breaks; after
/// a compaction it signals once (the change feed itself reads current keys
/// by `mod_revision`, so it needs no history) and watches from now.
pub(super) async fn watch_job_writes(store: EtcdStore, tx: tokio::sync::mpsc::Sender<()>) {
    use etcd_client::WatchOptions;
    let prefix = store.k("job");
    let mut from: i64 = 0;
    loop {
        if tx.is_closed() {
            return;
        }
        let mut c = store.c();
        let mut opts = WatchOptions::new().with_prefix().with_progress_notify();
        if from > 0 {
            opts = opts.with_start_revision(from);
        }
        let Ok(Ok((_watcher, mut stream))) =
            tokio::time::timeout(std::time::Duration::from_secs(3), c.watch(prefix.clone(), Some(opts))).await
        else {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            continue;
        };
        loop {
            let msg = tokio::select! {
                m = stream.message() => m,
                _ = tx.closed() => return,
            };
            let Ok(Some(resp)) = msg else { break };
            if resp.compact_revision() > 0 {
                from = 0;
                let _ = tx.try_send(());
                break;
            }
            if resp.canceled() {
                break;
            }
            if let Some(h) = resp.header() {
                from = from.max(h.revision() + 1);
            }
            if !resp.events().is_empty() {
                // Coalesced: one pending signal is enough.
                let _ = tx.try_send(());
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
