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
//! The worker and raft protocols (gRPC) get a guard of their own: HTTP/2
//! and `Content-Type: application/grpc…` only (a page on plain `http://`
//! speaks HTTP/1.1, and cannot send that type without a preflight), no
//! cross-site markers, and, when no credential is configured, the same
//! Host check (a DNS-rebinding page would reach them same-origin). With
//! credentials the Host check is off for them: workers dial servers under
//! names no one lists, and a page cannot present a credential it does not
//! have. `--allowed-hosts '*'` without credentials is refused at start.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::error::ApiError;

/// The host names a request may be addressed to.
#[derive(Debug, Clone, Default)]
pub struct HostPolicy {
    names: Vec<String>,
    any: bool,
    /// Whether credentials are configured (the worker and raft protocols
    /// then skip the Host check).
    credentials: bool,
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

    /// Says whether credentials are configured; refuses `*` without them
    /// (any page could then use the server through DNS rebinding).
    pub fn with_credentials(mut self, credentials: bool) -> Result<Self, String> {
        if self.any && !credentials {
            return Err("--allowed-hosts '*' needs credentials (--token, --token-file or --auth-file): without them any web \
                        page could use this server through DNS rebinding; list the host names clients use instead"
                .to_string());
        }
        self.credentials = credentials;
        Ok(self)
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

/// The middleware: runs before authentication, on every route.
pub async fn guard(State(policy): State<Arc<HostPolicy>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if path.starts_with("/gnomon.worker.v1.Worker/") || path.starts_with("/gnomon.raft.v1.Raft/") {
        return match check_rpc(&policy, &request) {
            Ok(()) => next.run(request).await,
            Err(Refusal::Http(status, code, message)) => refuse(&request, status, code, message),
            Err(Refusal::Grpc(code, message)) => {
                tracing::warn!(target: "gnomon::audit", path = %request.uri().path(), code = "host_not_allowed", "refused: {message}");
                grpc_status(code, &message)
            }
        };
    }
    // A webhook call carries no credential a browser could add on its own
    // (its signature is its authority), so the checks against forged
    // browser requests do not apply; senders post any content type. The
    // host check does.
    let checked = if path.starts_with("/v1/hooks/") { check_host(&policy, &request) } else { check(&policy, &request) };
    match checked {
        Ok(()) => next.run(request).await,
        Err((status, code, message)) => refuse(&request, status, code, message),
    }
}

/// Why a worker or raft protocol request is refused: a plain HTTP answer
/// for what is not gRPC at all, a gRPC status for a gRPC client.
enum Refusal {
    Http(StatusCode, &'static str, String),
    Grpc(i32, String),
}

/// gRPC's PERMISSION_DENIED.
const GRPC_PERMISSION_DENIED: i32 = 7;

fn check_rpc(policy: &HostPolicy, request: &Request) -> Result<(), Refusal> {
    let headers = request.headers();
    let content_type = headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or(""));
    let grpc = content_type.is_some_and(|ct| ct.get(..16).is_some_and(|p| p.eq_ignore_ascii_case("application/grpc")));
    if !grpc {
        return Err(Refusal::Http(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("this is a gRPC endpoint: Content-Type must be application/grpc (got {})", content_type.unwrap_or("none")),
        ));
    }
    if request.version() != Version::HTTP_2 {
        return Err(Refusal::Http(
            StatusCode::BAD_REQUEST,
            "http2_required",
            format!("this is a gRPC endpoint: it speaks HTTP/2 only (got {:?})", request.version()),
        ));
    }
    if headers.contains_key(header::ORIGIN) || headers.get("sec-fetch-site").is_some_and(|v| v.as_bytes() != b"none") {
        return Err(Refusal::Grpc(GRPC_PERMISSION_DENIED, "requests from web pages are refused on this endpoint".to_string()));
    }
    if !policy.credentials {
        check_host(policy, request).map_err(|(_, _, message)| Refusal::Grpc(GRPC_PERMISSION_DENIED, message))?;
    }
    Ok(())
}

/// A trailers-only gRPC answer with `code` and `message`.
fn grpc_status(code: i32, message: &str) -> Response {
    let printable: String = message.chars().map(|c| if (' '..='~').contains(&c) && c != '%' { c } else { '?' }).collect();
    let mut response = Response::new(axum::body::Body::empty());
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from(code));
    if let Ok(v) = HeaderValue::from_str(&printable) {
        h.insert("grpc-message", v);
    }
    response
}

type Refused = (StatusCode, &'static str, String);

/// The request's host (the `Host` header, or the HTTP/2 authority).
fn request_host(request: &Request) -> Option<String> {
    request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()))
}

