//! A worker with its own handler, written as a Rust program.
//!
//! ```sh
//! gnomon dev &                                           # a server on 127.0.0.1:7400
//! cargo run -p gnomon-worker --example custom_handler -- 127.0.0.1:7400
//! curl -s -XPOST localhost:7400/v1/jobs -d '{"name":"greet","schedule":{"every":"5s"},
//!   "executor":{"handler":{"name":"greet","payload":{"who":"world"}}},
//!   "route":{"labels":{"lang":"rust"}}}'
//! ```
//!
//! The handler receives the run id (the idempotency key: stable across
//! attempts) and the leader's token (to fence its own side effects).

use std::sync::Arc;

use gnomon_worker::{Handler, HandlerContext, HandlerRegistry, WorkerConfig, WorkerRuntime};

struct Greet;

#[async_trait::async_trait]
impl Handler for Greet {
    async fn call(&self, ctx: HandlerContext, payload: serde_json::Value) -> Result<String, gnomon_worker::HandlerError> {
        let who = payload.get("who").and_then(|w| w.as_str()).ok_or("payload needs a string field `who`")?;
        Ok(format!("hello, {who} (run {} attempt {}, token {})", ctx.run_id, ctx.attempt, ctx.token))
    }
}

#[tokio::main]
async fn main() {
    let server = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:7400".into());
    let mut handlers = HandlerRegistry::with_builtins();
    handlers.register("greet", Arc::new(Greet));
    let mut config = WorkerConfig::new("greeter-1", vec![server]);
    config.capacity = 8;
    config.labels.insert("lang".into(), "rust".into());
    config.spool_dir = Some(std::env::temp_dir().join("gnomon-greeter-spool"));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = stop_tx.send(true);
    });
    WorkerRuntime::new(config, handlers).run(stop_rx).await;
}
