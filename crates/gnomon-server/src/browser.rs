//! Browser safety: what stops a web page the operator happens to visit from
//! using a gnomon it can reach (a `gnomon dev` on loopback has no token).
//!
//! - **Host** must be an IP address, `localhost` (or `*.localhost`), the
//!   host of `--advertise`, or a name given in `--allowed-hosts` (`*`
//!   allows any). A DNS-rebinding page reaches the server under its own
//!   name, so it is refused before it can read an answer.
//! - **Cross-site requests** are refused: a `Sec-Fetch-Site` other than
//!   `same-origin` or `none`, or an `Origin` that is not this server's own.
//! - **Writes** (any method but GET, HEAD and OPTIONS) with a body must be
//!   `Content-Type: application/json`, which a page can only send after a
//!   CORS preflight that gnomon never approves; a form post or a `no-cors`
//!   fetch sends `text/plain`, `multipart/form-data` or a URL-encoded form.
//!
//! The worker protocol (gRPC) is exempt: a browser cannot send its content
//! type without a preflight either, and workers often reach servers under
//! names no one lists.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::ApiError;

/// The host names a request may be addressed to.
#[derive(Debug, Clone, Default)]
pub struct HostPolicy {
    names: Vec<String>,
    any: bool,
}

impl HostPolicy {
    /// `allowed`: `--allowed-hosts` (names, `*` for any) plus the host of
    /// `--advertise`; IP addresses and `localhost` are always allowed.
    pub fn new<I: IntoIterator<Item = String>>(allowed: I) -> Result<Self, String> {
        let mut p = HostPolicy::default();
        for name in allowed {
            let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
            if name == "*" {
                p.any = true;
            } else if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')) {
                return Err(format!("--allowed-hosts: {name:?} is not a host name"));
            } else if !p.names.contains(&name) {
                p.names.push(name);
            }
        }
        Ok(p)
    }

    /// Whether a `Host` value (`name`, `name:port`, `[v6]:port`) is allowed.
    pub fn allows(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let name = host_name(host).to_ascii_lowercase();
        let name = name.trim_end_matches('.');
        if name.parse::<IpAddr>().is_ok() || name == "localhost" || name.ends_with(".localhost") {
            return true;
        }
        self.names.iter().any(|n| n == name)
    }
}

/// The host part of a `Host` value, without its port or IPv6 brackets.
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    }
}

/// The host of an address like `host:port` (for `--advertise`).
pub fn advertised_host(addr: &str) -> Option<String> {
    let h = host_name(addr.trim_start_matches("http://").trim_start_matches("https://").split('/').next().unwrap_or(""));
    (!h.is_empty() && h.parse::<IpAddr>().is_err()).then(|| h.to_string())
}

/// A request refused: logged (audit target) and answered with its code.
fn refuse(request: &Request, status: StatusCode, code: &'static str, message: String) -> Response {
    tracing::warn!(target: "gnomon::audit", method = %request.method(), path = %request.uri().path(), code, "refused: {message}");
    ApiError::new(status, code, message).into_response()
}

/// The middleware: runs before authentication, on every route but the
/// worker protocol's.
pub async fn guard(State(policy): State<Arc<HostPolicy>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if path.starts_with("/gnomon.worker.v1.Worker/") || path.starts_with("/gnomon.raft.v1.Raft/") {
        return next.run(request).await;
    }
    match check(&policy, &request) {
        Ok(()) => next.run(request).await,
        Err((status, code, message)) => refuse(&request, status, code, message),
    }
}

fn check(policy: &HostPolicy, request: &Request) -> Result<(), (StatusCode, &'static str, String)> {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    if let Some(host) = &host {
        if !policy.allows(host) {
            let name = host_name(host);
            return Err((
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                format!("requests addressed to {name:?} are refused (a defence against DNS rebinding); start the server with --allowed-hosts {name} to accept that name"),
            ));
        }
    }
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if !matches!(site, "same-origin" | "none") {
            return Err((StatusCode::FORBIDDEN, "cross_site_request", format!("cross-site requests are refused (Sec-Fetch-Site: {site})")));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("null");
        let origin_host = origin.split_once("://").map(|(_, rest)| rest.trim_end_matches('/'));
        let same = match (origin_host, &host) {
            (Some(o), Some(h)) => o.eq_ignore_ascii_case(h),
            _ => false,
        };
        if !same {
            return Err((
                StatusCode::FORBIDDEN,
                "cross_site_request",
                format!("requests from another origin are refused (Origin: {origin})"),
            ));
        }
    }
    if !matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        let content_type = headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or(""));
        let has_body =
            headers.get(header::CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0") || headers.contains_key(header::TRANSFER_ENCODING);
        let json = content_type.is_some_and(|ct| ct.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/json"));
        if (has_body || content_type.is_some()) && !json {
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("writes must be sent as Content-Type: application/json (got {})", content_type.unwrap_or("none")),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        let p = HostPolicy::new(["sched.example.com".to_string()]).unwrap();
        for ok in [
            "127.0.0.1:7400",
            "127.0.0.1",
            "[::1]:7400",
            "localhost:7400",
            "LOCALHOST",
            "app.localhost:1",
            "10.0.0.5:7400",
            "sched.example.com:7400",
            "Sched.Example.com.",
        ] {
            assert!(p.allows(ok), "{ok}");
        }
        for bad in ["evil.example:7400", "example.com", "127.0.0.1.nip.io:7400", "localhost.evil.example", ""] {
            assert!(!p.allows(bad), "{bad}");
        }
        assert!(HostPolicy::new(["*".to_string()]).unwrap().allows("anything:1"));
        assert!(HostPolicy::new(["a b".to_string()]).is_err());
        assert_eq!(advertised_host("sched.internal:7400").as_deref(), Some("sched.internal"));
        assert_eq!(advertised_host("10.1.2.3:7400"), None);
    }
}
