//! The conformance worker: the standard handlers every worker SDK carries
//! (Rust here, `python -m gnomon_worker.conformance`,
//! `node dist/conformance.js`), so one list of protocol cases runs against
//! each of them.
//!
//! ```sh
//! cargo run -p gnomon-worker --example conformance -- --server 127.0.0.1:7400 --id rust-1 --label sdk=rust
//! ```
//!
//! Flags: `--server HOST:PORT` (repeatable or comma-separated), `--id ID`,
//! `--capacity N` (4), `--prefetch N` (0), `--spool DIR`, `--token T`,
//! `--label k=v` (repeatable), `--ca PEM`.

use std::sync::Arc;
use std::time::Duration;

use gnomon_worker::{Handler, HandlerContext, HandlerError, HandlerRegistry, WorkerConfig, WorkerRuntime, WorkerTls};
use serde_json::{json, Value};

/// One line of JSON: what the attempt was given.
struct Echo;
#[async_trait::async_trait]
impl Handler for Echo {
    async fn call(&self, ctx: HandlerContext, payload: Value) -> Result<String, HandlerError> {
        Ok(json!({
            "run_id": ctx.run_id,
            "attempt": ctx.attempt,
            "job": ctx.job,
            "namespace": ctx.namespace,
            "scheduled_at_ms": ctx.scheduled_at,
            "params": ctx.params,
            "payload": payload,
            "run_payload": ctx.run_payload,
            "token": ctx.token.to_string(),
        })
        .to_string())
    }
}

struct Fail;
#[async_trait::async_trait]
impl Handler for Fail {
    async fn call(&self, _: HandlerContext, _: Value) -> Result<String, HandlerError> {
        Err("boom".into())
    }
}

struct NoRetry;
#[async_trait::async_trait]
impl Handler for NoRetry {
    async fn call(&self, _: HandlerContext, _: Value) -> Result<String, HandlerError> {
        Err(HandlerError::non_retryable("bad input"))
    }
}

struct RetryAfter;
#[async_trait::async_trait]
impl Handler for RetryAfter {
    async fn call(&self, ctx: HandlerContext, payload: Value) -> Result<String, HandlerError> {
        if ctx.attempt > 1 {
            return Ok("ok".into());
        }
        let seconds = payload.get("seconds").and_then(Value::as_f64).unwrap_or(1.0);
        Err(HandlerError::retry_after(Duration::from_secs_f64(seconds.max(0.001)), "not yet"))
    }
}

/// Notes its start, then ticks every 100 ms until done or cancelled.
struct Sleep;
#[async_trait::async_trait]
impl Handler for Sleep {
    async fn call(&self, ctx: HandlerContext, payload: Value) -> Result<String, HandlerError> {
        if let Ok(path) = std::env::var("GNOMON_CONFORMANCE_LOG") {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| e.to_string())?;
            writeln!(f, "{} {} start", ctx.run_id, ctx.attempt).map_err(|e| e.to_string())?;
        }
        let seconds = payload.get("seconds").and_then(Value::as_f64).unwrap_or(60.0);
        let ticks = (seconds * 10.0) as u64;
        let mut cancelled = ctx.cancelled.clone();
        for n in 1..=ticks {
            ctx.log.line(format!("INFO tick {n}"));
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = cancelled.wait_for(|c| *c) => break,
            }
        }
        Ok("slept".into())
    }
}

struct Log;
#[async_trait::async_trait]
impl Handler for Log {
    async fn call(&self, ctx: HandlerContext, payload: Value) -> Result<String, HandlerError> {
        let lines = payload.get("lines").and_then(Value::as_u64).unwrap_or(1000);
        let width = payload.get("width").and_then(Value::as_u64).unwrap_or(100) as usize;
        for _ in 0..lines {
            ctx.log.line(format!("INFO {}", "x".repeat(width)));
        }
        Ok("logged".into())
    }
}

fn usage(why: &str) -> ! {
    eprintln!("conformance: {why}");
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(false).init();
    let mut servers = Vec::new();
    let mut config = WorkerConfig::new("rust-conformance", Vec::new());
    config.capacity = 4;
    config.prefetch = 0;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--server" => servers.extend(value().split(',').map(str::to_string)),
            "--id" => config.id = value(),
            "--capacity" => config.capacity = value().parse().unwrap_or_else(|_| usage("--capacity: a number")),
            "--prefetch" => config.prefetch = value().parse().unwrap_or_else(|_| usage("--prefetch: a number")),
            "--spool" => config.spool_dir = Some(value().into()),
            "--token" => config.token = Some(value()),
            "--ca" => config.tls = Some(WorkerTls { ca: Some(value().into()), ..Default::default() }),
            "--label" => {
                let v = value();
                let (k, v) = v.split_once('=').unwrap_or_else(|| usage("--label: k=v"));
                config.labels.insert(k.into(), v.into());
            }
            other => usage(&format!("unknown flag {other}")),
        }
    }
    if servers.is_empty() {
        usage("give --server HOST:PORT");
    }
    config.servers = servers;
    config.executors = vec!["handler".into()];
    let mut handlers = HandlerRegistry::default();
    handlers.register("echo", Arc::new(Echo));
    handlers.register("fail", Arc::new(Fail));
    handlers.register("no_retry", Arc::new(NoRetry));
    handlers.register("retry_after", Arc::new(RetryAfter));
    handlers.register("sleep", Arc::new(Sleep));
    handlers.register("log", Arc::new(Log));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop_tx.send(true);
    });
    WorkerRuntime::new(config, handlers).run(stop_rx).await;
}
