//! The one listener: HTTP/1.1 and HTTP/2 (the API, the UI and the worker
//! protocol), optionally TLS (rustls), with the limits that keep one client
//! from holding the server:
//! - at most `max_connections` open connections, and at most
//!   `max_connections_per_client` from one client address (an IPv6 client
//!   counts by its /64). Connections are always accepted at once, never left
//!   in the kernel's backlog: a newcomer past a limit takes the place of an
//!   idle connection (one with no request in flight; the client's own oldest
//!   when it is the client that is at its limit, else the oldest of the
//!   client holding the most), or is closed at once when every connection
//!   is busy. So idle sockets can never keep `/healthz`, a worker or the CLI
//!   out, and one address can only fill the server with requests it keeps
//!   busy, which the timeouts below bound;
//! - a connection must start its first request (TLS handshake included)
//!   within `header_read_timeout`, and an HTTP/1 request's headers must
//!   arrive within it;
//! - a connection with no request in flight for `idle_timeout` is closed
//!   (HTTP/2: GOAWAY), whatever the peer says meanwhile (pings, settings).
//!   A request in flight keeps its connection: a worker session or a raft
//!   stream lasts as long as it works;
//! - a request body (every route but the worker and raft protocols, whose
//!   streams are long-lived) must arrive whole within `body_timeout` of the
//!   request's start (408 otherwise; a trickle does not reset it);
//! - HTTP/2 connections are pinged and closed when the peer stops answering,
//!   and a client may have at most [`MAX_CONCURRENT_STREAMS`] requests open
//!   at once on one (cleartext h2c and TLS alike): a stream past it is
//!   refused (`REFUSED_STREAM`), so one connection holds no more than a
//!   few requests' worth of the server;
//! - the bodies of requests whose caller is not proven yet (webhook calls,
//!   before their signature is checked) share one budget of memory,
//!   `unproven_body_memory` ([`UnprovenBodies`], an extension on every
//!   request): a call that finds it spent is answered at once, unread.
//!
//! The certificate and key are re-read when their files change, so a
//! renewed certificate needs no restart. With `client_ca`, clients may
//! present a certificate signed by it (mutual TLS); the worker protocol
//! then requires one (see [`ClientCert`]).

mod table;
mod tls;

use table::{client_key, Busy, Conn, Leave, Table};
pub use tls::tls_config;
use tls::ReloaderGuard;

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

/// The most requests (streams) a client may have open at once on one
/// HTTP/2 connection; past it a new stream is refused (`REFUSED_STREAM`)
/// and a client that keeps to the announced setting waits instead. Enough
/// for a worker's session, a raft peer's calls, a browser's console and a
/// follower's forwarded calls.
pub const MAX_CONCURRENT_STREAMS: u32 = 32;

/// The memory, in bytes, the bodies of unproven requests (webhook calls
/// before their signature is checked) may take together by default.
pub const DEFAULT_UNPROVEN_BODY_MEMORY: usize = 16 * 1024 * 1024;

/// One budget of bytes for the bodies of requests whose caller is not
/// proven yet, shared by every connection of a listener (an extension on
/// every request it serves): a handler takes what it may keep of a body
/// before reading it, and gives it back when its caller is proven or
/// answered.
#[derive(Debug, Clone)]
pub struct UnprovenBodies(Arc<tokio::sync::Semaphore>);

impl UnprovenBodies {
    pub fn new(bytes: usize) -> Self {
        Self(Arc::new(tokio::sync::Semaphore::new(bytes.min(tokio::sync::Semaphore::MAX_PERMITS))))
    }

    /// Takes `bytes` of the budget, or `None` when they are not free now
    /// (never waits).
    pub fn take(&self, bytes: usize) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let n = u32::try_from(bytes).ok()?;
        self.0.clone().try_acquire_many_owned(n).ok()
    }

    /// The bytes free now.
    pub fn free(&self) -> usize {
        self.0.available_permits()
    }
}

/// TLS settings of the listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// CA of client certificates (mutual TLS for workers).
    pub client_ca: Option<PathBuf>,
}

/// The listener's settings.
#[derive(Debug, Clone)]
pub struct ListenConfig {
    pub max_connections: usize,
    /// Most connections one client address holds (`None`:
    /// [`default_per_client`] of `max_connections`).
    pub max_connections_per_client: Option<usize>,
    /// The TLS handshake and the first request must start within this; so
    /// must each HTTP/1 request's headers arrive.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight this long is closed.
    pub idle_timeout: Duration,
    /// A request body (but the worker and raft protocols') must arrive
    /// whole within this of the request's start.
    pub body_timeout: Duration,
    /// The memory the bodies of unproven requests (webhook calls before
    /// their signature is checked) may take together.
    pub unproven_body_memory: usize,
    pub tls: Option<TlsFiles>,
}

impl Default for ListenConfig {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_connections_per_client: None,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            unproven_body_memory: DEFAULT_UNPROVEN_BODY_MEMORY,
            tls: None,
        }
    }
}

