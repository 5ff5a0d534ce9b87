//! The etcd election (the store is in `super`).
//!
//! # Key layout
//! Everything lives under `/gnomon/<cluster>/`:
//! - `election/<scope>/<lease id>`: the candidates of etcd's election API
//!   (v3election). The one with the lowest create revision leads; its value
//!   is the leader's advertised address, so followers and workers can find
//!   it, and its create revision is the term's fencing token.
//!
//! # Election
//! A candidate grants a lease (TTL 5 s by default) and keeps it alive from a
//! task that refreshes it every TTL/3. It then campaigns: the call returns
//! once its key is the oldest of the election. The term's token is that
//! key's create revision — etcd revisions only grow, so tokens strictly
//! increase across terms — and the store is `fence`d with it before any
//! leader work.
//!
//! Leadership is lost (and the `lost` signal set) when
//! - keep-alive has not succeeded for a whole TTL, counted from when the
//!   last successful refresh was *sent* (so we give up no later than etcd
//!   can expire the lease), or etcd answers that the lease is gone;
//! - the leader key is deleted (lease revoked or expired, or an operator
//!   deleted it), seen by a watch on the key. The watch resumes after a
//!   broken stream from the next revision it needs, and keeps that revision
//!   current with progress notifications while the key is idle; when the
//!   revision has been compacted it reads the key instead (gone, or created
//!   by another term: lost) and watches from after that read
//!   (`super::watching`).
//!
//! Requests carry `require_leader`, so a member cut off from its quorum
//! refuses them instead of answering with stale data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, ConnectOptions, EventType, LeaderKey, ResignOptions, WatchOptions};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::watching::{Next, Resumable, WatchStats};
use crate::election::{count_election, jitter, ElectionConfig};
use crate::{ElectionError, Elector, Fence, LeaderInfo, Leadership, Store, StoreError};

/// A cluster name (`/gnomon/<cluster>/`): letters, digits, '-', '_', '.'.
pub fn valid_cluster_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Parses `h1:2379,h2:2379` (an `http://` prefix is accepted) into endpoint
/// URLs, or says exactly what is wrong.
pub fn parse_endpoints(list: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for raw in list.split(',') {
        let e = raw.trim();
        if e.is_empty() {
            return Err(format!("etcd endpoint list {list:?} has an empty entry"));
        }
        if e.starts_with("https://") {
            return Err(format!("etcd endpoint {e:?}: TLS endpoints are not supported yet; use http://"));
        }
        let hostport = e.strip_prefix("http://").unwrap_or(e).trim_end_matches('/');
        if hostport.contains("://") || hostport.contains('/') {
            return Err(format!("etcd endpoint {e:?} must be host:port or http://host:port"));
        }
        let (host, port) = hostport.rsplit_once(':').ok_or_else(|| format!("etcd endpoint {e:?} has no port (host:port)"))?;
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(format!("etcd endpoint {e:?} has no host"));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(format!("etcd endpoint {e:?} has an invalid port {port:?}")),
        }
        out.push(format!("http://{hostport}"));
    }
    Ok(out)
}

/// TLS to etcd: the CA that signed the members' certificates, and a client
/// certificate and key when the members require one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: std::path::PathBuf,
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
}

/// How to reach an etcd cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTarget {
    /// `http://host:port` (as [`parse_endpoints`] gives them).
    pub endpoints: Vec<String>,
    pub user: Option<(String, String)>,
    pub tls: Option<EtcdTls>,
}

impl EtcdTarget {
    pub fn new(endpoints: Vec<String>) -> Self {
        Self { endpoints, user: None, tls: None }
    }

    /// The endpoint URLs, `https://` with TLS.
    pub fn urls(&self) -> Vec<String> {
        self.endpoints
            .iter()
            .map(|e| match &self.tls {
                Some(_) => e.replacen("http://", "https://", 1),
                None => e.clone(),
            })
            .collect()
    }

