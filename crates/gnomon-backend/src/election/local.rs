//! The local elector: this process always leads. Its token comes from the
//! store's epoch counter, so every start is a new, higher term and a stale
//! process sharing the same store is fenced out by the store.
//!
//! It is only safe with a store no other gnomon server writes to (the
//! embedded SQLite store, whose data directory the binary locks).

use std::sync::Mutex;

use async_trait::async_trait;

use crate::{ElectionError, Elector, Fence, LeaderInfo, Leadership, Store};

#[derive(Debug)]
pub struct LocalElector {
    store: std::sync::Arc<dyn Store>,
    terms: Mutex<Vec<(u64, tokio::sync::watch::Sender<bool>)>>,
}

impl LocalElector {
    pub fn new(store: std::sync::Arc<dyn Store>) -> Self {
        Self { store, terms: Mutex::new(Vec::new()) }
    }
}

#[async_trait]
impl Elector for LocalElector {
    fn backend(&self) -> &'static str {
        "local"
    }

    async fn campaign(&self, scope: &str, me: &LeaderInfo) -> Result<Leadership, ElectionError> {
        let token = self.store.next_epoch(scope).await?;
        let info = LeaderInfo { backend: "local".into(), ..me.clone() };
        self.store.fence(&Fence { scope: scope.to_string(), token }, &info, gnomon_core::chrono::Utc::now().timestamp_millis()).await?;
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut terms = self.terms.lock().unwrap_or_else(|p| p.into_inner());
        // A new term ends every earlier one of this elector.
        for (_, old) in terms.drain(..) {
            let _ = old.send(true);
        }
        terms.push((token, tx));
        Ok(Leadership { scope: scope.to_string(), token, lost: rx })
    }

    async fn resign(&self, leadership: &Leadership) -> Result<(), ElectionError> {
        let mut terms = self.terms.lock().unwrap_or_else(|p| p.into_inner());
        terms.retain(|(token, tx)| {
            if *token == leadership.token {
                let _ = tx.send(true);
                false
            } else {
                true
            }
        });
        Ok(())
    }
}
