//! The etcd store's worker bindings: `P/worker_owners/<worker id>` holds
//! the credential that first opened a session with the id, as JSON. A bind
//! is one txn: if the key has never been written since it was last
//! deleted (`version == 0`) put it, else read it; so of two binds racing,
//! one puts and the other reads the winner. No lease and no pruning: the
//! key stays until an admin deletes it.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use gnomon_core::Millis;
use serde::{Deserialize, Serialize};

use super::{gets, json, parse, EtcdStore};
use crate::{StoreError, WorkerStore};

/// The value of `P/worker_owners/<worker id>`.
#[derive(Debug, Serialize, Deserialize)]
struct EOwner {
    credential: String,
    bound_at: Millis,
}

impl EtcdStore {
    fn owner_key(&self, worker: &str) -> String {
        self.k(&format!("worker_owners/{worker}"))
    }
}

#[async_trait]
impl WorkerStore for EtcdStore {
    async fn bind_worker(&self, worker: &str, credential: &str, now: Millis) -> Result<String, StoreError> {
        let key = self.owner_key(worker);
        let value = json(&EOwner { credential: credential.to_string(), bound_at: now });
        let txn = Txn::new()
            .when(vec![Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(key.clone(), value, None)])
            .or_else(vec![TxnOp::get(key, None)]);
        let resp = self.txn(txn).await?;
        if resp.succeeded() {
            return Ok(credential.to_string());
        }
        match gets(&resp).into_iter().flatten().next() {
            Some(kv) => Ok(parse::<EOwner>("worker binding", kv.value())?.credential),
            // Deleted between the compare and the read: cannot be, the txn
            // is one revision.
            None => Err(StoreError::Backend(format!("the binding of worker id {worker:?} vanished within a txn"))),
        }
    }

    async fn unbind_worker(&self, worker: &str) -> Result<bool, StoreError> {
        let resp = self.txn(Txn::new().and_then(vec![TxnOp::delete(self.owner_key(worker), None)])).await?;
        Ok(resp.op_responses().into_iter().any(|r| matches!(r, TxnOpResponse::Delete(d) if d.deleted() > 0)))
    }

    async fn worker_owner(&self, worker: &str) -> Result<Option<String>, StoreError> {
        let resp = self.get(self.owner_key(worker), None).await?;
        resp.kvs().first().map(|kv| Ok(parse::<EOwner>("worker binding", kv.value())?.credential)).transpose()
    }
}