    /// Client options: timeouts, keep-alive, require-leader, credentials
    /// and TLS (reading the certificate files, or saying which one fails).
    pub fn options(&self, timeout: Duration) -> Result<ConnectOptions, String> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(timeout)
            // etcd answers pings more often than every 5 s (its default
            // --grpc-keepalive-min-time) with GOAWAY "too many pings".
            .with_keep_alive(Duration::from_secs(6), Duration::from_secs(3))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some((u, p)) = &self.user {
            opts = opts.with_user(u.clone(), p.clone());
        }
        if let Some(tls) = &self.tls {
            let read = |what: &str, p: &std::path::Path| std::fs::read(p).map_err(|e| format!("etcd TLS {what} {}: {e}", p.display()));
            let mut t = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(read("CA", &tls.ca)?));
            match (&tls.cert, &tls.key) {
                (Some(c), Some(k)) => t = t.identity(etcd_client::Identity::from_pem(read("certificate", c)?, read("key", k)?)),
                (None, None) => {}
                _ => return Err("etcd TLS: a client certificate needs its key (cert= and key= together)".into()),
            }
            opts = opts.with_tls(t);
        }
        Ok(opts)
    }
}

/// Connects to etcd and checks that a quorum answers.
pub async fn connect(endpoints: &[String], timeout: Duration) -> Result<Client, ElectionError> {
    connect_target(&EtcdTarget::new(endpoints.to_vec()), timeout).await
}

/// Connects to etcd (credentials, TLS) and checks that a quorum answers.
pub async fn connect_target(target: &EtcdTarget, timeout: Duration) -> Result<Client, ElectionError> {
    let opts = target.options(timeout).map_err(ElectionError::Refused)?;
    let urls = target.urls();
    let shown = urls.join(",");
    let mut client = tokio::time::timeout(timeout, Client::connect(&urls, Some(opts)))
        .await
        .map_err(|_| ElectionError::Unavailable(format!("etcd at {shown}: connecting timed out after {timeout:?}")))?
        .map_err(|e| ElectionError::Unavailable(format!("etcd at {shown} is unreachable: {e}")))?;
    tokio::time::timeout(timeout, client.get("/gnomon/", None))
        .await
        .map_err(|_| ElectionError::Unavailable(format!("etcd at {shown} did not answer within {timeout:?} (no quorum?)")))?
        .map_err(|e| match e.to_string() {
            m if m.contains("authentication failed") || m.contains("invalid auth") || m.contains("permission denied") => {
                ElectionError::Refused(format!("etcd at {shown}: {m}"))
            }
            m => ElectionError::Unavailable(format!("etcd at {shown} is unreachable: {m}")),
        })?;
    Ok(client)
}

struct Term {
    leader: LeaderKey,
    lease: i64,
    stop: oneshot::Sender<()>,
}

/// Leader election over etcd's election API.
pub struct EtcdElector {
    target: EtcdTarget,
    client: tokio::sync::Mutex<Option<Client>>,
    prefix: String,
    config: ElectionConfig,
    store: Arc<dyn Store>,
    terms: Mutex<HashMap<u64, Term>>,
    /// The leader-key watches' counters (all terms of this elector).
    watch_stats: Arc<WatchStats>,
}

impl std::fmt::Debug for EtcdElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdElector").field("prefix", &self.prefix).field("ttl", &self.config.ttl).finish()
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> ElectionError {
    ElectionError::Unavailable(format!("etcd {what}: {e}"))
}

/// How long one etcd request may take before we treat etcd as unreachable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

impl EtcdElector {
    /// `cluster` names this gnomon cluster: keys live under `/gnomon/<cluster>/`.
    /// Connects on first use (see [`EtcdElector::client`]).
    pub fn new(endpoints: Vec<String>, cluster: &str, store: Arc<dyn Store>, config: ElectionConfig) -> Self {
        Self::with_target(EtcdTarget::new(endpoints), cluster, store, config)
    }

    /// As [`EtcdElector::new`], with credentials and TLS.
    pub fn with_target(target: EtcdTarget, cluster: &str, store: Arc<dyn Store>, config: ElectionConfig) -> Self {
        Self {
            target,
            client: tokio::sync::Mutex::new(None),
            prefix: format!("/gnomon/{cluster}"),
            config,
            store,
            terms: Mutex::new(HashMap::new()),
            watch_stats: Arc::default(),
        }
    }

    /// The connected client; connects (and checks that a quorum answers)
    /// if there is none yet. Fails with [`ElectionError::Unavailable`].
    pub async fn client(&self) -> Result<Client, ElectionError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = connect_target(&self.target, REQUEST_TIMEOUT).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    fn election(&self, scope: &str) -> String {
        format!("{}/election/{scope}", self.prefix)
    }

    fn ttl_secs(&self) -> i64 {
        self.config.ttl.as_secs().max(1) as i64
    }

    async fn revoke(&self, lease: i64) {
        if let Ok(mut c) = self.client().await {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, c.lease_revoke(lease)).await;
        }
    }
}

