//! Who may do what: bearer credentials with roles, and the safe-listen rule.
//!
//! A credential is a secret token (only its SHA-256 is kept), a name (for
//! audit lines and errors), a [`Role`], and optionally the namespaces it is
//! limited to and, for a worker, the prefix its worker ids must carry.
//! Credentials come from `--token`/`--token-file` (one admin credential)
//! and from `--auth-file` (see `auth/file.rs`); both files are re-read when they
//! change, so rotating a token needs no restart. With no credential at all
//! (a loopback `gnomon dev`), every caller is the anonymous admin.

pub mod file;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Shortest token accepted from `--token`, `--token-file` or `gnomon auth new`.
pub const MIN_TOKEN_BYTES: usize = 16;

/// What a credential may do. `Viewer` < `Operator` < `Admin` on the API;
/// `Worker` may only open worker sessions, `Member` may only speak for a
/// member of a raft cluster. No role covers another kind's: an admin
/// cannot open a worker session or call a raft member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
    Admin,
    Worker,
    Member,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
            Role::Worker => "worker",
            Role::Member => "member",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            "worker" => Some(Role::Worker),
            "member" => Some(Role::Member),
            _ => None,
        }
    }

    /// Whether this role covers `need`: the client roles rank among
    /// themselves; `worker` and `member` cover only themselves.
    pub fn covers(self, need: Role) -> bool {
        let rank = |r: Role| match r {
            Role::Viewer => Some(1),
            Role::Operator => Some(2),
            Role::Admin => Some(3),
            Role::Worker | Role::Member => None,
        };
        match (rank(self), rank(need)) {
            (Some(have), Some(need)) => have >= need,
            _ => self == need,
        }
    }

    /// A client role (viewer, operator, admin): one that may call the API.
    pub fn is_client(self) -> bool {
        matches!(self, Role::Viewer | Role::Operator | Role::Admin)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Principal {
    pub name: Arc<str>,
    pub role: Role,
    /// The namespaces it may see and touch; `None`: all.
    pub namespaces: Option<Arc<[String]>>,
    /// For a worker: the prefix its worker ids must start with.
    pub worker_prefix: Option<Arc<str>>,
}

impl Principal {
    /// The caller of a server with no credentials configured.
    pub fn anonymous() -> Self {
        Self { name: Arc::from("anonymous"), role: Role::Admin, namespaces: None, worker_prefix: None }
    }

    /// Whether it may see and touch `namespace`.
    pub fn sees(&self, namespace: &str) -> bool {
        self.namespaces.as_ref().is_none_or(|n| n.iter().any(|x| x == namespace))
    }
}

/// Why a request was not authenticated (401) or not allowed (403).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization` header.
    Missing,
    /// A header that is not `Bearer <token>`.
    Malformed,
    /// A token this server does not know.
    Unknown,
    /// A known credential without the role the call needs.
    Role { name: String, have: Role, need: Role, what: String },
    /// A known credential outside its namespaces.
    Namespace { name: String, namespace: String, allowed: Vec<String> },
    /// A worker credential used for a worker id outside its prefix.
    WorkerId { name: String, worker: String, prefix: String },
    /// A namespace-limited credential for a call that needs an unlimited one.
    Unrestricted { name: String, what: String },
}

impl Denied {
    /// 401 (who are you?) or 403 (you may not).
    pub fn is_unauthenticated(&self) -> bool {
        matches!(self, Denied::Missing | Denied::Malformed | Denied::Unknown)
    }

    pub fn code(&self) -> &'static str {
        if self.is_unauthenticated() {
            "unauthenticated"
        } else {
            "forbidden"
        }
    }
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denied::Missing => f.write_str("this server requires a bearer token: send `Authorization: Bearer <token>`"),
            Denied::Malformed => f.write_str("the Authorization header must be `Bearer <token>`"),
            Denied::Unknown => f.write_str("the bearer token is not one this server knows (wrong, revoked or rotated)"),
            Denied::Role { name, have, need, what } => {
                write!(f, "credential {name:?} has the {have} role; {what} needs the {need} role")
            }
            Denied::Namespace { name, namespace, allowed } => {
                write!(f, "credential {name:?} may not use namespace {namespace:?} (it is limited to {})", allowed.join(", "))
            }
            Denied::WorkerId { name, worker, prefix } => {
                write!(f, "credential {name:?} may only open sessions for worker ids starting with {prefix:?}, not {worker:?}")
            }
            Denied::Unrestricted { name, what } => {
                write!(f, "credential {name:?} is limited to namespaces; {what} needs an admin credential that is not")
            }
        }
    }
}

