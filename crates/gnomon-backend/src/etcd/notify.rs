//! The etcd store's notification outbox: `P/notify/<id>` holds a
//! notification (its id begins with its run's id and a `/`, so a run's are
//! one prefix), and `P/notify_due/<id>` holds the due time of each pending
//! one, so the deliverer scans only what is pending.

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use gnomon_core::Millis;

use super::{json, parse, EtcdStore};
use crate::{Delivery, NewNotification, Notification, NotificationState, StoreError};

impl EtcdStore {
    /// The puts that write a new notification (a transition's, in its txn).
    pub(super) fn notification_ops(&self, n: &NewNotification) -> [TxnOp; 2] {
        [
            TxnOp::put(self.k(&format!("notify/{}", n.id)), json(&Notification::new(n)), None),
            TxnOp::put(self.k(&format!("notify_due/{}", n.id)), n.created_at.to_string(), None),
        ]
    }

    /// The deletes that go with a pruned run.
    pub(super) fn notification_prune_ops(&self, run_id: &str) -> [TxnOp; 2] {
        [
            TxnOp::delete(self.k(&format!("notify/{run_id}/")), Some(DeleteOptions::new().with_prefix())),
            TxnOp::delete(self.k(&format!("notify_due/{run_id}/")), Some(DeleteOptions::new().with_prefix())),
        ]
    }

    pub(super) async fn due(&self, now: Millis, limit: u32) -> Result<Vec<Notification>, StoreError> {
        let prefix = self.k("notify_due/");
        let resp = self.get(prefix.clone(), Some(GetOptions::new().with_prefix())).await?;
        let mut due: Vec<(Millis, String)> = Vec::new();
        for kv in resp.kvs() {
            let at: Millis = kv.value_str().ok().and_then(|v| v.parse().ok()).unwrap_or(0);
            if at <= now {
                let key = kv.key_str().map_err(|e| StoreError::Corrupt(format!("notification key: {e}")))?;
                due.push((at, key.trim_start_matches(&prefix).to_string()));
            }
        }
        due.sort();
        due.truncate(limit.clamp(1, 1000) as usize);
        let keys: Vec<String> = due.iter().map(|(_, id)| self.k(&format!("notify/{id}"))).collect();
        let mut out = Vec::new();
        for kv in self.get_many(&keys).await?.into_iter().flatten() {
            let n: Notification = parse("notification", kv.value())?;
            if n.state == NotificationState::Pending {
                out.push(n);
            }
        }
        Ok(out)
    }

    pub(super) async fn settle(&self, fence: &crate::Fence, d: &Delivery) -> Result<bool, StoreError> {
        let key = self.k(&format!("notify/{}", d.id));
        let resp = self.get(key.clone(), None).await?;
        let Some(kv) = resp.kvs().first() else { return self.check_fenced(fence).await.map(|()| false) };
        let mut n: Notification = parse("notification", kv.value())?;
        if n.state != NotificationState::Pending || n.attempts != d.attempts_before {
            return self.check_fenced(fence).await.map(|()| false);
        }
        n.state = d.state;
        n.attempts = d.attempts;
        n.next_at = d.next_at;
        n.last_error = d.error.clone();
        n.updated_at = d.at;
        let mut compares = self.fence_compares(fence).await?;
        compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision()));
        let due_key = self.k(&format!("notify_due/{}", d.id));
        let due_op = match d.state {
            NotificationState::Pending => TxnOp::put(due_key, d.next_at.to_string(), None),
            _ => TxnOp::delete(due_key, None),
        };
        let ops = vec![TxnOp::put(key, json(&n), None), due_op];
        if self.txn(Txn::new().when(compares).and_then(ops)).await?.succeeded() {
            return Ok(true);
        }
        self.check_fenced(fence).await.map(|()| false)
    }

    pub(super) async fn of_run(&self, run_id: &str) -> Result<Vec<Notification>, StoreError> {
        let resp = self.get(self.k(&format!("notify/{run_id}/")), Some(GetOptions::new().with_prefix())).await?;
        resp.kvs().iter().map(|kv| parse("notification", kv.value())).collect()
    }
}
