//! The server side of the worker protocol: the gRPC `Session` service,
//! served on the same listener as the REST API.
//!
//! The service only validates the `Hello` and relays: a follower answers
//! `NotLeader` with the leader's advertised address; on the leader, the
//! session is handed to the leader actor ([`crate::leader`]), which owns all
//! session state (leases, attempts, routing) and answers `Welcome` or refuses.
//! Worker messages are forwarded to the actor in order; when the stream ends
//! the actor is told, and the session's lease keeps running until the worker
//! reconnects or it expires.
//!
//! # Worker ids belong to credentials
//! The first credential to open a session with a worker id owns it, as the
//! store records it ([`gnomon_backend::WorkerStore`]): every server, after a
//! restart or a failover too, refuses that id to any other credential
//! (`permission_denied`, audited) before anything else happens — no
//! session, no attempt reclaimed. An admin releases an id
//! (`DELETE /v1/workers/{id}/binding`, `gnomon worker forget`). A server
//! keeps the bindings it confirmed for a lease ([`WorkerService::owners`]),
//! so a reconnect asks nothing of the store; a binding it has not confirmed
//! lately is asked of the store (a read where the id is bound, a write where
//! it is new), and a store that does not answer refuses the session as
//! `unavailable` (the worker retries).
//!
//! A server with no credentials binds nothing: every worker is the same
//! anonymous caller, so there is nothing to tell apart, and binding ids to
//! `anonymous` would lock every existing worker out the day credentials
//! are turned on. Then the first credential to open a session with an id
//! binds it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gnomon_proto::v1::{self, server_message, worker_message, worker_server};
use gnomon_proto::PROTOCOL_VERSION;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};

use crate::leader::LeaderCommand;
use crate::node::NodeHandle;

/// Longest accepted worker id.
pub const MAX_WORKER_ID_LEN: usize = 128;

pub use crate::outbound::{bounded_stream, Outbound, SessionStream, MAX_QUEUED};

#[derive(Clone)]
pub struct WorkerService {
    pub node: NodeHandle,
    pub auth: crate::auth::Authenticator,
    /// The worker bindings this server confirmed in the store, and when: a
    /// cache (the store is the record), trusted for a lease, shared with
    /// the API that releases ids.
    pub owners: Arc<Mutex<Owners>>,
}

/// Worker id -> (the credential the store bound it to, when the store said so).
pub type Owners = HashMap<String, (Arc<str>, Instant)>;

impl WorkerService {
    pub fn new(node: NodeHandle, auth: crate::auth::Authenticator, owners: Arc<Mutex<Owners>>) -> Self {
        Self { node, auth, owners }
    }

    /// How long a confirmed binding is trusted without asking the store: an
    /// id released on another server reaches this one within it.
    fn lease(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.node.config.leader.lease_ttl_ms).unwrap_or(10_000))
    }

    fn cached(&self) -> std::sync::MutexGuard<'_, Owners> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets `p` use `worker` if the id is its credential's, or no
    /// credential's yet (then it becomes its credential's, in the store).
    /// Another credential's id is refused, and nothing else happens.
    async fn claim(&self, worker: &str, p: &crate::auth::Principal) -> Result<(), Status> {
        if !self.auth.enabled() {
            // No credentials: nothing to tell apart (see the module docs).
            return Ok(());
        }
        let lease = self.lease();
        let credential = &p.name;
        if self.cached().get(worker).is_some_and(|(owner, at)| owner == credential && at.elapsed() < lease) {
            return Ok(());
        }
        let now = self.node.clock.now_millis();
        let owner = self.node.store.bind_worker(worker, credential, now).await.map_err(|e| {
            Status::unavailable(format!("the store could not tell which credential worker id {worker:?} belongs to ({e}); retry"))
        })?;
        let mut owners = self.cached();
        if owner != **credential {
            owners.remove(worker);
            return Err(Status::permission_denied(format!(
                "worker id {worker:?} belongs to credential {owner:?}; a worker of credential {credential:?} needs an id of its own \
                 (an admin releases the id with `gnomon worker forget {worker}`)"
            )));
        }
        if owners.len() > 100_000 {
            owners.retain(|_, (_, at)| at.elapsed() < lease);
        }
        owners.insert(worker.to_string(), (credential.clone(), Instant::now()));
        Ok(())
    }
}