/// The per-client cap when none is given: a quarter of `max_connections`,
/// but at least 16 (a single-host `gnomon dev` has its CLI, embedded worker
/// and console on one address), never more than `max_connections`.
pub fn default_per_client(max_connections: usize) -> usize {
    (max_connections / 4).max(16).min(max_connections).max(1)
}

impl ListenConfig {
    fn per_client(&self) -> usize {
        self.max_connections_per_client.unwrap_or_else(|| default_per_client(self.max_connections)).clamp(1, self.max_connections.max(1))
    }
}

/// Whether the connection's client presented a certificate the listener's
/// `client_ca` verified (an extension on every request of a TLS connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientCert(pub bool);

/// The client address of the connection a request came on (an extension
/// on every request, for audit lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

impl ClientAddr {
    /// The address for an audit line ("-" when the request has none).
    pub fn shown(a: Option<&ClientAddr>) -> String {
        a.map(|a| a.0.to_string()).unwrap_or_else(|| "-".into())
    }
}

/// Whether the listener requires worker sessions to present a client
/// certificate (an extension on every request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MutualTls(pub bool);

/// How long a connection that was asked to close (idle, shed, timed out)
/// may take to say goodbye (HTTP/2 GOAWAY) before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How often a connection checks its idle deadline.
const TICK: Duration = Duration::from_millis(500);

/// The long-lived streams: exempt from the request-body deadline.
fn is_stream_path(path: &str) -> bool {
    path.starts_with("/gnomon.worker.v1.Worker/") || path.starts_with("/gnomon.raft.v1.Raft/")
}

/// What every request of one connection carries.
#[derive(Debug)]
struct ConnCtx {
    conn: Arc<Conn>,
    cert: ClientCert,
    mutual: MutualTls,
    body_timeout: Duration,
    unproven: UnprovenBodies,
}

