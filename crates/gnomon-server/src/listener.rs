//! The one listener: HTTP/1.1 and HTTP/2 (the API, the UI and the worker
//! protocol), optionally TLS (rustls), with the limits that keep one client
//! from holding the server:
//! - at most `max_connections` open connections (past it, new ones wait in
//!   the kernel's backlog);
//! - a TLS handshake must finish, and an HTTP/1 request's headers must
//!   arrive, within `header_read_timeout`;
//! - HTTP/2 connections are pinged and closed when the peer stops answering.
//!
//! The certificate and key are re-read when their files change, so a
//! renewed certificate needs no restart. With `client_ca`, clients may
//! present a certificate signed by it (mutual TLS); the worker protocol
//! then requires one (see [`ClientCert`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::watch;

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
    pub header_read_timeout: Duration,
    pub tls: Option<TlsFiles>,
}

impl Default for ListenConfig {
    fn default() -> Self {
        Self { max_connections: 4096, header_read_timeout: Duration::from_secs(10), tls: None }
    }
}

/// Whether the connection's client presented a certificate the listener's
/// `client_ca` verified (an extension on every request of a TLS connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientCert(pub bool);

/// Whether the listener requires worker sessions to present a client
/// certificate (an extension on every request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MutualTls(pub bool);

fn crypto() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM certificate chain and its key.
fn load_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("--tls-cert {}: no certificate in the file", cert.display()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let signing = crypto().key_provider.load_private_key(key_der).map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let ck = CertifiedKey::new(chain, signing);
    ck.keys_match().map_err(|e| format!("--tls-cert and --tls-key do not belong together: {e}"))?;
    Ok(Arc::new(ck))
}

/// The certificate in force, swapped when the files change.
#[derive(Debug)]
struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.clone())
    }
}

/// Builds the rustls configuration and a task that reloads the certificate.
pub fn tls_config(files: &TlsFiles) -> Result<(Arc<rustls::ServerConfig>, tokio::task::JoinHandle<()>), String> {
    let resolver = Arc::new(ReloadingCert { current: RwLock::new(load_key(&files.cert, &files.key)?) });
    let builder = rustls::ServerConfig::builder_with_provider(crypto()).with_safe_default_protocol_versions().map_err(|e| e.to_string())?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| format!("--client-ca {}: {e}", ca.display()))? {
                let c = c.map_err(|e| format!("--client-ca {}: {e}", ca.display()))?;
                roots.add(c).map_err(|e| format!("--client-ca {}: {e}", ca.display()))?;
            }
            // API clients need no certificate; worker sessions are checked
            // for one (MutualTls / ClientCert).
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), crypto())
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("--client-ca {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let files = files.clone();
    let task = tokio::spawn(async move {
        let stamp = crate::auth::file_stamp;
        let mut last = (stamp(&files.cert), stamp(&files.key));
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = (stamp(&files.cert), stamp(&files.key));
            if now == last {
                continue;
            }
            last = now;
            match load_key(&files.cert, &files.key) {
                Ok(k) => {
                    if let Ok(mut cur) = resolver.current.write() {
                        *cur = k;
                    }
                    tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
                }
                // A half-written pair (cert renewed, key not yet): keep the old one.
                Err(e) => tracing::warn!(error = %e, "TLS certificate not reloaded; the previous one stays in force"),
            }
        }
    });
    Ok((Arc::new(config), task))
}

/// Serves `app` until `shutdown` turns true, then lets open requests finish
/// for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    config: ListenConfig,
    mut shutdown: watch::Receiver<bool>,
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
    let permits = Arc::new(tokio::sync::Semaphore::new(config.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(Some(config.header_read_timeout));
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(Duration::from_secs(20))
        .max_concurrent_streams(Some(1024));
    let builder = Arc::new(builder);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stopped(&mut shutdown) => break,
        };
        let (tcp, _peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stopped(&mut shutdown) => break,
        };
        // Worker messages are small; Nagle against delayed ACKs would hold
        // each one back for tens of milliseconds.
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let builder = builder.clone();
        let tls = tls.clone();
        let handshake_timeout = config.header_read_timeout;
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                None => {
                    let svc = TowerToHyperService::new(app.layer(axum::Extension(ClientCert(false))).layer(axum::Extension(mutual)));
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), svc);
                    let _ = watcher.watch(conn.into_owned()).await;
                }
                Some(acceptor) => {
                    let stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    let has_cert = stream.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
                    let svc = TowerToHyperService::new(app.layer(axum::Extension(ClientCert(has_cert))).layer(axum::Extension(mutual)));
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
                    let _ = watcher.watch(conn.into_owned()).await;
                }
            }
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(grace, graceful.shutdown()).await;
    Ok(())
}

/// Resolves when `shutdown` turns true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await.is_ok();
}

/// Stops the certificate reloader with the listener.
struct ReloaderGuard(tokio::task::JoinHandle<()>);

impl Drop for ReloaderGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}