/// Checks a session's credential: a worker credential (no other role opens
/// a session), and a worker id under the credential's prefix, if it has one.
#[allow(clippy::result_large_err)] // tonic::Status is what the service returns
pub fn authorize_worker(p: &crate::auth::Principal, worker_id: Option<&str>) -> Result<(), Status> {
    use crate::auth::{Denied, Role};
    if !p.role.covers(Role::Worker) {
        let d = Denied::Role { name: p.name.to_string(), have: p.role, need: Role::Worker, what: "opening a worker session".into() };
        return Err(Status::permission_denied(d.to_string()));
    }
    if let (Some(prefix), Some(worker_id)) = (&p.worker_prefix, worker_id) {
        if !worker_id.starts_with(&**prefix) {
            let d = Denied::WorkerId { name: p.name.to_string(), worker: worker_id.to_string(), prefix: prefix.to_string() };
            return Err(Status::permission_denied(d.to_string()));
        }
    }
    Ok(())
}

/// Whether `id` may be a worker id: 1-[`MAX_WORKER_ID_LEN`] letters,
/// digits, `-`, `_`, `.`, `:`.
pub fn valid_worker_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_WORKER_ID_LEN && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

/// Checks a Hello before any state is touched.
#[allow(clippy::result_large_err)] // tonic::Status is what the service returns
pub fn validate_hello(h: &v1::Hello) -> Result<(), Status> {
    if h.protocol_version != PROTOCOL_VERSION {
        return Err(Status::failed_precondition(format!(
            "worker protocol version {} is not supported; this server speaks version {PROTOCOL_VERSION} (gnomon.worker.v1)",
            h.protocol_version
        )));
    }
    if h.capacity == 0 {
        return Err(Status::invalid_argument("capacity must be at least 1"));
    }
    if h.capacity > gnomon_proto::limits::MAX_CAPACITY {
        return Err(Status::invalid_argument(format!(
            "capacity {} is over the limit of {}",
            h.capacity,
            gnomon_proto::limits::MAX_CAPACITY
        )));
    }
    if h.prefetch > gnomon_proto::limits::MAX_PREFETCH {
        return Err(Status::invalid_argument(format!(
            "prefetch {} is over the limit of {}",
            h.prefetch,
            gnomon_proto::limits::MAX_PREFETCH
        )));
    }
    if !valid_worker_id(&h.worker_id) {
        return Err(Status::invalid_argument(format!(
            "worker id {:?} must be 1-{MAX_WORKER_ID_LEN} characters of letters, digits, '-', '_', '.', ':'",
            h.worker_id
        )));
    }
    if let Some(kind) = h.executors.iter().find(|e| !matches!(e.as_str(), "shell" | "http" | "handler")) {
        return Err(Status::invalid_argument(format!("unknown executor kind {kind:?} (shell, http, handler)")));
    }
    Ok(())
}

#[tonic::async_trait]
impl worker_server::Worker for WorkerService {
    type SessionStream = SessionStream;

    async fn session(&self, request: Request<Streaming<v1::WorkerMessage>>) -> Result<Response<Self::SessionStream>, Status> {
        let peer = crate::listener::ClientAddr::shown(request.extensions().get());
        let mut seen = Seen::default();
        self.open(request, &mut seen).await.inspect_err(|status| {
            tracing::warn!(target: "gnomon::audit", credential = %seen.credential, worker = %seen.worker, %peer,
                "worker session refused: {}", status.message());
        })
    }
}

/// What a session attempt had told before it was refused.
#[derive(Default)]
struct Seen {
    credential: String,
    worker: String,
}