/// Counts the request in flight until its answer's body ends, puts the
/// connection's extensions on it, and holds an API request's body to its
/// deadline.
async fn track(ctx: Arc<ConnCtx>, mut request: Request, next: Next) -> Response {
    let busy = Busy::new(ctx.conn.clone());
    request.extensions_mut().insert(ctx.cert);
    request.extensions_mut().insert(ctx.mutual);
    request.extensions_mut().insert(ClientAddr(ctx.conn.client));
    request.extensions_mut().insert(ctx.unproven.clone());
    let version = request.version();
    let stalled = if is_stream_path(request.uri().path()) {
        None
    } else {
        let flag = Arc::new(AtomicBool::new(false));
        let (parts, body) = request.into_parts();
        let body = Deadline {
            inner: body,
            sleep: Box::pin(tokio::time::sleep(ctx.body_timeout)),
            timed_out: flag.clone(),
            limit: ctx.body_timeout,
        };
        request = Request::from_parts(parts, Body::new(body));
        Some(flag)
    };
    let mut response = next.run(request).await;
    if stalled.is_some_and(|f| f.load(Ordering::SeqCst)) {
        let message = format!("the request body did not arrive within {}s", ctx.body_timeout.as_secs());
        response = crate::api::error::ApiError::new(StatusCode::REQUEST_TIMEOUT, "timeout", message).into_response();
        if version <= Version::HTTP_11 {
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::new(Held { inner: body, _busy: busy }))
}

/// An answer's body, holding its request in flight until it ends.
struct Held {
    inner: Body,
    _busy: Busy,
}

impl HttpBody for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that must arrive whole before its deadline.
struct Deadline {
    inner: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
    timed_out: Arc<AtomicBool>,
    limit: Duration,
}

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        if this.timed_out.load(Ordering::SeqCst) {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.sleep.as_mut().poll(cx).is_ready() {
            this.timed_out.store(true, Ordering::SeqCst);
            let e = format!("the request body did not arrive within {}s", this.limit.as_secs());
            return Poll::Ready(Some(Err(e.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `app` until `shutdown` turns true, then lets open requests finish
/// for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    config: ListenConfig,
    shutdown: watch::Receiver<bool>,
    grace: Duration,
) -> Result<(), String> {
    let (tls, _reloader) = match &config.tls {
        Some(files) => {
            let (c, task) = tls_config(files)?;
            (Some(tokio_rustls::TlsAcceptor::from(c)), Some(ReloaderGuard(task)))
        }
        None => (None, None),
    };
    let mutual = MutualTls(config.tls.as_ref().is_some_and(|t| t.client_ca.is_some()));
    let table = Arc::new(Table::new(config.max_connections, config.per_client()));
    let unproven = UnprovenBodies::new(config.unproven_body_memory);
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(Some(config.header_read_timeout));
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(Duration::from_secs(20))
        .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS));
    let builder = Arc::new(builder);
    let mut accept_stop = shutdown.clone();
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stopped(&mut accept_stop) => break,
        };
        let conn = match table.admit(client_key(peer.ip())) {
            Ok(c) => c,
            Err(why) => {
                table.refused(&why);
                drop(tcp);
                continue;
            }
        };
        let leave = Leave(table.clone(), conn.id);
        // Worker messages are small; Nagle against delayed ACKs would hold
        // each one back for tens of milliseconds.
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let builder = builder.clone();
        let tls = tls.clone();
        let config = config.clone();
        let unproven = unproven.clone();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _leave = leave;
            let first_deadline = conn.opened + config.header_read_timeout;
            match tls {
                None => drive(&builder, tcp, app, ctx(&conn, false, mutual, &config, unproven), &config, shutdown).await,
                Some(acceptor) => {
                    let stream = tokio::select! {
                        r = tokio::time::timeout_at(first_deadline, acceptor.accept(tcp)) => match r {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => return,
                        },
                        _ = conn.shed.notified() => return,
                        _ = stopped(&mut shutdown) => return,
                    };
                    let has_cert = stream.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
                    drive(&builder, stream, app, ctx(&conn, has_cert, mutual, &config, unproven), &config, shutdown).await
                }
            }
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(grace, table.wait_empty()).await;
    Ok(())
}

fn ctx(conn: &Arc<Conn>, cert: bool, mutual: MutualTls, config: &ListenConfig, unproven: UnprovenBodies) -> Arc<ConnCtx> {
    Arc::new(ConnCtx { conn: conn.clone(), cert: ClientCert(cert), mutual, body_timeout: config.body_timeout, unproven })
}

/// Serves one connection until it ends, is idle past its allowance, is
/// shed to make room, or the server stops (then its requests may finish).
async fn drive<I>(
    builder: &Builder<TokioExecutor>,
    io: I,
    app: Router,
    ctx: Arc<ConnCtx>,
    config: &ListenConfig,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = ctx.conn.clone();
    let app = app.layer(axum::middleware::from_fn(move |request: Request, next: Next| track(ctx.clone(), request, next)));
    let served = builder.serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(app));
    tokio::pin!(served);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut drop_at: Option<Instant> = None;
    let mut stopping = false;
    loop {
        tokio::select! {
            _ = served.as_mut() => return,
            _ = conn.shed.notified(), if drop_at.is_none() => {
                served.as_mut().graceful_shutdown();
                drop_at = Some(Instant::now() + CLOSE_GRACE);
            }
            _ = stopped(&mut shutdown), if !stopping => {
                stopping = true;
                served.as_mut().graceful_shutdown();
            }
            _ = tick.tick() => {
                let now = Instant::now();
                match drop_at {
                    Some(at) if now >= at => return,
                    Some(_) => {}
                    None if conn.expired(now, config.header_read_timeout, config.idle_timeout) => {
                        tracing::debug!(client = %conn.client, "closing an idle connection");
                        metrics::counter!("gnomon_connections_closed_total", "reason" => "idle").increment(1);
                        served.as_mut().graceful_shutdown();
                        drop_at = Some(now + CLOSE_GRACE);
                    }
                    None => {}
                }
            }
        }
    }
}

/// Resolves when `shutdown` turns true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await.is_ok();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_newcomer_past_a_limit_takes_an_idle_place_or_is_refused() {
        let t = Table::new(4, 2);
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        let a1 = t.admit(a).unwrap();
        let a2 = t.admit(a).unwrap();
        let _busy = Busy::new(a2.clone());
        // a is at its cap: its own idle connection makes room.
        let a3 = t.admit(a).unwrap();
        assert!(!t.inner.lock().unwrap().conns.contains_key(&a1.id), "the idle one was shed");
        let _busy3 = Busy::new(a3.clone());
        // Now both of a's are busy: refused, while b is admitted.
        assert!(t.admit(a).unwrap_err().contains("--max-connections-per-client"));
        let b1 = t.admit(b).unwrap();
        let b2 = t.admit(b).unwrap();
        // Full (4): the idle one of the client holding the most goes.
        let c1 = t.admit(ip("10.0.0.3")).unwrap();
        assert!(!t.inner.lock().unwrap().conns.contains_key(&b1.id));
        let keep: Vec<Busy> = vec![Busy::new(c1), Busy::new(b2)];
        assert!(t.admit(ip("10.0.0.4")).unwrap_err().contains("all busy"));
        drop(keep);
        t.leave(a3.id);
        assert!(t.admit(ip("10.0.0.4")).is_ok());
    }

    #[test]
    fn clients_are_counted_by_address_and_ipv6_by_its_64() {
        assert_eq!(client_key(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(client_key(ip("2001:db8:1:2:aaaa::1")), client_key(ip("2001:db8:1:2:bbbb::2")));
        assert_ne!(client_key(ip("2001:db8:1:2::1")), client_key(ip("2001:db8:1:3::1")));
        assert_eq!(default_per_client(4096), 1024);
        assert_eq!(default_per_client(8), 8);
        assert_eq!(default_per_client(40), 16);
    }
}
