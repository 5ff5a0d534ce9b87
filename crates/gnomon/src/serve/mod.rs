//! `gnomon dev` and `gnomon server` (and `migrate`): flags, composition,
//! shutdown order. `gnomon worker` is in `worker.rs`, the access flags in
//! `access.rs`, what every serving process shares in `process.rs`.

mod access;
mod process;
mod worker;

pub use access::{parse_run_as_range, AccessArgs, JobUserArgs};
pub use process::{LogFormat, LOG_FORMAT};
pub use worker::{worker, WorkerArgs};

use process::{default_node_id, init_tracing, lock_data_dir, parse_listen, wait_for_signal};
use worker::check_capacity;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use std::time::Duration;

use crate::leader_args::LeaderArgs;
use gnomon_backend::election::LocalElector;
use gnomon_backend::election::{plan_election, ElectionConfig, ElectionKind, ElectionPlan, Fallback, FallbackElector};
use gnomon_backend::electors::lock_elector_for;
use gnomon_backend::etcd::EtcdElector;
use gnomon_backend::{open_store, open_store_with, Elector, StoreKind};
use gnomon_server::auth::Authenticator;
use gnomon_server::browser::HostPolicy;
use gnomon_server::listener::ListenConfig;
use gnomon_server::NodeConfig;
use gnomon_worker::{HandlerRegistry, WorkerConfig, WorkerRuntime};

#[derive(Args, Debug)]
pub struct DevArgs {
    /// The address the API, the console and the worker protocol listen on.
    #[arg(long, default_value = "127.0.0.1:7400", env = "GNOMON_LISTEN")]
    listen: String,
    /// Where the embedded SQLite store, the worker's spool, its attempts'
    /// working directories (`worker-work/`) and, with --run-as-range, the
    /// namespaces' uids (`uids.json`) live.
    #[arg(long, default_value = "./.gnomon", env = "GNOMON_DATA_DIR")]
    data_dir: PathBuf,
    /// Allow a non-loopback listener without a token.
    #[arg(long, env = "GNOMON_INSECURE")]
    insecure: bool,
    /// Attempts the embedded worker runs at once.
    #[arg(long, default_value_t = 256, env = "GNOMON_CAPACITY")]
    capacity: u32,
    #[command(flatten)]
    access: AccessArgs,
    #[command(flatten)]
    jobs: JobUserArgs,
    #[command(flatten)]
    leader: LeaderArgs,
    /// This node's name in leadership records and logs (default: dev).
    #[arg(long, env = "GNOMON_NODE_ID")]
    node_id: Option<String>,
}

/// Connection settings of the networked stores. TLS and credentials come
/// from the URL (`sslmode=require` for PostgreSQL, `ssl-mode=REQUIRED` for MySQL).
#[derive(Args, Debug)]
pub struct StoreArgs {
    /// sqlite://PATH, mysql://USER:PASS@HOST:PORT/DB, postgres://USER:PASS@HOST:PORT/DB
    /// or etcd://[USER:PASS@]HOST:2379,HOST:2379[/CLUSTER].
    #[arg(long, env = "GNOMON_STORE")]
    store: String,
    /// Most connections to a MySQL/PostgreSQL store.
    #[arg(long, default_value_t = 10, env = "GNOMON_STORE_POOL_MAX")]
    store_pool_max: u32,
    /// Connections kept open when idle.
    #[arg(long, default_value_t = 1, env = "GNOMON_STORE_POOL_MIN")]
    store_pool_min: u32,
    /// Longest wait to connect (or for a free connection).
    #[arg(long, default_value = "5s", env = "GNOMON_STORE_CONNECT_TIMEOUT", value_parser = crate::leader_args::duration_arg)]
    store_connect_timeout: String,
    /// Longest a statement may run.
    #[arg(long, default_value = "30s", env = "GNOMON_STORE_STATEMENT_TIMEOUT", value_parser = crate::leader_args::duration_arg)]
    store_statement_timeout: String,
    /// Longest a statement waits for a row lock.
    #[arg(long, default_value = "10s", env = "GNOMON_STORE_LOCK_TIMEOUT", value_parser = crate::leader_args::duration_arg)]
    store_lock_timeout: String,
}

