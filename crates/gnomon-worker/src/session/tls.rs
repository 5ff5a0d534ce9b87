//! TLS to the servers, with rustls: the server's chain is verified against
//! `--ca` (or the public web roots) for the name dialled; an embedded
//! worker also accepts its own server's current certificate as is (pinned),
//! so a self-signed development certificate works over loopback.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::WorkerTls;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let v: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{what} {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if v.is_empty() {
        return Err(format!("{what} {}: no certificate in the file", path.display()));
    }
    Ok(v)
}

/// Accepts one pinned certificate as is; anything else goes to the chain check.
#[derive(Debug)]
struct Pinned {
    pin: Option<CertificateDer<'static>>,
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.pin.as_ref().is_some_and(|p| p.as_ref() == end_entity.as_ref()) {
            return Ok(ServerCertVerified::assertion());
        }
        self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The rustls client settings, files read now (so renewals are picked up
/// at the next connect).
pub(super) fn client_config(tls: &WorkerTls) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some(ca) => {
            for c in certs(ca, "--ca")? {
                roots.add(c).map_err(|e| format!("--ca {}: {e}", ca.display()))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider()).build().map_err(|e| e.to_string())?;
    let pin = match &tls.pin {
        Some(p) => certs(p, "--tls-cert")?.into_iter().next(),
        None => None,
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned { pin, inner }));
    let mut config = match &tls.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = certs(cert, "--tls-cert")?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("--tls-cert/--tls-key: {e}"))?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Connects a channel to `addr` (`host:port`) over TLS.
pub(super) async fn connect(
    endpoint: tonic::transport::Endpoint,
    addr: &str,
    config: Arc<rustls::ClientConfig>,
) -> Result<tonic::transport::Channel, String> {
    let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr).trim_matches(['[', ']']).to_string();
    let name = ServerName::try_from(host.clone()).map_err(|e| format!("{host:?} is not a name TLS can check: {e}"))?;
    let addr = addr.to_string();
    let connector = tower::service_fn(move |_uri: tonic::transport::Uri| {
        let (config, name, addr) = (config.clone(), name.clone(), addr.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(&addr).await?;
            let _ = tcp.set_nodelay(true);
            let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    endpoint.connect_with_connector(connector).await.map_err(|e| crate::error_chain(&e))
}