/// What a shared admin secret (`--token`, `--token-file`) also stands for:
/// each server holding it derives the same narrower credentials from it,
/// so the embedded workers and the raft members of a cluster that shares
/// one token can reach each other without ever presenting the admin token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Derived {
    /// A worker credential (`embedded-worker`): opens worker sessions only.
    Worker,
    /// A member credential (`member`): speaks for a raft member only.
    Member,
}

impl Derived {
    fn purpose(self) -> &'static [u8] {
        match self {
            Derived::Worker => b"gnomon embedded worker credential v1",
            Derived::Member => b"gnomon raft member credential v1",
        }
    }

    /// The credential this kind derives from `secret` (HMAC-SHA256, hex):
    /// knowing it tells nothing of the admin token.
    pub fn token(self, secret: &str) -> String {
        use hmac::Mac;
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
        mac.update(self.purpose());
        hex::encode(mac.finalize().into_bytes())
    }

    fn principal(self) -> Principal {
        let (name, role) = match self {
            Derived::Worker => ("embedded-worker", Role::Worker),
            Derived::Member => ("member", Role::Member),
        };
        Principal { name: Arc::from(name), role, namespaces: None, worker_prefix: None }
    }
}

/// A token's SHA-256, as kept in memory and in the auth file.
pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Compares a presented token with a configured one in constant time.
pub fn token_matches(given: &str, expected: &str) -> bool {
    given.as_bytes().ct_eq(expected.as_bytes()).into()
}

/// The token of an `Authorization` value: the scheme is case-insensitive
/// (RFC 7235), surrounding spaces are ignored.
pub fn bearer(value: Option<&str>) -> Result<&str, Denied> {
    let value = value.ok_or(Denied::Missing)?.trim();
    let (scheme, token) = value.split_once(' ').ok_or(Denied::Malformed)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(Denied::Malformed);
    }
    Ok(token)
}

/// A token given on the command line or in a file: long enough to resist
/// guessing.
pub fn check_token_strength(what: &str, token: &str) -> Result<(), String> {
    if token.len() < MIN_TOKEN_BYTES {
        return Err(format!(
            "{what} is {} bytes; use at least {MIN_TOKEN_BYTES} (for example the output of `gnomon auth new`)",
            token.len()
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{what} contains whitespace or control characters"));
    }
    Ok(())
}

/// Where credentials come from.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// `--token`: one admin credential named `token`.
    pub token: Option<String>,
    /// `--token-file`: one admin credential named `token-file`, re-read on change.
    pub token_file: Option<PathBuf>,
    /// `--auth-file`: named credentials, re-read on change.
    pub auth_file: Option<PathBuf>,
    /// Credentials made in process (an embedded worker's own).
    pub extra: Vec<(String, Principal)>,
}

#[derive(Default)]
struct CredentialSet {
    by_hash: HashMap<[u8; 32], Principal>,
}

/// The credentials in force; cheap to clone, swapped whole on reload.
#[derive(Clone)]
pub struct Authenticator {
    config: Arc<AuthConfig>,
    set: Arc<RwLock<Arc<CredentialSet>>>,
    /// False when no credential is configured: everyone is the anonymous admin.
    enabled: bool,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator").field("enabled", &self.enabled).finish()
    }
}

impl Authenticator {
    /// No credentials: every caller is the anonymous admin.
    pub fn open() -> Self {
        Self { config: Arc::new(AuthConfig::default()), set: Default::default(), enabled: false }
    }

    /// Loads every source; any error (unreadable file, bad entry, weak
    /// token) is returned for start-up to report.
    pub fn load(config: AuthConfig) -> Result<Self, String> {
        let enabled = config.token.is_some() || config.token_file.is_some() || config.auth_file.is_some();
        let set = build(&config)?;
        Ok(Self { config: Arc::new(config), set: Arc::new(RwLock::new(Arc::new(set))), enabled })
    }

