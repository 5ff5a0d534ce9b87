//! The HTTP client a follower forwards leader-only calls with.

use std::time::Duration;

/// How the API reaches the leader.
#[derive(Clone)]
pub struct Forwarder {
    pub(super) client: reqwest::Client,
    pub(super) scheme: &'static str,
}

impl Forwarder {
    /// Plain HTTP, as the servers of a cluster without TLS speak.
    pub fn plain() -> Self {
        Self { client: client(reqwest::Client::builder()), scheme: "http" }
    }

    /// HTTPS to the leader's listener, trusting `ca` (PEM) besides the
    /// public roots.
    pub fn tls(ca: Option<&[u8]>) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder();
        if let Some(pem) = ca {
            for cert in reqwest::Certificate::from_pem_bundle(pem).map_err(|e| format!("--ca: {e}"))? {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(Self { client: client(builder), scheme: "https" })
    }
}

fn client(builder: reqwest::ClientBuilder) -> reqwest::Client {
    builder
        .timeout(Duration::from_secs(40))
        .connect_timeout(Duration::from_secs(3))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default()
}