impl WorkerService {
    async fn open(&self, request: Request<Streaming<v1::WorkerMessage>>, seen: &mut Seen) -> Result<Response<SessionStream>, Status> {
        let mutual = request.extensions().get::<crate::listener::MutualTls>().is_some_and(|m| m.0);
        let has_cert = request.extensions().get::<crate::listener::ClientCert>().is_some_and(|c| c.0);
        if mutual && !has_cert {
            return Err(Status::unauthenticated(
                "this server requires workers to present a TLS client certificate signed by its --client-ca",
            ));
        }
        let given = request.metadata().get("authorization").map(|v| v.to_str().unwrap_or(""));
        let principal = self.auth.authenticate_as(given, crate::auth::Role::Worker).map_err(|d| Status::unauthenticated(d.to_string()))?;
        seen.credential = principal.name.to_string();
        // Refuse a non-worker credential before reading anything.
        authorize_worker(&principal, None)?;
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await? {
            Some(v1::WorkerMessage { msg: Some(worker_message::Msg::Hello(h)) }) => h,
            _ => return Err(Status::invalid_argument("the first message of a session must be Hello")),
        };
        seen.worker.clone_from(&hello.worker_id);
        validate_hello(&hello)?;
        authorize_worker(&principal, Some(&hello.worker_id))?;
        let (tx, rx) = mpsc::unbounded_channel();
        // A follower redirects at once, before the store is asked whose the
        // id is: during a failover the store may be slow to answer, and a
        // worker must reach the new leader well within its fence to keep its
        // attempts. The leader binds the id before the session opens.
        let Some(commands) = self.node.leader_commands() else {
            let address = self.node.leader_address().await.unwrap_or_default();
            let _ = tx.send(Ok(v1::ServerMessage { msg: Some(server_message::Msg::NotLeader(v1::NotLeader { leader_address: address })) }));
            return Ok(Response::new(bounded_stream(rx, hello.worker_id.clone())));
        };
        self.claim(&hello.worker_id, &principal).await?;
        tracing::info!(target: "gnomon::audit", credential = %principal.name, worker = %hello.worker_id, namespaces = ?principal.namespaces, "worker session opened");
        let worker = hello.worker_id.clone();
        let (reply_tx, reply_rx) = oneshot::channel();
        commands
            .send(LeaderCommand::SessionOpen {
                hello: Box::new(hello),
                namespaces: principal.namespaces.clone(),
                outbound: tx,
                reply: reply_tx,
            })
            .await
            .map_err(|_| Status::unavailable("leadership changed; reconnect"))?;
        let session = reply_rx.await.map_err(|_| Status::unavailable("leadership changed; reconnect"))??;
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(v1::WorkerMessage { msg: Some(msg) })) => {
                        if commands.send(LeaderCommand::FromWorker { session: session.clone(), msg }).await.is_err() {
                            return;
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
            let _ = commands.send(LeaderCommand::SessionClosed { session }).await;
        });
        Ok(Response::new(bounded_stream(rx, worker)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> v1::Hello {
        v1::Hello {
            worker_id: "w-1".into(),
            capacity: 4,
            executors: vec!["shell".into()],
            protocol_version: PROTOCOL_VERSION,
            ..Default::default()
        }
    }

    #[test]
    fn hello_is_validated() {
        assert!(validate_hello(&hello()).is_ok());
        let e = validate_hello(&v1::Hello { protocol_version: 99, ..hello() }).unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("version 99"));
        assert_eq!(validate_hello(&v1::Hello { capacity: 0, ..hello() }).unwrap_err().code(), tonic::Code::InvalidArgument);
        let e = validate_hello(&v1::Hello { capacity: 100_000, ..hello() }).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("over the limit of 65536"), "{}", e.message());
        assert_eq!(validate_hello(&v1::Hello { prefetch: 1 << 20, ..hello() }).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert!(validate_hello(&v1::Hello { worker_id: "a b".into(), ..hello() }).is_err());
        assert!(validate_hello(&v1::Hello { worker_id: String::new(), ..hello() }).is_err());
        assert!(validate_hello(&v1::Hello { executors: vec!["ftp".into()], ..hello() }).is_err());
    }
}