    /// A single admin token (`--token`), as tests and simple setups use.
    pub fn with_token(token: Option<&str>) -> Self {
        match token.filter(|t| !t.is_empty()) {
            None => Self::open(),
            Some(t) => {
                let config = AuthConfig { token: Some(t.to_string()), ..Default::default() };
                let set = build(&config).unwrap_or_else(|_| {
                    // A short test token: the admin credential alone.
                    let mut set = CredentialSet::default();
                    set.by_hash.insert(token_hash(t), admin("token"));
                    for d in [Derived::Worker, Derived::Member] {
                        set.by_hash.insert(token_hash(&d.token(t)), d.principal());
                    }
                    set
                });
                Self { config: Arc::new(config), set: Arc::new(RwLock::new(Arc::new(set))), enabled: true }
            }
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// How many credentials are in force.
    pub fn len(&self) -> usize {
        self.current().by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn current(&self) -> Arc<CredentialSet> {
        self.set.read().map(|s| s.clone()).unwrap_or_default()
    }

    /// The caller behind an `Authorization` header value.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, Denied> {
        if !self.enabled {
            return Ok(Principal::anonymous());
        }
        let token = bearer(authorization)?;
        self.current().by_hash.get(&token_hash(token)).cloned().ok_or(Denied::Unknown)
    }

    /// The caller of a protocol that only `kind` may speak (worker
    /// sessions, raft calls): with no credential configured, the anonymous
    /// caller of that kind.
    pub fn authenticate_as(&self, authorization: Option<&str>, kind: Role) -> Result<Principal, Denied> {
        if !self.enabled {
            return Ok(Principal { role: kind, ..Principal::anonymous() });
        }
        self.authenticate(authorization)
    }

    /// Re-reads the files; on error the credentials in force stay.
    pub fn reload(&self) -> Result<usize, String> {
        let set = build(&self.config)?;
        let n = set.by_hash.len();
        if let Ok(mut cur) = self.set.write() {
            *cur = Arc::new(set);
        }
        Ok(n)
    }

    /// Re-reads the token and auth files whenever their size or
    /// modification time changes (checked every `every`).
    pub fn spawn_reloader(&self, every: std::time::Duration) -> Option<tokio::task::JoinHandle<()>> {
        let files: Vec<PathBuf> = self.config.token_file.iter().chain(self.config.auth_file.iter()).cloned().collect();
        if files.is_empty() {
            return None;
        }
        let me = self.clone();
        Some(tokio::spawn(async move {
            let stamp = |files: &[PathBuf]| -> Vec<_> { files.iter().map(|p| file_stamp(p)).collect() };
            let mut last = stamp(&files);
            loop {
                tokio::time::sleep(every).await;
                let now = stamp(&files);
                if now == last {
                    continue;
                }
                last = now;
                match me.reload() {
                    Ok(n) => tracing::info!(credentials = n, "credentials reloaded"),
                    Err(e) => tracing::error!(error = %e, "credentials not reloaded; the previous ones stay in force"),
                }
            }
        }))
    }
}

/// What tells that a file changed: its modification time and length
/// (`None` while it cannot be read). Used by the reloaders.
pub(crate) fn file_stamp(path: &std::path::Path) -> Option<(std::time::SystemTime, u64)> {
    std::fs::metadata(path).ok().and_then(|m| Some((m.modified().ok()?, m.len())))
}

fn admin(name: &str) -> Principal {
    Principal { name: Arc::from(name), role: Role::Admin, namespaces: None, worker_prefix: None }
}

fn build(config: &AuthConfig) -> Result<CredentialSet, String> {
    let mut set = CredentialSet::default();
    let mut add = |hash: [u8; 32], p: Principal| -> Result<(), String> {
        if let Some(other) = set.by_hash.get(&hash) {
            return Err(format!("credentials {:?} and {:?} have the same token", other.name, p.name));
        }
        set.by_hash.insert(hash, p);
        Ok(())
    };
    let shared = |t: &str, name: &str, add: &mut dyn FnMut([u8; 32], Principal) -> Result<(), String>| -> Result<(), String> {
        add(token_hash(t), admin(name))?;
        for d in [Derived::Worker, Derived::Member] {
            add(token_hash(&d.token(t)), d.principal())?;
        }
        Ok(())
    };
    if let Some(t) = config.token.as_deref() {
        if t.is_empty() {
            return Err("--token (GNOMON_TOKEN) is empty; give a token of at least 16 bytes, or leave it unset".into());
        }
        check_token_strength("--token", t)?;
        shared(t, "token", &mut add)?;
    }
    if let Some(path) = &config.token_file {
        let t = std::fs::read_to_string(path).map_err(|e| format!("--token-file {}: {e}", path.display()))?;
        let t = t.trim();
        check_token_strength(&format!("the token in {}", path.display()), t)?;
        shared(t, "token-file", &mut add)?;
    }
    if let Some(path) = &config.auth_file {
        for (hash, p) in file::read(path)? {
            add(hash, p)?;
        }
    }
    for (token, p) in &config.extra {
        add(token_hash(token), p.clone())?;
    }
    Ok(set)
}

/// A scheduler that runs shell commands is remote code execution for anyone
/// who can reach it: a non-loopback listener needs credentials and TLS (so
/// the credentials do not cross the network in clear), or `--insecure`.
pub fn check_listen(addr: &SocketAddr, authenticated: bool, tls: bool, insecure: bool) -> Result<(), String> {
    if addr.ip().is_loopback() || insecure || (authenticated && tls) {
        return Ok(());
    }
    let missing = match (authenticated, tls) {
        (false, false) => "no credentials are configured and TLS is off",
        (false, true) => "no credentials are configured",
        _ => "TLS is off (the bearer tokens would cross the network in clear)",
    };
    Err(format!(
        "refusing to listen on {addr}: it is not a loopback address and {missing}. \
         Set --token (or GNOMON_TOKEN), --token-file or --auth-file, and --tls-cert/--tls-key; \
         or pass --insecure if the network is trusted"
    ))
}

/// A fresh random token: 32 bytes, hex.
pub fn new_token() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_rule() {
        let lo: SocketAddr = "127.0.0.1:7400".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7400".parse().unwrap();
        assert!(check_listen(&lo, false, false, false).is_ok());
        assert!(check_listen(&any, false, false, false).is_err());
        assert!(check_listen(&any, true, false, false).unwrap_err().contains("TLS is off"));
        assert!(check_listen(&any, false, true, false).unwrap_err().contains("no credentials"));
        assert!(check_listen(&any, true, true, false).is_ok());
        assert!(check_listen(&any, false, false, true).is_ok());
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("abd", "abc"));
        assert!(!token_matches("ab", "abc"));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer(Some("Bearer abc")), Ok("abc"));
        assert_eq!(bearer(Some("bearer abc")), Ok("abc"));
        assert_eq!(bearer(Some("BEARER  abc ")), Ok("abc"));
        assert_eq!(bearer(None), Err(Denied::Missing));
        assert_eq!(bearer(Some("Basic abc")), Err(Denied::Malformed));
        assert_eq!(bearer(Some("Bearer")), Err(Denied::Malformed));
        assert_eq!(bearer(Some("Bearer ")), Err(Denied::Malformed));
    }

    #[test]
    fn roles_cover_what_they_should() {
        use Role::*;
        assert!(Admin.covers(Viewer) && Admin.covers(Operator) && Admin.covers(Admin));
        assert!(!Admin.covers(Worker) && !Admin.covers(Member), "an admin is neither a worker nor a raft member");
        assert!(Operator.covers(Viewer) && Operator.covers(Operator) && !Operator.covers(Admin) && !Operator.covers(Worker));
        assert!(Viewer.covers(Viewer) && !Viewer.covers(Operator) && !Viewer.covers(Worker));
        assert!(Worker.covers(Worker) && !Worker.covers(Viewer) && !Worker.covers(Admin) && !Worker.covers(Member));
        assert!(Member.covers(Member) && !Member.covers(Viewer) && !Member.covers(Admin) && !Member.covers(Worker));
    }

    #[test]
    fn short_tokens_are_refused() {
        assert!(Authenticator::load(AuthConfig { token: Some("x".into()), ..Default::default() }).is_err());
        assert!(check_token_strength("t", "0123456789abcdef").is_ok());
        assert!(check_token_strength("t", "0123456789abcde f").is_err());
        let a = Authenticator::load(AuthConfig { token: Some("0123456789abcdef".into()), ..Default::default() }).unwrap();
        assert_eq!(a.authenticate(Some("bearer 0123456789abcdef")).unwrap().role, Role::Admin);
        assert_eq!(a.authenticate(Some("Bearer 0123456789abcdeX")).unwrap_err(), Denied::Unknown);
        assert_eq!(a.authenticate(None).unwrap_err(), Denied::Missing);
        assert!(Authenticator::open().authenticate(None).is_ok());
        let empty = Authenticator::load(AuthConfig { token: Some(String::new()), ..Default::default() }).unwrap_err();
        assert!(empty.contains("empty"), "an empty token is an error, not authentication off: {empty}");
    }

    #[test]
    fn a_shared_token_derives_a_worker_and_a_member_credential_and_nothing_more() {
        let t = "0123456789abcdef0123";
        let a = Authenticator::load(AuthConfig { token: Some(t.into()), ..Default::default() }).unwrap();
        let w = a.authenticate(Some(&format!("Bearer {}", Derived::Worker.token(t)))).unwrap();
        assert_eq!((w.role, &*w.name), (Role::Worker, "embedded-worker"));
        let m = a.authenticate(Some(&format!("Bearer {}", Derived::Member.token(t)))).unwrap();
        assert_eq!(m.role, Role::Member);
        assert_ne!(Derived::Worker.token(t), Derived::Member.token(t));
        assert_ne!(Derived::Worker.token(t), Derived::Worker.token("another-token-0123"));
        assert!(!Derived::Worker.token(t).contains(t));
    }
}
