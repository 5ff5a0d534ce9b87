//! Retention on the etcd store: terminal runs beyond the newest
//! `keep_per_job` of each job (by job uid, so namespaces and re-created jobs
//! of the same name never share a count) or fired before a cut, deleted by
//! the leader in small fenced txns.
//!
//! Each run is indexed under `P/idx/uid/<job uid>/<seq>`. Runs written
//! before that index existed are indexed by a backfill, a page per prune
//! pass, whose progress is `P/meta/uid_index` (the last run seq indexed, or
//! `done`); until it is done a job's count can only come out low, so
//! retention deletes less, never more.

use std::collections::HashSet;

use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp};
use gnomon_core::Millis;

use super::{seq_key, ERun, EtcdStore, MAX_OPS};
use crate::{Fence, StoreError};

/// Run index entries read per backfill page.
const BACKFILL_PAGE: i64 = 1000;

impl EtcdStore {
    /// The key of a run's entry in its job's uid index.
    pub(super) fn uid_index_key(&self, job_uid: &str, seq: i64) -> String {
        self.k(&format!("idx/uid/{job_uid}/{}", seq_key(seq)))
    }

    pub(super) async fn prune_runs(
        &self,
        fence: &Fence,
        keep_per_job: usize,
        before: Millis,
        keep_keyed_after: Millis,
        max: usize,
    ) -> Result<u64, StoreError> {
        let held = |run: &ERun| crate::is_keyed_run_id(&run.id) && run.fired_at >= keep_keyed_after;
        self.backfill_uid_index(fence).await?;
        let mut victims: Vec<(ERun, i64)> = Vec::new();
        let mut chosen: HashSet<String> = HashSet::new();
        // Index entries whose run is gone (a backfill racing a deletion).
        let mut dangling: Vec<String> = Vec::new();
        // By age: the oldest runs first, in insertion order.
        let old = self
            .get(
                self.k("idx/seq/"),
                Some(GetOptions::new().with_prefix().with_sort(SortTarget::Key, SortOrder::Ascend).with_limit(max.min(2000) as i64)),
            )
            .await?;
        let ids: Vec<String> = old.kvs().iter().filter_map(|kv| kv.value_str().ok().map(str::to_string)).collect();
        for (id, (run, rev)) in self.read_runs(&ids).await? {
            if run.fired_at < before && run.state.is_terminal() && !held(&run) && chosen.insert(id) {
                victims.push((run, rev));
            }
        }
        // By count: each job's runs beyond its newest `keep_per_job`, for
        // the jobs that exist and those deleted (their runs stay until aged
        // out or counted out).
        let mut uids: Vec<String> = Vec::new();
        for prefix in ["jobs/", "job_tombstones/"] {
            let keys = self.get(self.k(prefix), Some(GetOptions::new().with_prefix().with_keys_only())).await?;
            uids.extend(keys.kvs().iter().filter_map(|kv| kv.key_str().ok().and_then(|k| k.rsplit('/').next()).map(str::to_string)));
        }
        let mut seen = HashSet::new();
        for uid in uids {
            if victims.len() >= max {
                break;
            }
            if !seen.insert(uid.clone()) {
                continue;
            }
            let prefix = self.k(&format!("idx/uid/{uid}/"));
            let count = self.get(prefix.clone(), Some(GetOptions::new().with_prefix().with_count_only())).await?.count();
            let excess = usize::try_from(count).unwrap_or(0).saturating_sub(keep_per_job).min(max - victims.len());
            if excess == 0 {
                continue;
            }
            let oldest = self
                .get(prefix, Some(GetOptions::new().with_prefix().with_sort(SortTarget::Key, SortOrder::Ascend).with_limit(excess as i64)))
                .await?;
            let entries: Vec<(String, String)> =
                oldest.kvs().iter().filter_map(|kv| Some((kv.key_str().ok()?.to_string(), kv.value_str().ok()?.to_string()))).collect();
            let ids: Vec<String> = entries.iter().map(|(_, id)| id.clone()).collect();
            let found = self.read_runs(&ids).await?;
            for (key, id) in entries {
                match found.get(&id) {
                    None => dangling.push(key),
                    Some((run, rev)) => {
                        if run.state.is_terminal() && !held(run) && chosen.insert(id) {
                            victims.push((run.clone(), *rev));
                        }
                    }
                }
            }
        }
        victims.truncate(max);
        if victims.is_empty() && dangling.is_empty() {
            // Nothing to do still answers whether this term may write.
            self.check_fenced(fence).await?;
            return Ok(0);
        }
        // Delete in txns: the run (if unchanged since read), its index
        // entries and its attempts, under the leader's fence.
        let mut deleted = 0u64;
        for chunk in victims.chunks((MAX_OPS - 4) / 7) {
            let mut compares = self.fence_compares(fence).await?;
            let mut ops = Vec::new();
            for (run, rev) in chunk {
                let key = self.k(&format!("runs/{}", run.id));
                compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, *rev));
                ops.push(TxnOp::delete(key, None));
                ops.push(TxnOp::delete(self.k(&format!("idx/seq/{}", seq_key(run.seq))), None));
                ops.push(TxnOp::delete(self.k(&format!("idx/job/{}/{}", run.job, seq_key(run.seq))), None));
                ops.push(TxnOp::delete(self.uid_index_key(&run.job_uid, run.seq), None));
                ops.push(TxnOp::delete(self.k(&format!("attempts/{}/", run.id)), Some(etcd_client::DeleteOptions::new().with_prefix())));
                ops.extend(self.notification_prune_ops(&run.id));
            }
            if self.txn(Txn::new().when(compares).and_then(ops)).await?.succeeded() {
                deleted += chunk.len() as u64;
            } else {
                // Fenced, or a run changed since it was read: left for next time.
                self.check_fenced(fence).await?;
            }
        }
        for chunk in dangling.chunks(MAX_OPS - 4) {
            let compares = self.fence_compares(fence).await?;
            let ops: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::delete(k.clone(), None)).collect();
            if !self.txn(Txn::new().when(compares).and_then(ops)).await?.succeeded() {
                self.check_fenced(fence).await?;
            }
        }
        Ok(deleted)
    }

    /// Indexes one page of runs written before the uid index existed.
    async fn backfill_uid_index(&self, fence: &Fence) -> Result<(), StoreError> {
        let marker = self.k("meta/uid_index");
        let (from, marker_rev) = match self.get(marker.clone(), None).await?.kvs().first() {
            Some(kv) if kv.value() == b"done" => return Ok(()),
            Some(kv) => (kv.value_str().ok().and_then(|v| v.parse::<i64>().ok()).unwrap_or(0), kv.mod_revision()),
            None => (0, 0),
        };
        let page = self
            .get(
                self.k(&format!("idx/seq/{}", seq_key(from + 1))),
                Some(
                    GetOptions::new()
                        .with_range(self.k("idx/seq0"))
                        .with_sort(SortTarget::Key, SortOrder::Ascend)
                        .with_limit(BACKFILL_PAGE),
                ),
            )
            .await?;
        let ids: Vec<String> = page.kvs().iter().filter_map(|kv| kv.value_str().ok().map(str::to_string)).collect();
        let runs = self.read_runs(&ids).await?;
        let mut last = from;
        let mut puts = Vec::new();
        for id in &ids {
            if let Some((run, _)) = runs.get(id) {
                puts.push(TxnOp::put(self.uid_index_key(&run.job_uid, run.seq), id.clone(), None));
                last = last.max(run.seq);
            }
        }
        if let Some(kv) = page.kvs().last() {
            // Past every entry read, indexed or gone.
            let key = kv.key_str().map_err(|e| StoreError::Corrupt(format!("run index key: {e}")))?;
            let seq = key.rsplit('/').next().and_then(|h| i64::from_str_radix(h, 16).ok()).unwrap_or(last);
            last = last.max(seq);
        }
        let done = (ids.len() as i64) < BACKFILL_PAGE;
        let mut chunks: Vec<Vec<TxnOp>> = puts.chunks(MAX_OPS - 5).map(<[TxnOp]>::to_vec).collect();
        if chunks.is_empty() {
            chunks.push(Vec::new());
        }
        let n = chunks.len();
        for (i, mut ops) in chunks.into_iter().enumerate() {
            let mut compares = self.fence_compares(fence).await?;
            if i + 1 == n {
                // The marker moves only with the page's last entries, and
                // only from where this pass read it.
                compares.push(if marker_rev == 0 {
                    Compare::version(marker.clone(), CompareOp::Equal, 0)
                } else {
                    Compare::mod_revision(marker.clone(), CompareOp::Equal, marker_rev)
                });
                ops.push(TxnOp::put(marker.clone(), if done { "done".to_string() } else { last.to_string() }, None));
            }
            if !self.txn(Txn::new().when(compares).and_then(ops)).await?.succeeded() {
                // Fenced, or another pass moved the marker: next time.
                return self.check_fenced(fence).await;
            }
        }
        Ok(())
    }
}
