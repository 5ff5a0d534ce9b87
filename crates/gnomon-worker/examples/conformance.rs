//! The conformance worker: the standard handlers every worker SDK carries
//! (Rust here, `python -m gnomon_worker.conformance`,
//! `node dist/conformance.js`), so one list of protocol cases runs against
//! each of them.
//!
//! ```sh
//! cargo run -p gnomon-worker --example conformance -- --server 127.0.0.1:7400 --id rust-1 --label sdk=rust
//! ```
//!
//! `fenced_step` pays once per run through `gnomon-fence` (see
//! [`FencedStep`]), as the Python and TypeScript conformance workers do
//! through their own fence helpers.
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

/// This worker's id, as a paused attempt notes it.
static WORKER_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Appends `line` to the file GNOMON_CONFORMANCE_LOG names, if it names one.
fn note(line: &str) {
    if let Ok(path) = std::env::var("GNOMON_CONFORMANCE_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Where attempt 1 stops, if the payload says so: notes
/// `"<run> 1 <worker> paused <where>"` and sleeps there (not looking at
/// its cancel signal: a job that does not cooperate), to be frozen there.
#[derive(Clone)]
struct Pause {
    at: Option<String>,
    seconds: f64,
    me: String,
    worker: String,
}

impl Pause {
    async fn at(&self, place: &str) {
        if self.at.as_deref() == Some(place) {
            note(&format!("{} {} paused {place}", self.me, self.worker));
            tokio::time::sleep(Duration::from_secs_f64(self.seconds)).await;
        }
    }
}

/// Pays once per run: inserts `(run_id, attempt, amount)` into `payments`
/// of the database payload.dsn (`postgres://` or `mysql://`) in the
/// exactly-once step `payment` (`begin_attempt`, then `run_step`), and
/// returns the step's result as JSON. payload.pause (`before_guard`,
/// `in_tx`, `after_commit`) stops attempt 1 there for
/// payload.pause_seconds (3); payload.lock_wait and payload.idle (seconds)
/// go to the guard; payload.guarded false makes the same insert in a plain
/// transaction. Notes `"<run> <attempt> committed|recorded paid_by=<n>"`,
/// or `"<run> <attempt> failed: <error>"`, in GNOMON_CONFORMANCE_LOG.
struct FencedStep;
#[async_trait::async_trait]
impl Handler for FencedStep {
    async fn call(&self, ctx: HandlerContext, payload: Value) -> Result<String, HandlerError> {
        let me = format!("{} {}", ctx.run_id, ctx.attempt);
        let dsn = payload.get("dsn").and_then(Value::as_str).unwrap_or_default().to_string();
        let paid = if dsn.starts_with("postgres://") || dsn.starts_with("postgresql://") {
            pay_on_postgres(&ctx, &payload, &dsn).await
        } else if dsn.starts_with("mysql://") {
            pay_on_mysql(&ctx, &payload, &dsn).await
        } else {
            return Err(HandlerError::non_retryable(format!("not a postgres:// or mysql:// URL: {dsn:?}")));
        };
        match paid {
            Ok((ran, result)) => {
                note(&format!("{me} {} paid_by={}", if ran { "committed" } else { "recorded" }, result["paid_by"]));
                Ok(result.to_string())
            }
            Err(e) => {
                note(&format!("{me} failed: {}", e.replace('\n', " ")));
                Err(e.into())
            }
        }
    }
}

/// The same steps on each database (sqlx's types differ per database, and
/// so does the insert's placeholder).
macro_rules! pay_on {
    ($name:ident, $conn:ty, $insert:literal) => {
        async fn $name(ctx: &HandlerContext, p: &Value, dsn: &str) -> Result<(bool, Value), String> {
            use sqlx::Connection;
            let secs = |key: &str, default: f64| Duration::from_secs_f64(p.get(key).and_then(Value::as_f64).unwrap_or(default));
            let options = gnomon_fence::Options::default().lock_wait(secs("lock_wait", 5.0)).idle(secs("idle", 10.0));
            let pause = Pause {
                at: if ctx.attempt == 1 { p.get("pause").and_then(Value::as_str).map(str::to_string) } else { None },
                seconds: p.get("pause_seconds").and_then(Value::as_f64).unwrap_or(3.0),
                me: format!("{} {}", ctx.run_id, ctx.attempt),
                worker: WORKER_ID.get().cloned().unwrap_or_default(),
            };
            let (run_id, attempt) = (ctx.run_id.clone(), i64::from(ctx.attempt));
            let amount = p.get("amount").and_then(Value::as_i64).unwrap_or(10);
            let result = json!({"paid_by": attempt, "amount": amount});
            let fence = ctx.fence();
            let mut conn = <$conn>::connect(dsn).await.map_err(|e| e.to_string())?;
            let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let result = if p.get("guarded").and_then(Value::as_bool).unwrap_or(true) {
                gnomon_fence::begin_attempt_with(&mut conn, &fence, &options).await.map_err(|e| e.to_string())?;
                pause.at("before_guard").await;
                let (ran, pause) = (ran.clone(), pause.clone());
                gnomon_fence::run_step_with(&mut conn, &fence, "payment", &options, move |tx| {
                    Box::pin(async move {
                        ran.store(true, std::sync::atomic::Ordering::SeqCst);
                        sqlx::query($insert).bind(run_id).bind(attempt).bind(amount).execute(&mut **tx).await?;
                        pause.at("in_tx").await;
                        Ok::<Value, gnomon_fence::FenceError>(result)
                    })
                })
                .await
                .map_err(|e| e.to_string())?
            } else {
                pause.at("before_guard").await;
                let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
                ran.store(true, std::sync::atomic::Ordering::SeqCst);
                sqlx::query($insert).bind(run_id).bind(attempt).bind(amount).execute(&mut *tx).await.map_err(|e| e.to_string())?;
                pause.at("in_tx").await;
                tx.commit().await.map_err(|e| e.to_string())?;
                result
            };
            pause.at("after_commit").await;
            let _ = conn.close().await;
            Ok((ran.load(std::sync::atomic::Ordering::SeqCst), result))
        }
    };
}

pay_on!(pay_on_postgres, sqlx::PgConnection, "INSERT INTO payments (run_id, attempt, amount) VALUES ($1, $2, $3)");
pay_on!(pay_on_mysql, sqlx::MySqlConnection, "INSERT INTO payments (run_id, attempt, amount) VALUES (?, ?, ?)");

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
    let _ = WORKER_ID.set(config.id.clone());
    config.executors = vec!["handler".into()];
    let mut handlers = HandlerRegistry::default();
    handlers.register("echo", Arc::new(Echo));
    handlers.register("fail", Arc::new(Fail));
    handlers.register("no_retry", Arc::new(NoRetry));
    handlers.register("retry_after", Arc::new(RetryAfter));
    handlers.register("sleep", Arc::new(Sleep));
    handlers.register("log", Arc::new(Log));
    handlers.register("fenced_step", Arc::new(FencedStep));
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
