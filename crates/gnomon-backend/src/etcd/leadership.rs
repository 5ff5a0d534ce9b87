//! Terms and fencing: the epoch counter, the fence key a term takes, and
//! the leadership record.

use etcd_client::{Compare, CompareOp, GetOptions, TxnOp};
use gnomon_core::Millis;

use super::*;

impl EtcdStore {
    pub(super) async fn bump_epoch(&self, scope: &str) -> Result<u64, StoreError> {
        let key = self.k(&format!("epochs/{scope}"));
        for _ in 0..CAS_ROUNDS {
            let (epoch, rev) = {
                let r = self.get(key.clone(), None).await?;
                match r.kvs().first() {
                    Some(kv) => (kv.value_str().ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0), kv.mod_revision()),
                    None => (0, 0),
                }
            };
            let fenced = self.leadership(scope).await?.map(|l| l.token).unwrap_or(0);
            let next = epoch.max(fenced) + 1;
            let cmp = if rev == 0 {
                Compare::version(key.clone(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(key.clone(), CompareOp::Equal, rev)
            };
            if self.cas_txn(vec![cmp], vec![TxnOp::put(key.clone(), next.to_string(), None)]).await? {
                return Ok(next);
            }
        }
        Err(StoreError::Unavailable("epoch: too many concurrent writers".into()))
    }

    pub(super) async fn take_fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError> {
        let fkey = self.k(&format!("fence/{}", fence.scope));
        // The election key whose create revision is this token, if the
        // term came from the etcd election of this cluster.
        let election = self.get(self.k(&format!("election/{}/", fence.scope)), Some(GetOptions::new().with_prefix())).await?;
        let leader_key = election
            .kvs()
            .iter()
            .find(|kv| u64::try_from(kv.create_revision()).ok() == Some(fence.token))
            .and_then(|kv| kv.key_str().ok().map(str::to_string));
        for _ in 0..CAS_ROUNDS {
            let r = self.get(fkey.clone(), None).await?;
            let (current, rev) = match r.kvs().first() {
                Some(kv) => (kv.value_str().ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0), kv.mod_revision()),
                None => (0, 0),
            };
            if fence.token <= current {
                return Err(StoreError::StaleToken { scope: fence.scope.clone(), token: fence.token, current });
            }
            let mut compares = vec![if rev == 0 {
                Compare::version(fkey.clone(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(fkey.clone(), CompareOp::Equal, rev)
            }];
            if let Some(k) = &leader_key {
                compares.push(Compare::create_revision(k.clone(), CompareOp::Equal, i64::try_from(fence.token).unwrap_or(i64::MAX)));
            }
            let rec = ELeadership {
                token: fence.token,
                holder: holder.holder.clone(),
                address: holder.address.clone(),
                backend: holder.backend.clone(),
                since: now,
                leader_key: leader_key.clone(),
            };
            let ops = vec![
                TxnOp::put(fkey.clone(), fence.token.to_string(), None),
                TxnOp::put(self.k(&format!("leadership/{}", fence.scope)), json(&rec), None),
            ];
            if self.cas_txn(compares, ops).await? {
                self.terms.lock().unwrap_or_else(|p| p.into_inner()).insert(fence.scope.clone(), (fence.token, leader_key));
                return Ok(());
            }
        }
        Err(StoreError::Unavailable("fence: too many concurrent writers".into()))
    }

    pub(super) async fn read_leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError> {
        let r = self.get(self.k(&format!("leadership/{scope}")), None).await?;
        let Some(kv) = r.kvs().first() else { return Ok(None) };
        let l: ELeadership = parse("leadership", kv.value())?;
        Ok(Some(LeadershipRecord {
            scope: scope.into(),
            token: l.token,
            holder: l.holder,
            address: l.address,
            backend: l.backend,
            since: l.since,
            leader_time: self.read_leader_time(scope).await?.0,
        }))
    }
}
