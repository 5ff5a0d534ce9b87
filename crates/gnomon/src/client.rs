//! A small typed REST client for the CLI.

use anyhow::{anyhow, Context};
use gnomon_api::ErrorBody;
pub use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub struct Client {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

/// Percent-encodes one path segment.
pub fn path_segment(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

impl Client {
    pub fn new(base: &str, token: Option<&str>, ca: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(anyhow!("--server must be an http:// or https:// URL, got {base:?}"));
        }
        let mut builder = reqwest::Client::builder().timeout(std::time::Duration::from_secs(60));
        if let Some(ca) = ca {
            let pem = std::fs::read(ca).with_context(|| format!("--ca {}", ca.display()))?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).with_context(|| format!("--ca {}: not a PEM certificate", ca.display()))?;
            if certs.is_empty() {
                return Err(anyhow!("--ca {}: no certificate in the file", ca.display()));
            }
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let http = builder.build().context("building the HTTP client")?;
        Ok(Self { base, http, token: token.map(str::to_string) })
    }

    /// `GET path?query`, read as `T`.
    pub async fn get<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<T> {
        self.call(Method::GET, path, query, None::<&()>).await
    }

    /// A call whose answer is read as `T`.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> anyhow::Result<T> {
        self.call_with(method, path, query, &[], body).await
    }

    /// [`Client::call`] with more request headers.
    pub async fn call_with<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        headers: &[(&str, String)],
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> anyhow::Result<T> {
        let body = body.map(|b| serde_json::to_vec(b).map(|v| (v, "application/json"))).transpose().context("encoding the request")?;
        let text = self.raw(method, path, query, headers, body).await?;
        serde_json::from_str(&text).with_context(|| format!("the server's answer is not what this client expects: {text}"))
    }

    /// A call whose answer has no body.
    pub async fn call_empty(&self, method: Method, path: &str, query: &[(&str, String)]) -> anyhow::Result<()> {
        self.raw(method, path, query, &[], None).await.map(|_| ())
    }

    /// `POST path` with `body` as it is, as JSON when it reads as JSON and
    /// else as text (no credential is needed by the calls this is for, but
    /// one is sent when given), read as `T`.
    pub async fn post_bytes<T: DeserializeOwned>(&self, path: &str, headers: &[(&str, String)], body: Vec<u8>) -> anyhow::Result<T> {
        let json = serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok();
        let kind = if json { "application/json" } else { "text/plain; charset=utf-8" };
        let text = self.raw(Method::POST, path, &[], headers, Some((body, kind))).await?;
        serde_json::from_str(&text).with_context(|| format!("the server's answer is not what this client expects: {text}"))
    }

    async fn raw(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        headers: &[(&str, String)],
        body: Option<(Vec<u8>, &str)>,
    ) -> anyhow::Result<String> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url).query(query);
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some((bytes, content_type)) = body {
            req = req.header(reqwest::header::CONTENT_TYPE, content_type).body(bytes);
        }
        let resp = req.send().await.map_err(|e| anyhow!("cannot reach gnomon at {}: {e}", self.base))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if status.is_success() {
            return Ok(text);
        }
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(e) => Err(anyhow!("{} ({}): {}", e.error.code, status.as_u16(), e.error.message)),
            Err(_) => Err(anyhow!("HTTP {}: {}", status.as_u16(), text.trim())),
        }
    }
}
