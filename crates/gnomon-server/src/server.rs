//! A whole server, composed: the node (campaign and the leader loops), the
//! one listener with the API, the worker and raft services, the credentials'
//! reloader and the metrics recorder. [`Server::start`] binds and starts it;
//! the [`Running`] handle it returns stops it in the one order that hands
//! work over cleanly ([`Running::shutdown`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gnomon_backend::{Elector, Store};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{router, ApiState, Forwarder};
use crate::auth::Authenticator;
use crate::browser::HostPolicy;
use crate::listener::ListenConfig;
use crate::node::{Node, NodeConfig};

/// Everything a server is started with, checked by whoever built it.
pub struct ServerConfig {
    /// The node's identity, leader settings and clock limits.
    pub node: NodeConfig,
    /// The address to listen on (port 0: any free port).
    pub addr: SocketAddr,
    /// Who may call it.
    pub auth: Authenticator,
    /// The host names requests may be addressed to.
    pub hosts: HostPolicy,
    /// TLS and connection limits of the listener.
    pub listen: ListenConfig,
    /// A CA (PEM) trusted for calls forwarded to the leader over TLS.
    pub ca_pem: Option<Vec<u8>>,
    /// The raft service, on a member of a `raft://` cluster.
    pub raft: Option<gnomon_backend::raft::Service>,
}

/// How long each stage of a shutdown may take before it is cut short.
const NODE_STOP: Duration = Duration::from_secs(10);
const LISTENER_STOP: Duration = Duration::from_secs(5);

/// A server being composed.
pub struct Server;

/// A started server.
pub struct Running {
    local: SocketAddr,
    resign_first: bool,
    node_stop: watch::Sender<bool>,
    node_task: JoinHandle<()>,
    http_stop: watch::Sender<bool>,
    http_task: JoinHandle<Result<(), String>>,
    _reloader: Option<JoinHandle<()>>,
}

impl Server {
    /// Installs the metrics recorder, binds the listener and starts the node
    /// and the listener. Fails (having started nothing that keeps running)
    /// when the address cannot be bound or the forwarder's TLS cannot be set.
    pub async fn start(config: ServerConfig, store: Arc<dyn Store>, elector: Arc<dyn Elector>) -> Result<Running, String> {
        let ServerConfig { node, addr, auth, hosts, listen, ca_pem, raft } = config;
        let forward = match &listen.tls {
            None => Forwarder::plain(),
            Some(_) => Forwarder::tls(ca_pem.as_deref())?,
        };
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        let metrics = crate::metrics_setup::install();
        // With a replicated elector, leadership is handed over first; the
        // local elector has nobody to hand over to.
        let resign_first = elector.backend() != "local";
        let node = Node::new(node, store, elector, Arc::new(gnomon_core::SystemClock));
        let reloader = auth.spawn_reloader(Duration::from_secs(1));
        let state = ApiState {
            node: node.handle.clone(),
            metrics,
            auth,
            hosts: Arc::new(hosts),
            ready: Arc::default(),
            raft,
            forward: Some(forward),
            worker_owners: Arc::default(),
        };
        let scheme = if listen.tls.is_some() { "https" } else { "http" };
        tracing::info!("gnomon listening on {scheme}://{local} (console at {scheme}://{local}/, workers connect here too)");
        let (node_stop, node_rx) = watch::channel(false);
        let node_task = tokio::spawn(node.run(node_rx));
        let (http_stop, http_rx) = watch::channel(false);
        let http_task = tokio::spawn(crate::listener::serve(listener, router(state), listen, http_rx, LISTENER_STOP));
        Ok(Running { local, resign_first, node_stop, node_task, http_stop, http_task, _reloader: reloader })
    }
}

impl Running {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stops the server in order. `drain` ends what runs beside it (an
    /// embedded worker, draining its attempts): with a replicated elector
    /// the node resigns first, so another replica takes over at once and
    /// the workers connected here follow it, and then `drain` runs; with the
    /// local elector `drain` runs first, so the last results still reach
    /// this leader, and then the node stops. The listener closes last.
    pub async fn shutdown<F: Future<Output = ()>>(self, drain: F) {
        if self.resign_first {
            tracing::info!("shutting down: resigning leadership, then draining");
            let _ = self.node_stop.send(true);
            let _ = tokio::time::timeout(NODE_STOP, self.node_task).await;
            drain.await;
        } else {
            tracing::info!("shutting down: draining the embedded worker, then resigning");
            drain.await;
            let _ = self.node_stop.send(true);
            let _ = tokio::time::timeout(NODE_STOP, self.node_task).await;
        }
        let _ = self.http_stop.send(true);
        let _ = tokio::time::timeout(LISTENER_STOP, self.http_task).await;
    }
}