impl StoreArgs {
    fn options(&self) -> anyhow::Result<gnomon_backend::StoreOptions> {
        let d = |flag: &str, v: &str| gnomon_core::duration::parse_duration(v).map_err(|e| anyhow!("--{flag}: {e}"));
        if self.store_pool_max == 0 || self.store_pool_min > self.store_pool_max {
            bail!("--store-pool-max must be at least 1 and at least --store-pool-min");
        }
        Ok(gnomon_backend::StoreOptions {
            pool_max: self.store_pool_max,
            pool_min: self.store_pool_min,
            connect_timeout: d("store-connect-timeout", &self.store_connect_timeout)?,
            statement_timeout: d("store-statement-timeout", &self.store_statement_timeout)?,
            lock_timeout: d("store-lock-timeout", &self.store_lock_timeout)?,
            ..Default::default()
        })
    }

    async fn open(&self) -> anyhow::Result<Arc<dyn gnomon_backend::Store>> {
        self.open_with_idle_tx(gnomon_backend::StoreOptions::default().idle_in_transaction_timeout).await
    }

    /// Opens the store; a transaction left idle for `idle_tx` (a paused or
    /// cut-off leader's) is rolled back by the server.
    async fn open_with_idle_tx(&self, idle_tx: Duration) -> anyhow::Result<Arc<dyn gnomon_backend::Store>> {
        let mut options = self.options()?;
        options.idle_in_transaction_timeout = idle_tx;
        // The error says what is wrong (unreachable, credentials, privilege,
        // version) and never echoes the URL's password.
        open_store_with(&self.store, &options).await.map_err(|e| anyhow!("cannot open the store: {e}"))
    }
}

#[derive(Args, Debug)]
pub struct MigrateArgs {
    #[command(flatten)]
    store: StoreArgs,
}

/// `gnomon migrate`: opening a store applies its migrations.
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    init_tracing();
    let store = args.store.open().await?;
    println!("{} store is migrated and ready", store.backend());
    Ok(())
}

#[derive(Args, Debug)]
pub struct ServerArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Election backend: auto (etcd if --etcd is given, else the store's
    /// own lock for MySQL/PostgreSQL, else local), etcd, mysql, postgres, local.
    #[arg(long, env = "GNOMON_ELECTION", default_value = "auto", value_parser = ["auto", "etcd", "mysql", "postgres", "local", "raft"])]
    election: String,
    /// etcd endpoints for the election: host:2379,host:2379,… (any store).
    #[arg(long, env = "GNOMON_ETCD")]
    etcd: Option<String>,
    /// TLS to the --etcd members: the CA that signed their certificates.
    #[arg(long, env = "GNOMON_ETCD_CA")]
    etcd_ca: Option<PathBuf>,
    /// TLS client certificate for --etcd (with --etcd-key).
    #[arg(long, env = "GNOMON_ETCD_CERT")]
    etcd_cert: Option<PathBuf>,
    /// TLS client key for --etcd.
    #[arg(long, env = "GNOMON_ETCD_KEY")]
    etcd_key: Option<PathBuf>,
    /// Names this gnomon cluster in etcd: its keys live under /gnomon/<cluster>/
    /// (default "default"; with an etcd:// store, the store URL's cluster).
    #[arg(long, env = "GNOMON_CLUSTER")]
    cluster: Option<String>,
    /// How long a silent leader keeps its etcd lease or database lock.
    #[arg(long, default_value = "5s", env = "GNOMON_ELECTION_TTL", value_parser = crate::leader_args::duration_arg)]
    election_ttl: String,
    /// When etcd cannot be reached: none (keep campaigning as a follower) or
    /// local (degraded: lead without mutual exclusion).
    #[arg(long, default_value = "none", env = "GNOMON_ELECTION_FALLBACK", value_parser = ["none", "local"])]
    election_fallback: String,
    /// Declares this the only gnomon server on its MySQL/PostgreSQL store,
    /// which makes --election local acceptable there.
    #[arg(long, env = "GNOMON_SINGLE_SERVER")]
    single_server: bool,
    /// The address the API, the console, the worker protocol (and raft
    /// traffic) listen on.
    #[arg(long, default_value = "127.0.0.1:7400", env = "GNOMON_LISTEN")]
    listen: String,
    /// Address others use to reach this node (default: the listen address).
    #[arg(long, env = "GNOMON_ADVERTISE")]
    advertise: Option<String>,
    /// This node's name in leadership records, logs and metrics (default:
    /// the host name and the process id).
    #[arg(long, env = "GNOMON_NODE_ID")]
    node_id: Option<String>,
    /// Allow a non-loopback listener without TLS or without credentials
    /// (for example behind a proxy that terminates TLS on a private network).
    #[arg(long, env = "GNOMON_INSECURE")]
    insecure: bool,
    /// Attempts an embedded worker runs at once (0: no embedded worker; run
    /// `gnomon worker` processes instead).
    #[arg(long, default_value_t = 0, env = "GNOMON_CAPACITY")]
    capacity: u32,
    /// The embedded worker's data dir (locked; one per process): its
    /// attempts' working directories (`work/`) and, with --run-as-range,
    /// the namespaces' uids (`uids.json`); required with --run-as-range.
    /// Without it, attempts get their directories in a fresh private
    /// directory in the temp dir.
    #[arg(long, value_name = "DIR", env = "GNOMON_WORKER_DATA_DIR")]
    worker_data_dir: Option<PathBuf>,
    #[command(flatten)]
    jobs: JobUserArgs,
    #[command(flatten)]
    access: AccessArgs,
    #[command(flatten)]
    leader: LeaderArgs,
    #[command(flatten)]
    raft: crate::raft_member::RaftArgs,
}

