//! The listener's TLS: rustls with a certificate resolver that re-reads
//! the certificate and key when their files change, and optional client
//! certificates.

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

use super::TlsFiles;

pub(super) fn crypto() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM certificate chain and its key.
pub(super) fn load_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, String> {
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
pub(super) struct ReloadingCert {
    pub(super) current: RwLock<Arc<CertifiedKey>>,
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

/// Stops the certificate reloader with the listener.
pub(super) struct ReloaderGuard(pub(super) tokio::task::JoinHandle<()>);

impl Drop for ReloaderGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}
