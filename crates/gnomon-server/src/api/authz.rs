//! Who may call what: every operation declares its policy where it is
//! routed ([`op`]), and nothing else decides it.
//!
//! Two layers take part. [`authenticate`] wraps the whole API: it finds the
//! caller behind the credential (401 if there is none) and leaves it as an
//! [`Authenticated`] extension. Each operation's own layer, added by [`op`]
//! for exactly one method of one route, checks that caller against the
//! operation's [`Policy`] (403 if it falls short) and only then hands the
//! handler its [`Principal`]. A handler reading its caller with
//! `api::caller` therefore fails closed on a route that declared no
//! policy, and an operation without one answers nothing but a refusal
//! (`crates/gnomon/tests/authz_matrix.rs` walks every operation of the
//! published document with every kind of credential).

use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::{header, Method, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};

use super::error::ApiError;
use super::state::ApiState;
use crate::auth::{Denied, Principal, Role};

/// What an operation needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// At least this client role (`viewer` < `operator` < `admin`).
    Role(Role, &'static str),
    /// An admin credential that is not limited to namespaces.
    UnrestrictedAdmin(&'static str),
}

impl Policy {
    pub const fn viewer(what: &'static str) -> Self {
        Policy::Role(Role::Viewer, what)
    }
    pub const fn operator(what: &'static str) -> Self {
        Policy::Role(Role::Operator, what)
    }
    pub const fn admin(what: &'static str) -> Self {
        Policy::Role(Role::Admin, what)
    }

    /// Whether `p` may make the call, and why not.
    pub fn check(self, p: &Principal) -> Result<(), Denied> {
        let (need, what) = match self {
            Policy::Role(need, what) => (need, what),
            Policy::UnrestrictedAdmin(what) => (Role::Admin, what),
        };
        if !p.role.covers(need) {
            return Err(Denied::Role { name: p.name.to_string(), have: p.role, need, what: what.to_string() });
        }
        if matches!(self, Policy::UnrestrictedAdmin(_)) && p.namespaces.is_some() {
            return Err(Denied::Unrestricted { name: p.name.to_string(), what: what.to_string() });
        }
        Ok(())
    }
}

/// The caller [`authenticate`] found; a handler sees it only as the
/// [`Principal`] its operation's policy let through.
#[derive(Debug, Clone)]
pub struct Authenticated(pub Principal);

/// One method of one route, with the policy its caller must meet.
pub fn op<H, T>(method: MethodFilter, policy: Policy, handler: H) -> MethodRouter<ApiState>
where
    H: Handler<T, ApiState>,
    T: 'static,
{
    on(method, handler).route_layer(from_fn_with_state(policy, enforce))
}

pub fn get<H: Handler<T, ApiState>, T: 'static>(policy: Policy, handler: H) -> MethodRouter<ApiState> {
    op(MethodFilter::GET, policy, handler)
}
pub fn post<H: Handler<T, ApiState>, T: 'static>(policy: Policy, handler: H) -> MethodRouter<ApiState> {
    op(MethodFilter::POST, policy, handler)
}
pub fn put<H: Handler<T, ApiState>, T: 'static>(policy: Policy, handler: H) -> MethodRouter<ApiState> {
    op(MethodFilter::PUT, policy, handler)
}
pub fn delete<H: Handler<T, ApiState>, T: 'static>(policy: Policy, handler: H) -> MethodRouter<ApiState> {
    op(MethodFilter::DELETE, policy, handler)
}

fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn full_path(request: &Request) -> String {
    request
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .map(|u| u.0.path().to_string())
        .unwrap_or_else(|| request.uri().path().to_string())
}

pub(super) fn denied(d: &Denied) -> Response {
    let status = if d.is_unauthenticated() { StatusCode::UNAUTHORIZED } else { StatusCode::FORBIDDEN };
    let mut resp = ApiError::new(status, d.code(), d.to_string()).into_response();
    if d.is_unauthenticated() {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
    }
    resp
}