/// The embedded worker's cgroups: when this process may create them.
fn embedded_cgroups() -> Option<gnomon_worker::cgroup::Cgroups> {
    gnomon_worker::cgroup::Cgroups::shared(gnomon_worker::cgroup::Mode::Auto).ok().flatten()
}

pub async fn dev(args: DevArgs, token: Option<String>, ca: Option<PathBuf>) -> anyhow::Result<()> {
    init_tracing();
    let addr = parse_listen(&args.listen)?;
    let node_id = args.node_id.unwrap_or_else(|| "dev".to_string());
    check_capacity(args.capacity)?;
    // Every flag is checked before anything is created or opened.
    let config = args.leader.node_config(node_id.clone(), addr.to_string(), "10s")?;
    let mut worker = embedded_worker(&node_id, args.capacity, Some(args.data_dir.join("worker-spool")));
    let auth = args.access.authenticator(token.as_deref(), Some(&mut worker))?;
    let listen = args.access.listen_config()?;
    gnomon_server::auth::check_listen(&addr, auth.enabled(), listen.tls.is_some(), args.insecure).map_err(|e| anyhow!(e))?;
    let hosts = args.access.hosts(&addr.to_string(), auth.enabled())?;
    worker.tls = args.access.embedded_worker_tls(ca.as_deref());
    // A tokenless dev on loopback holds nothing a local user could not use
    // through its API anyway; anything else has something to keep.
    let exposed = (auth.enabled() || !addr.ip().is_loopback()).then(|| {
        format!(
            "the data dir {} (the store: every job, run and output), the files this process reads \
             (--token-file, --auth-file, TLS keys, a --config file) and its processes",
            args.data_dir.display()
        )
    });
    let users = args.jobs.resolve(true, exposed.as_deref())?;
    let _lock = lock_data_dir(&args.data_dir)?;
    let users = users.open(Some(&args.data_dir))?;
    worker.isolation = Arc::new(
        gnomon_worker::isolation::Isolation::new(Some(args.data_dir.join("worker-work")), users, embedded_cgroups())
            .map_err(|e| anyhow!(e))?,
    );
    let db = args.data_dir.join("gnomon.db");
    let url = format!("sqlite://{}", db.display());
    let store = open_store(&url).await.with_context(|| format!("opening store {url}"))?;
    let elector: Arc<dyn Elector> = Arc::new(LocalElector::new(store.clone()));
    run_node(config, store, elector, addr, (auth, hosts, listen, ca.as_deref()), Some(worker), None).await
}