/// Keeps `lease` alive until `stop`; sets `alive` to false once a whole TTL
/// has passed since the last refresh that etcd confirmed was sent.
async fn keep_alive(mut client: Client, lease: i64, ttl: Duration, alive: watch::Sender<bool>, mut stop: watch::Receiver<bool>) {
    let every = ttl / 3;
    let mut last_ok = Instant::now();
    let mut stream = None;
    loop {
        if stream.is_none() {
            if let Ok(Ok(s)) = tokio::time::timeout(every, client.lease_keep_alive(lease)).await {
                stream = Some(s);
            }
        }
        if let Some((keeper, replies)) = stream.as_mut() {
            let sent = Instant::now();
            let refreshed = tokio::time::timeout(every, async {
                keeper.keep_alive().await?;
                replies.message().await
            })
            .await;
            match refreshed {
                Ok(Ok(Some(r))) if r.ttl() > 0 => last_ok = sent,
                Ok(Ok(Some(_))) => {
                    tracing::warn!(lease, "etcd: the election lease has expired");
                    let _ = alive.send(false);
                    return;
                }
                _ => stream = None,
            }
        }
        if last_ok.elapsed() >= ttl {
            tracing::warn!(lease, ?ttl, "etcd: no keep-alive succeeded for a whole lease TTL");
            let _ = alive.send(false);
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(every.min(ttl.saturating_sub(last_ok.elapsed()))) => {}
            _ = stop.changed() => return,
        }
    }
}

/// A campaign's lease. Dropped before the campaign succeeds — an error, or
/// the campaign future dropped by a shutdown — it stops the keep-alive and
/// revokes the lease, so a candidate that went away never stays in line
/// ahead of live ones until its TTL runs out.
struct Candidacy {
    client: Client,
    lease: i64,
    /// Taken by a successful campaign (the term owns the keep-alive then).
    stop_keep_alive: Option<watch::Sender<bool>>,
}

impl Drop for Candidacy {
    fn drop(&mut self) {
        let Some(stop) = self.stop_keep_alive.take() else { return };
        let _ = stop.send(true);
        let (mut c, lease) = (self.client.clone(), self.lease);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, c.lease_revoke(lease)).await;
            });
        }
    }
}

/// The leader key as a full read finds it: its create revision (None when
/// it is gone) and the revision of the read.
async fn read_leader_key(client: &mut Client, key: &[u8]) -> Result<(Option<i64>, i64), String> {
    let r = tokio::time::timeout(REQUEST_TIMEOUT, client.get(key.to_vec(), None))
        .await
        .map_err(|_| "reading the leader key timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let rev = r.header().map(|h| h.revision()).unwrap_or(0);
    Ok((r.kvs().first().map(|kv| kv.create_revision()), rev))
}

/// Sets `lost` when the leader key (created at revision `created`)
/// disappears or the lease dies. The watch resumes after breaks from the
/// next revision it needs; when that revision has been compacted it reads
/// the key instead (gone, or re-created by another term, is lost) and
/// watches from after that read (see [`super::watching`]).
pub(super) async fn watch_leadership(
    client: Client,
    key: Vec<u8>,
    created: i64,
    mut alive: watch::Receiver<bool>,
    lost: watch::Sender<bool>,
    mut stop: oneshot::Receiver<()>,
    stats: Arc<WatchStats>,
) {
    let mut reader = client.clone();
    let mut w = Resumable::new(client, key.clone(), WatchOptions::new(), stats, "election").starting_at(created);
    loop {
        let next = tokio::select! {
            n = w.next() => n,
            _ = alive.wait_for(|a| !*a) => break,
            _ = &mut stop => break,
        };
        match next {
            Next::Events(events) => {
                if events.iter().any(|e| e.event_type() == EventType::Delete) {
                    tracing::warn!("etcd: the leader key was deleted");
                    break;
                }
            }
            Next::Reload => match read_leader_key(&mut reader, &key).await {
                Ok((Some(c), rev)) if c == created => w.reloaded(rev),
                Ok(_) => {
                    tracing::warn!("etcd: the leader key is gone (found by a full read after compaction)");
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "etcd: cannot read the leader key; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                        _ = alive.wait_for(|a| !*a) => break,
                        _ = &mut stop => break,
                    }
                }
            },
        }
    }
    let _ = lost.send(true);
}