/// Finds the caller (401 without a known credential) and writes an audit
/// line for every write, answered or refused, and for refused reads
/// within a budget (`audit::REFUSED_READS`). Every line names the
/// namespace; the caller's text in it is escaped.
pub async fn authenticate(State(state): State<ApiState>, mut request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let write = is_write(&method);
    let path = super::audit::shown(&full_path(&request));
    let namespace = super::audit::namespace_of(request.uri().query());
    let peer = crate::listener::ClientAddr::shown(request.extensions().get());
    let given = request.headers().get(header::AUTHORIZATION).map(|v| v.to_str().unwrap_or(""));
    let read_refusal_logged = |now: &dyn gnomon_core::Clock| {
        let second = u64::try_from(now.now_millis() / 1000).unwrap_or(0);
        super::audit::REFUSED_READS.take(second)
    };
    let principal = match state.auth.authenticate(given) {
        Ok(p) => p,
        Err(d) => {
            if write {
                tracing::warn!(target: "gnomon::audit", credential = "-", %peer, %method, %namespace, %path, status = 401, "refused: {d}");
            } else if let Some(left_out) = read_refusal_logged(&*state.node.clock) {
                tracing::warn!(target: "gnomon::audit", credential = "-", %peer, %method, %namespace, %path, status = 401, left_out, "read refused: {d}");
            }
            return denied(&d);
        }
    };
    request.extensions_mut().insert(Authenticated(principal.clone()));
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let refused = status == 401 || status == 403;
    if write {
        if refused {
            tracing::warn!(target: "gnomon::audit", credential = %principal.name, role = %principal.role, %peer, %method, %namespace, %path, status, "api write refused");
        } else {
            tracing::info!(target: "gnomon::audit", credential = %principal.name, role = %principal.role, %peer, %method, %namespace, %path, status, "api write");
        }
    } else if refused {
        if let Some(left_out) = read_refusal_logged(&*state.node.clock) {
            tracing::warn!(target: "gnomon::audit", credential = %principal.name, role = %principal.role, %peer, %method, %namespace, %path, status, left_out, "api read refused");
        }
    }
    response
}

/// An operation's own check: the caller [`authenticate`] found must meet
/// `policy`; only then does the handler get its [`Principal`].
async fn enforce(State(policy): State<Policy>, mut request: Request, next: Next) -> Response {
    let Some(Authenticated(p)) = request.extensions().get::<Authenticated>().cloned() else {
        return denied(&Denied::Missing);
    };
    if let Err(d) = policy.check(&p) {
        return denied(&d);
    }
    // The store writes a write operation makes are made for this caller: a
    // store that forwards them (raft) names it to the member that applies
    // them, which checks and audits it. Reads write nothing.
    let caller = is_write(request.method()).then(|| gnomon_backend::caller::Caller {
        name: p.name.to_string(),
        role: p.role.to_string(),
        namespaces: p.namespaces.as_ref().map(|n| n.to_vec()),
    });
    request.extensions_mut().insert(p);
    match caller {
        Some(caller) => gnomon_backend::caller::on_behalf(caller, next.run(request)).await,
        None => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn principal(role: Role, namespaces: Option<&[&str]>) -> Principal {
        Principal {
            name: Arc::from("p"),
            role,
            namespaces: namespaces.map(|n| n.iter().map(|s| s.to_string()).collect::<Vec<_>>().into()),
            worker_prefix: None,
        }
    }

    #[test]
    fn policies_admit_what_they_name() {
        let op = Policy::operator("triggering a job");
        assert!(op.check(&principal(Role::Operator, None)).is_ok());
        assert!(op.check(&principal(Role::Admin, Some(&["a"]))).is_ok());
        assert!(op.check(&principal(Role::Viewer, None)).is_err());
        assert!(op.check(&principal(Role::Worker, None)).is_err());
        assert!(op.check(&principal(Role::Member, None)).is_err());
        let cluster = Policy::UnrestrictedAdmin("changing the cluster's members");
        assert!(cluster.check(&principal(Role::Admin, None)).is_ok());
        let e = cluster.check(&principal(Role::Admin, Some(&["a"]))).unwrap_err();
        assert!(e.to_string().contains("limited to namespaces"), "{e}");
        assert!(cluster.check(&principal(Role::Operator, None)).is_err());
        assert!(Policy::viewer("reading").check(&principal(Role::Worker, None)).is_err());
        assert!(Policy::viewer("reading").check(&principal(Role::Member, None)).is_err());
    }
}