pub async fn server(args: ServerArgs, token: Option<String>, ca: Option<PathBuf>) -> anyhow::Result<()> {
    init_tracing();
    let addr = parse_listen(&args.listen)?;
    let node_id = args.node_id.clone().unwrap_or_else(default_node_id);
    if args.capacity > 0 {
        check_capacity(args.capacity)?;
    }
    let mut worker = (args.capacity > 0).then(|| embedded_worker(&node_id, args.capacity, None));
    let mut _worker_lock = None;
    let auth = args.access.authenticator(token.as_deref(), worker.as_mut())?;
    let listen = args.access.listen_config()?;
    gnomon_server::auth::check_listen(&addr, auth.enabled(), listen.tls.is_some(), args.insecure).map_err(|e| anyhow!(e))?;
    let store_kind = store_kind(&args.store.store)?;
    // A raft member is reached at its --raft-peers address.
    let raft_addr = match (store_kind, &args.raft.raft_peers, args.raft.raft_id) {
        (StoreKind::Raft, Some(p), Some(id)) => crate::raft_member::parse_peers(p)?.get(&id).cloned(),
        _ => None,
    };
    let advertise = args.advertise.clone().or(raft_addr).unwrap_or_else(|| addr.to_string());
    let election_ttl = gnomon_core::duration::parse_duration(&args.election_ttl).map_err(|e| anyhow!("--election-ttl: {e}"))?;
    let outlasting = lease_outlasting_failover(election_ttl);
    let default_lease = match store_kind {
        StoreKind::Etcd => outlasting.max(Duration::from_secs(15)),
        StoreKind::Raft => Duration::from_secs(10),
        _ => outlasting,
    };
    let config = args.leader.node_config(node_id.clone(), advertise.clone(), &gnomon_core::duration::format_duration(default_lease))?;
    let lease = Duration::from_millis(u64::try_from(config.leader.lease_ttl_ms).unwrap_or(0));
    if store_kind != StoreKind::Raft && lease < outlasting {
        tracing::warn!(
            lease = %gnomon_core::duration::format_duration(lease),
            election_ttl = %args.election_ttl,
            "--lease-ttl is short for --election-ttl: workers fence themselves after 0.7 x the lease without a leader, \
             so a failover that takes the whole election TTL may end running attempts; a lease of {} or more outlasts one",
            gnomon_core::duration::format_duration(outlasting)
        );
    }
    let hosts = args.access.hosts(&advertise, auth.enabled())?;
    if let Some(w) = worker.as_mut() {
        w.tls = args.access.embedded_worker_tls(ca.as_deref());
        let exposed = "the store's files or credentials where this process can read them (a --config file, \
             the SQLite or raft data dir), the files it reads (--token-file, --auth-file, TLS keys) and its processes";
        let users = args.jobs.resolve(true, Some(exposed))?;
        // Its own data dir when given (needed for --run-as-range), else a
        // fresh private directory in the temp dir for its attempts.
        let (work_root, users) = match &args.worker_data_dir {
            Some(dir) => {
                _worker_lock = Some(lock_data_dir(dir)?);
                (Some(dir.join("work")), users.open(Some(dir))?)
            }
            None => (None, users.open(None)?),
        };
        w.isolation = Arc::new(gnomon_worker::isolation::Isolation::new(work_root, users, embedded_cgroups()).map_err(|e| anyhow!(e))?);
    } else if args.jobs.given() || args.worker_data_dir.is_some() {
        bail!("--run-as, --run-as-range and --worker-data-dir apply to the embedded worker: give --capacity N too");
    }
    if store_kind == StoreKind::Raft {
        if !matches!(args.election.as_str(), "auto" | "raft") {
            bail!("--store raft:// elects with raft itself; leave --election at auto");
        }
        let own =
            crate::raft_member::own_credential(args.raft.raft_token_file.as_deref(), token.as_deref(), args.access.token_file.as_deref())?;
        if auth.enabled() && own.is_none() {
            bail!(
                "a raft member with credentials needs the member credential it presents to the others: --raft-token-file FILE \
                 (a member entry of their --auth-file), or --token/--token-file (every member derives one from the shared secret)"
            );
        }
        let dir = crate::raft_member::raft_dir(&args.store.store)?;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let _lock = lock_data_dir(&dir)?;
        let member = crate::raft_member::start(&args.store.store, &args.raft, own.as_deref(), listen.tls.is_some(), ca.as_deref()).await?;
        let store: Arc<dyn gnomon_backend::Store> = Arc::new(gnomon_backend::raft::RaftStore::new(member.clone()));
        let elector: Arc<dyn Elector> = Arc::new(gnomon_backend::raft::RaftElector::new(member.clone()));
        tracing::info!(backend = "raft", member = member.id, "election backend");
        let raft = Some(member.service());
        let r = run_node(config, store, elector, addr, (auth, hosts, listen, ca.as_deref()), worker, raft).await;
        member.shutdown().await;
        return r;
    }
    if args.raft != crate::raft_member::RaftArgs::default() {
        bail!("--raft-id, --raft-peers and --raft-bootstrap go with --store raft://DIR");
    }
    let kind: ElectionKind = args.election.parse().map_err(|e: String| anyhow!(e))?;
    let fallback: Fallback = args.election_fallback.parse().map_err(|e: String| anyhow!(e))?;
    let plan = plan_election(kind, args.etcd.is_some(), store_kind, fallback, args.single_server).map_err(|e| anyhow!(e))?;
    let ttl = gnomon_core::duration::parse_duration(&args.election_ttl).map_err(|e| anyhow!("--election-ttl: {e}"))?;
    if !(Duration::from_secs(1)..=Duration::from_secs(60)).contains(&ttl) {
        bail!("--election-ttl must be between 1s and 60s");
    }
    let election = ElectionConfig { ttl, ..Default::default() };
    // With the etcd store, the election runs in the store's cluster (its
    // writes compare the term's election key) on the store's endpoints
    // unless --etcd names others.
    let etcd_store = match store_kind {
        StoreKind::Etcd => Some(gnomon_backend::etcd::parse_url(&args.store.store).map_err(|e| anyhow!("--store: {e}"))?),
        _ => None,
    };
    if (args.etcd_ca.is_some() || args.etcd_cert.is_some() || args.etcd_key.is_some()) && args.etcd.is_none() {
        bail!("--etcd-ca/--etcd-cert/--etcd-key apply to --etcd (an etcd:// store takes ca=, cert=, key= in its URL)");
    }
    let target = match (&args.etcd, &etcd_store) {
        (Some(list), _) => {
            let tls = match (&args.etcd_ca, &args.etcd_cert, &args.etcd_key) {
                (None, None, None) => None,
                (Some(ca), cert, key) if cert.is_some() == key.is_some() => {
                    Some(gnomon_backend::etcd::EtcdTls { ca: ca.clone(), cert: cert.clone(), key: key.clone() })
                }
                (None, _, _) => bail!("--etcd-cert/--etcd-key need --etcd-ca"),
                _ => bail!("--etcd-cert and --etcd-key go together"),
            };
            let endpoints = gnomon_backend::etcd::parse_endpoints(list).map_err(|e| anyhow!("--etcd: {e}"))?;
            gnomon_backend::etcd::EtcdTarget { endpoints, user: None, tls }
        }
        (None, Some(u)) => u.target.clone(),
        (None, None) => gnomon_backend::etcd::EtcdTarget::default(),
    };
    let cluster = match (&args.cluster, &etcd_store) {
        (Some(c), Some(u)) if *c != u.cluster => {
            bail!("--cluster {c:?} differs from the etcd store's cluster {:?}; the election must run in the store's cluster", u.cluster)
        }
        (_, Some(u)) => u.cluster.clone(),
        (Some(c), None) => c.clone(),
        (None, None) => "default".to_string(),
    };
    if !gnomon_backend::etcd::valid_cluster_name(&cluster) {
        bail!("--cluster {cluster:?} must be letters, digits, '-', '_' or '.'");
    }
    // Two processes on one SQLite file would fence each other: lock its directory.
    let _lock = match args.store.store.strip_prefix("sqlite://").map(|p| Path::new(p).parent().unwrap_or(Path::new("."))) {
        Some(dir) if !dir.as_os_str().is_empty() => Some(lock_data_dir(dir)?),
        _ => None,
    };
    let store = args.store.open_with_idle_tx(ttl).await?;
    let elector: Arc<dyn Elector> = match plan {
        ElectionPlan::Etcd { fallback_local } => {
            let etcd = Arc::new(EtcdElector::with_target(target, &cluster, store.clone(), election));
            match etcd.client().await {
                Ok(_) => {}
                Err(e) if fallback_local => tracing::warn!(error = %e, "etcd is unreachable at start; --election-fallback local"),
                Err(e) => bail!(
                    "{e}; the etcd elector cannot start (pass --election-fallback local to lead without etcd, at the risk of two leaders)"
                ),
            }
            if fallback_local {
                Arc::new(FallbackElector::new(etcd, store.clone()))
            } else {
                etcd
            }
        }
        ElectionPlan::StoreLock => match lock_elector_for(&args.store.store, store.clone(), election).await {
            Ok(Some(e)) => Arc::new(e),
            Ok(None) => bail!("the {store_kind} store has no database lock to elect with"),
            Err(e) => bail!("cannot use the {store_kind} election lock: {e}"),
        },
        ElectionPlan::Local => {
            if store_kind != StoreKind::Sqlite {
                tracing::warn!(
                    backend = store_kind.name(),
                    "--single-server: the local elector leads unconditionally on this shared store"
                );
            }
            Arc::new(LocalElector::new(store.clone()))
        }
    };
    tracing::info!(backend = elector.backend(), "election backend");
    run_node(config, store, elector, addr, (auth, hosts, listen, ca.as_deref()), worker, None).await
}

