//! The etcd store's backfills: `P/backfills/<id>` holds a backfill record
//! as JSON, and `P/backfills_running/<id>` (empty) is present while it
//! runs, so the leader's poll reads only the running ones. Changes are
//! compare-and-swaps on the record's revision; a progress report also
//! compares the fence.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use gnomon_core::Millis;

use super::{json, parse, EtcdStore, CAS_ROUNDS};
use crate::{BackfillProgress, BackfillRecord, BackfillState, BackfillStore, Fence, NewBackfill, StoreError};

impl EtcdStore {
    async fn backfill_at(&self, id: &str) -> Result<Option<(BackfillRecord, i64)>, StoreError> {
        let resp = self.get(self.k(&format!("backfills/{id}")), None).await?;
        resp.kvs().first().map(|kv| Ok((parse::<BackfillRecord>("backfill", kv.value())?, kv.mod_revision()))).transpose()
    }

    /// The puts (and the delete of the running mark once it has ended)
    /// that write `b`.
    fn backfill_ops(&self, b: &BackfillRecord) -> Vec<TxnOp> {
        let running = self.k(&format!("backfills_running/{}", b.id));
        let mark = match b.state {
            BackfillState::Running => TxnOp::put(running, "", None),
            _ => TxnOp::delete(running, None),
        };
        vec![TxnOp::put(self.k(&format!("backfills/{}", b.id)), json(b), None), mark]
    }

    async fn all_backfills(&self) -> Result<Vec<BackfillRecord>, StoreError> {
        let resp = self.get(self.k("backfills/"), Some(GetOptions::new().with_prefix())).await?;
        resp.kvs().iter().map(|kv| parse::<BackfillRecord>("backfill", kv.value())).collect()
    }
}

#[async_trait]
impl BackfillStore for EtcdStore {
    async fn create_backfill(&self, b: &NewBackfill, now: Millis) -> Result<BackfillRecord, StoreError> {
        let rec = BackfillRecord::new(b, now);
        let key = self.k(&format!("backfills/{}", b.id));
        let ops = self.backfill_ops(&rec);
        if self.txn(Txn::new().when(vec![Compare::version(key, CompareOp::Equal, 0)]).and_then(ops)).await?.succeeded() {
            return Ok(rec);
        }
        Err(StoreError::AlreadyExists(format!("backfill {}", b.id)))
    }

    async fn get_backfill(&self, id: &str) -> Result<Option<BackfillRecord>, StoreError> {
        Ok(self.backfill_at(id).await?.map(|(b, _)| b))
    }

    async fn list_backfills(&self, namespace: Option<&str>) -> Result<Vec<BackfillRecord>, StoreError> {
        let mut list: Vec<BackfillRecord> =
            self.all_backfills().await?.into_iter().filter(|b| namespace.is_none_or(|ns| b.namespace == ns)).collect();
        list.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        list.truncate(1000);
        Ok(list)
    }

    async fn cancel_backfill(&self, id: &str, now: Millis) -> Result<BackfillRecord, StoreError> {
        for _ in 0..CAS_ROUNDS {
            let Some((mut b, rev)) = self.backfill_at(id).await? else {
                return Err(StoreError::NotFound(format!("backfill {id}")));
            };
            if !b.cancel(now) {
                return Err(StoreError::Terminal(format!("backfill {id}")));
            }
            let key = self.k(&format!("backfills/{id}"));
            if self.cas_txn(vec![Compare::mod_revision(key, CompareOp::Equal, rev)], self.backfill_ops(&b)).await? {
                return Ok(b);
            }
        }
        Err(StoreError::Unavailable("cancel: too many concurrent writers".into()))
    }

    async fn running_backfills(&self) -> Result<Vec<BackfillRecord>, StoreError> {
        let prefix = self.k("backfills_running/");
        let marks = self.get(prefix.clone(), Some(GetOptions::new().with_prefix().with_keys_only())).await?;
        let mut keys = Vec::new();
        for kv in marks.kvs() {
            let key = kv.key_str().map_err(|e| StoreError::Corrupt(format!("backfill mark: {e}")))?;
            keys.push(self.k(&format!("backfills/{}", key.trim_start_matches(&prefix))));
        }
        let mut list = Vec::new();
        for kv in self.get_many(&keys).await?.into_iter().flatten() {
            let b: BackfillRecord = parse("backfill", kv.value())?;
            if b.state == BackfillState::Running {
                list.push(b);
            }
        }
        list.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(list)
    }

    async fn advance_backfill(&self, fence: &Fence, p: &BackfillProgress) -> Result<bool, StoreError> {
        let Some((mut b, rev)) = self.backfill_at(&p.id).await? else { return self.check_fenced(fence).await.map(|()| false) };
        if !b.advance(p) {
            return self.check_fenced(fence).await.map(|()| false);
        }
        let key = self.k(&format!("backfills/{}", p.id));
        let mut compares = self.fence_compares(fence).await?;
        compares.push(Compare::mod_revision(key, CompareOp::Equal, rev));
        if self.cas_txn(compares, self.backfill_ops(&b)).await? {
            return Ok(true);
        }
        self.check_fenced(fence).await.map(|()| false)
    }
}