fn check_host(policy: &HostPolicy, request: &Request) -> Result<(), Refused> {
    if let Some(host) = request_host(request) {
        if !policy.allows(&host) {
            let name = host_name(&host);
            return Err((
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                format!("requests addressed to {name:?} are refused (a defence against DNS rebinding); start the server with --allowed-hosts {name} to accept that name"),
            ));
        }
    }
    Ok(())
}

fn check(policy: &HostPolicy, request: &Request) -> Result<(), Refused> {
    let headers = request.headers();
    let host = request_host(request);
    check_host(policy, request)?;
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

    #[test]
    fn any_host_needs_credentials() {
        assert!(HostPolicy::new(["*".to_string()]).unwrap().with_credentials(false).unwrap_err().contains("needs credentials"));
        assert!(HostPolicy::new(["*".to_string()]).unwrap().with_credentials(true).is_ok());
        assert!(HostPolicy::new(["a.example".to_string()]).unwrap().with_credentials(false).is_ok());
    }

    fn rpc(version: Version, host: &str, content_type: &str) -> Request {
        let mut r = Request::builder()
            .method(Method::POST)
            .uri("/gnomon.worker.v1.Worker/Session")
            .version(version)
            .header(header::HOST, host)
            .body(axum::body::Body::empty())
            .unwrap();
        if !content_type.is_empty() {
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_str(content_type).unwrap());
        }
        r
    }

    #[test]
    fn the_worker_protocol_is_grpc_over_http2_and_checks_the_host_without_credentials() {
        let open = HostPolicy::new(Vec::<String>::new()).unwrap().with_credentials(false).unwrap();
        let closed = HostPolicy::new(Vec::<String>::new()).unwrap().with_credentials(true).unwrap();
        let http = |p: &HostPolicy, r: &Request| match check_rpc(p, r) {
            Err(Refusal::Http(s, _, _)) => Some(s),
            _ => None,
        };
        for p in [&open, &closed] {
            assert!(check_rpc(p, &rpc(Version::HTTP_2, "127.0.0.1:7400", "application/grpc")).is_ok());
            assert!(check_rpc(p, &rpc(Version::HTTP_2, "127.0.0.1:7400", "application/grpc+proto")).is_ok());
            assert_eq!(http(p, &rpc(Version::HTTP_11, "127.0.0.1:7400", "text/plain")), Some(StatusCode::UNSUPPORTED_MEDIA_TYPE));
            assert_eq!(http(p, &rpc(Version::HTTP_2, "127.0.0.1:7400", "")), Some(StatusCode::UNSUPPORTED_MEDIA_TYPE));
            assert_eq!(http(p, &rpc(Version::HTTP_11, "127.0.0.1:7400", "application/grpc")), Some(StatusCode::BAD_REQUEST));
            let mut from_page = rpc(Version::HTTP_2, "127.0.0.1:7400", "application/grpc");
            from_page.headers_mut().insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
            assert!(matches!(check_rpc(p, &from_page), Err(Refusal::Grpc(GRPC_PERMISSION_DENIED, _))));
        }
        let foreign = rpc(Version::HTTP_2, "rebind.example:7400", "application/grpc");
        assert!(matches!(check_rpc(&open, &foreign), Err(Refusal::Grpc(GRPC_PERMISSION_DENIED, m)) if m.contains("rebind.example")));
        assert!(check_rpc(&closed, &foreign).is_ok());
    }
}