/// A store URL fit to print: whatever precedes an `@` (user and password)
/// is replaced, with or without a scheme.
fn without_credentials(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").map_or(("", url), |(s, r)| (s, r));
    let rest = rest.rsplit_once('@').map_or(rest.to_string(), |(_, host)| format!("…@{host}"));
    if scheme.is_empty() {
        rest
    } else {
        format!("{scheme}://{rest}")
    }
}

/// The store's kind from its URL, before connecting (for the election plan).
fn store_kind(url: &str) -> anyhow::Result<StoreKind> {
    StoreKind::of(url).ok_or_else(|| {
        anyhow!("--store {:?} must start with sqlite://, mysql://, postgres://, etcd:// or raft://", without_credentials(url))
    })
}

/// The embedded worker of `dev` / `server --capacity N`.
fn embedded_worker(node_id: &str, capacity: u32, spool_dir: Option<PathBuf>) -> WorkerConfig {
    let mut w = WorkerConfig::new(format!("{node_id}-worker"), vec![]);
    w.capacity = capacity;
    w.prefetch = gnomon_worker::session::default_prefetch(capacity);
    w.spool_dir = spool_dir;
    w.drain_timeout = std::time::Duration::from_secs(5);
    w
}

/// Starts the server, and the embedded worker beside it (over loopback to
/// the listener, the same protocol as `gnomon worker`), until SIGTERM; then
/// stops them in the server's order.
async fn run_node(
    config: NodeConfig,
    store: Arc<dyn gnomon_backend::Store>,
    elector: Arc<dyn Elector>,
    addr: SocketAddr,
    (auth, hosts, listen, ca): (Authenticator, HostPolicy, ListenConfig, Option<&Path>),
    embedded_worker: Option<WorkerConfig>,
    raft: Option<gnomon_backend::raft::Service>,
) -> anyhow::Result<()> {
    let ca_pem = match (&listen.tls, ca) {
        (Some(_), Some(p)) => Some(std::fs::read(p).with_context(|| format!("reading --ca {}", p.display()))?),
        _ => None,
    };
    let config = gnomon_server::server::ServerConfig { node: config, addr, auth, hosts, listen, ca_pem, raft };
    let server = gnomon_server::server::Server::start(config, store, elector).await.map_err(|e| anyhow!(e))?;
    let (worker_stop_tx, worker_stop_rx) = tokio::sync::watch::channel(false);
    let worker_task = embedded_worker.map(|mut w| {
        w.servers = vec![server.local_addr().to_string()];
        let drain = w.drain_timeout;
        (tokio::spawn(WorkerRuntime::new(w, HandlerRegistry::with_builtins()).run(worker_stop_rx)), drain)
    });
    wait_for_signal().await;
    server
        .shutdown(async move {
            let _ = worker_stop_tx.send(true);
            if let Some((task, drain)) = worker_task {
                let _ = tokio::time::timeout(drain + Duration::from_secs(6), task).await;
            }
        })
        .await;
    Ok(())
}

/// The shortest worker lease that outlasts a failover: a silent leader
/// keeps its lock or lease for the election TTL, a follower takes it within
/// about a second more, and a worker reconnects within its 2 s backoff;
/// workers fence themselves at 0.7 × the lease. At least 10 s.
fn lease_outlasting_failover(election_ttl: Duration) -> Duration {
    let needed = (election_ttl + Duration::from_secs(4)).mul_f64(1.0 / 0.7);
    Duration::from_secs(needed.as_secs() + u64::from(needed.subsec_nanos() > 0)).max(Duration::from_secs(10))
}

#[cfg(test)]
mod lease_tests {
    use super::*;

    #[test]
    fn the_default_lease_outlasts_a_failover() {
        // 5 s election TTL: 9 s / 0.7 = 12.9 s.
        assert_eq!(lease_outlasting_failover(Duration::from_secs(5)), Duration::from_secs(13));
        assert_eq!(lease_outlasting_failover(Duration::from_secs(1)), Duration::from_secs(10));
        assert_eq!(lease_outlasting_failover(Duration::from_secs(3)), Duration::from_secs(10));
        assert_eq!(lease_outlasting_failover(Duration::from_secs(30)), Duration::from_secs(49));
    }
}
