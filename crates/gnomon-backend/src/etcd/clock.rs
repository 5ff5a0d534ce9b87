//! The committed leader time on the etcd store: `P/clock/<scope>` holds the
//! highest time a leader of the scope wrote (decimal milliseconds). It is a
//! key of its own so that `fence` (which rewrites the leadership record)
//! never has to carry it over.

use etcd_client::{Compare, CompareOp, TxnOp};
use gnomon_core::Millis;

use super::{EtcdStore, CAS_ROUNDS};
use crate::{Fence, StoreError};

impl EtcdStore {
    fn clock_key(&self, scope: &str) -> String {
        self.k(&format!("clock/{scope}"))
    }

    /// The committed leader time and the key's revision (0: never written).
    pub(super) async fn read_leader_time(&self, scope: &str) -> Result<(Millis, i64), StoreError> {
        let r = self.get(self.clock_key(scope), None).await?;
        Ok(match r.kvs().first() {
            Some(kv) => (kv.value_str().ok().and_then(|v| v.parse::<Millis>().ok()).unwrap_or(0), kv.mod_revision()),
            None => (0, 0),
        })
    }

    pub(super) async fn advance_clock(&self, fence: &Fence, at: Millis) -> Result<Millis, StoreError> {
        let key = self.clock_key(&fence.scope);
        for _ in 0..CAS_ROUNDS {
            let (current, rev) = self.read_leader_time(&fence.scope).await?;
            if at <= current {
                // Nothing to raise; a deposed leader still hears that it is.
                self.check_fenced(fence).await?;
                return Ok(current);
            }
            let mut compares = self.fence_compares(fence).await?;
            compares.push(if rev == 0 {
                Compare::version(key.clone(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(key.clone(), CompareOp::Equal, rev)
            });
            if self.cas_txn(compares, vec![TxnOp::put(key.clone(), at.to_string(), None)]).await? {
                return Ok(at);
            }
            self.check_fenced(fence).await?;
        }
        Err(StoreError::Unavailable("leader time: too many concurrent writers".into()))
    }
}
