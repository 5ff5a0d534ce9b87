//! Who a store write is made for. The API sets the caller it authorized
//! for the time of a request ([`on_behalf`]); a store that sends the write
//! elsewhere (a raft member forwarding it to the leader) sends the caller
//! with it, and the receiver checks it against what the write declares it
//! needs ([`Need`]) and audits it. A write made outside any request (the
//! scheduler's own) has no caller: the member it comes from answers for it.

use serde::{Deserialize, Serialize};

/// The client behind a write, as the API authenticated it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    /// The credential's name.
    pub name: String,
    /// Its role: `viewer`, `operator` or `admin`.
    pub role: String,
    /// The namespaces it is limited to; `None`: all.
    pub namespaces: Option<Vec<String>>,
}

/// What a client write needs of its caller: the same as the API operation
/// that makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub what: &'static str,
    /// The least client role.
    pub role: &'static str,
    /// The namespace written, when the write names one.
    pub namespace: Option<String>,
    /// Whether a namespace-limited caller is refused outright.
    pub unrestricted: bool,
}

/// The client roles, least first.
const RANKS: [&str; 3] = ["viewer", "operator", "admin"];

fn rank(role: &str) -> Option<usize> {
    RANKS.iter().position(|r| *r == role)
}

impl Caller {
    /// Whether this caller may make a write that needs `need`, and why not.
    pub fn may(&self, need: &Need) -> Result<(), String> {
        let covered = matches!((rank(&self.role), rank(need.role)), (Some(have), Some(want)) if have >= want);
        if !covered {
            return Err(format!("credential {:?} has the {} role; {} needs {}", self.name, self.role, need.what, need.role));
        }
        match (&self.namespaces, &need.namespace) {
            (Some(_), _) if need.unrestricted => {
                Err(format!("credential {:?} is limited to namespaces; {} needs an unrestricted {}", self.name, need.what, need.role))
            }
            (Some(allowed), Some(ns)) if !allowed.iter().any(|a| a == ns) => {
                Err(format!("credential {:?} may not touch namespace {ns:?} ({})", self.name, need.what))
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespaces {
            None => write!(f, "{} ({})", self.name, self.role),
            Some(ns) => write!(f, "{} ({}, namespaces {})", self.name, self.role, ns.join(",")),
        }
    }
}

tokio::task_local! {
    static CALLER: Caller;
}

/// Runs `f` (a request's handling) with `caller` as the caller of the store
/// writes it makes.
pub async fn on_behalf<F: std::future::Future>(caller: Caller, f: F) -> F::Output {
    CALLER.scope(caller, f).await
}

/// The caller of the request being handled, if any.
pub fn current() -> Option<Caller> {
    CALLER.try_with(Caller::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(role: &str, namespaces: Option<&[&str]>) -> Caller {
        Caller { name: "c".into(), role: role.into(), namespaces: namespaces.map(|n| n.iter().map(|s| s.to_string()).collect()) }
    }

    fn need(role: &'static str, namespace: Option<&str>, unrestricted: bool) -> Need {
        Need { what: "w", role, namespace: namespace.map(str::to_string), unrestricted }
    }

    #[test]
    fn a_caller_needs_the_role_and_the_namespace() {
        assert!(caller("admin", None).may(&need("admin", Some("b"), false)).is_ok());
        assert!(caller("operator", None).may(&need("admin", Some("b"), false)).is_err());
        assert!(caller("admin", Some(&["a"])).may(&need("admin", Some("a"), false)).is_ok());
        assert!(caller("admin", Some(&["a"])).may(&need("admin", Some("b"), false)).is_err());
        assert!(caller("admin", Some(&["a"])).may(&need("admin", None, true)).is_err());
        assert!(caller("admin", None).may(&need("admin", None, true)).is_ok());
        assert!(caller("worker", None).may(&need("viewer", None, false)).is_err(), "only client roles rank");
        assert!(caller("member", None).may(&need("operator", None, false)).is_err());
    }

    #[tokio::test]
    async fn the_caller_is_known_inside_its_scope_only() {
        assert_eq!(current(), None);
        let c = caller("admin", None);
        let seen = on_behalf(c.clone(), async { current() }).await;
        assert_eq!(seen, Some(c));
        assert_eq!(current(), None);
    }
}