#[async_trait]
impl Elector for EtcdElector {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    async fn campaign(&self, scope: &str, me: &LeaderInfo) -> Result<Leadership, ElectionError> {
        let mut client = self.client().await?;
        let name = self.election(scope);
        let lease = tokio::time::timeout(REQUEST_TIMEOUT, client.lease_grant(self.ttl_secs(), None))
            .await
            .map_err(|_| unavailable("lease grant", "timed out"))?
            .map_err(|e| unavailable("lease grant", e))?
            .id();
        let (alive_tx, mut alive_rx) = watch::channel(true);
        let (stop_ka_tx, stop_ka_rx) = watch::channel(false);
        tokio::spawn(keep_alive(client.clone(), lease, self.config.ttl, alive_tx, stop_ka_rx));
        let mut candidacy = Candidacy { client: client.clone(), lease, stop_keep_alive: Some(stop_ka_tx) };
        if let Ok(Ok(r)) = tokio::time::timeout(REQUEST_TIMEOUT, client.leader(name.clone())).await {
            if r.kv().is_some() {
                count_election("etcd", "contended");
                tracing::info!(scope, "election: another server leads; campaigning");
            }
        }
        // Blocks until our key is the oldest; gives up if our lease dies.
        let won = tokio::select! {
            r = client.campaign(name.clone(), me.address.clone(), lease) => r.map_err(|e| unavailable("campaign", e)),
            _ = alive_rx.wait_for(|a| !*a) => Err(unavailable("campaign", "the lease expired while waiting")),
        };
        let leader = match won.and_then(|r| r.leader().cloned().ok_or_else(|| unavailable("campaign", "no leader key in the answer"))) {
            Ok(l) => l,
            Err(e) => {
                drop(candidacy);
                tokio::time::sleep(jitter(Duration::from_millis(500))).await;
                return Err(e);
            }
        };
        let token = leader.rev() as u64;
        let info = LeaderInfo { backend: "etcd".into(), ..me.clone() };
        let now = gnomon_core::chrono::Utc::now().timestamp_millis();
        if let Err(e) = self.store.fence(&Fence { scope: scope.to_string(), token }, &info, now).await {
            // Dropping the candidacy revokes the lease, which deletes our key.
            drop(candidacy);
            return Err(match e {
                StoreError::StaleToken { token, current, .. } => ElectionError::Refused(format!(
                    "the etcd election revision {token} is below the store's fencing token {current}: this store was led by another \
                     election backend or etcd cluster; point every server at the same etcd cluster"
                )),
                other => ElectionError::Store(other),
            });
        }
        let (lost_tx, lost_rx) = watch::channel(false);
        let (stop_tx, stop_rx) = oneshot::channel();
        let key = leader.key().to_vec();
        let stats = self.watch_stats.clone();
        let ka_stop = candidacy.stop_keep_alive.take();
        tokio::spawn(async move {
            watch_leadership(client, key, leader_rev(token), alive_rx, lost_tx, stop_rx, stats).await;
            if let Some(stop) = ka_stop {
                let _ = stop.send(true);
            }
        });
        self.terms.lock().unwrap_or_else(|p| p.into_inner()).insert(token, Term { leader, lease, stop: stop_tx });
        Ok(Leadership { scope: scope.to_string(), token, lost: lost_rx })
    }

    async fn resign(&self, leadership: &Leadership) -> Result<(), ElectionError> {
        let term = self.terms.lock().unwrap_or_else(|p| p.into_inner()).remove(&leadership.token);
        let Some(term) = term else { return Ok(()) };
        let _ = term.stop.send(());
        // Deleting our key hands the election to the next candidate at once;
        // revoking the lease removes anything else bound to it.
        if let Ok(mut c) = self.client().await {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, c.resign(Some(ResignOptions::new().with_leader(term.leader)))).await;
        }
        self.revoke(term.lease).await;
        Ok(())
    }

    async fn current_leader(&self, scope: &str) -> Option<String> {
        let mut c = self.client().await.ok()?;
        let r = tokio::time::timeout(REQUEST_TIMEOUT, c.leader(self.election(scope))).await.ok()?.ok()?;
        r.kv().and_then(|kv| kv.value_str().ok()).map(str::to_string)
    }
}

fn leader_rev(token: u64) -> i64 {
    i64::try_from(token).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_or_say_why() {
        assert_eq!(parse_endpoints("127.0.0.1:2379, http://h2:2380/").unwrap(), vec!["http://127.0.0.1:2379", "http://h2:2380"]);
        for bad in ["", "a:1,,b:2", "host", "h:0", "h:99999", "https://h:2379", "ftp://h:1", ":2379", "h:2379/x"] {
            assert!(parse_endpoints(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
