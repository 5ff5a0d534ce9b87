//! `gnomon dev` and `gnomon server`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use std::time::Duration;

use crate::leader_args::LeaderArgs;
use gnomon_backend::election::LocalElector;
use gnomon_backend::election::{lock_elector_for, plan_election, ElectionConfig, ElectionKind, ElectionPlan, Fallback, FallbackElector};
use gnomon_backend::etcd::EtcdElector;
use gnomon_backend::{open_store, open_store_with, Elector};
use gnomon_server::api::{router, ApiState};
use gnomon_server::auth::{AuthConfig, Authenticator, Principal, Role};
use gnomon_server::browser::HostPolicy;
use gnomon_server::listener::{ListenConfig, TlsFiles};
use gnomon_server::{Node, NodeConfig};
use gnomon_worker::{HandlerRegistry, WorkerConfig, WorkerRuntime, WorkerTls};

#[derive(Args, Debug)]
pub struct DevArgs {
    /// The address the API, the console and the worker protocol listen on.
    #[arg(long, default_value = "127.0.0.1:7400", env = "GNOMON_LISTEN")]
    listen: String,
    /// Where the embedded SQLite store, the worker's spool and its id live.
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

/// Who may call the server, shared by `dev` and `server`.
#[derive(Args, Debug)]
pub struct AccessArgs {
    /// A file holding one admin token (re-read when it changes).
    #[arg(long, env = "GNOMON_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// A TOML file of named credentials with roles (viewer, operator,
    /// admin, worker), kept as SHA-256 hashes; re-read when it changes.
    /// `gnomon auth new` makes entries.
    #[arg(long, env = "GNOMON_AUTH_FILE")]
    auth_file: Option<PathBuf>,
    /// Host names requests may be addressed to, besides IP addresses,
    /// localhost and the --advertise host (comma-separated; `*`: any, only
    /// with credentials). Other names are refused, which defeats DNS
    /// rebinding.
    #[arg(long, value_delimiter = ',', env = "GNOMON_ALLOWED_HOSTS")]
    allowed_hosts: Vec<String>,
    /// TLS certificate chain (PEM) for the listener: the API, the UI and
    /// the worker protocol. Re-read when it changes.
    #[arg(long, requires = "tls_key", env = "GNOMON_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert", env = "GNOMON_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// CA (PEM) of worker client certificates: workers must then present
    /// one signed by it (mutual TLS). API clients need none.
    #[arg(long, requires = "tls_cert", env = "GNOMON_CLIENT_CA")]
    client_ca: Option<PathBuf>,
    /// Most connections open at once. Past it, a new connection takes the
    /// place of an idle one (no request in flight), or is closed at once
    /// when all are busy.
    #[arg(long, default_value_t = 4096, env = "GNOMON_MAX_CONNECTIONS")]
    max_connections: usize,
    /// Most connections one client address may hold (an IPv6 client counts
    /// by its /64; loopback too). Past it, the client's own oldest idle
    /// connection makes room, or the new one is closed at once. Default: a
    /// quarter of --max-connections, at least 16.
    #[arg(long, value_name = "N", env = "GNOMON_MAX_CONNECTIONS_PER_CLIENT")]
    max_connections_per_client: Option<usize>,
}

impl AccessArgs {
    /// The credentials in force, with an embedded worker's own when there is
    /// one. The embedded worker never holds the admin token: with `--token`
    /// it uses the worker credential every server derives from that token
    /// (so it can follow the leader to another server); otherwise a worker
    /// credential made here for its own id, valid on this server only.
    fn authenticator(&self, token: Option<&str>, embedded_worker: Option<&mut WorkerConfig>) -> anyhow::Result<Authenticator> {
        let mut config = AuthConfig {
            token: token.map(str::to_string),
            token_file: self.token_file.clone(),
            auth_file: self.auth_file.clone(),
            extra: Vec::new(),
        };
        let enabled = config.token.is_some() || config.token_file.is_some() || config.auth_file.is_some();
        if let Some(w) = embedded_worker {
            w.token = match (&config.token, enabled) {
                (_, false) => None,
                (Some(t), true) => Some(gnomon_server::auth::Derived::Worker.token(t)),
                (None, true) => {
                    let t = gnomon_server::auth::new_token();
                    let p = Principal {
                        name: Arc::from("embedded-worker"),
                        role: Role::Worker,
                        namespaces: None,
                        worker_prefix: Some(Arc::from(w.id.as_str())),
                    };
                    config.extra.push((t.clone(), p));
                    Some(t)
                }
            };
        }
        Authenticator::load(config).map_err(|e| anyhow!(e))
    }

    /// The listener's settings.
    fn listen_config(&self) -> anyhow::Result<ListenConfig> {
        if self.max_connections == 0 {
            bail!("--max-connections must be at least 1");
        }
        match self.max_connections_per_client {
            Some(0) => bail!("--max-connections-per-client must be at least 1"),
            Some(n) if n > self.max_connections => {
                bail!("--max-connections-per-client ({n}) cannot be more than --max-connections ({})", self.max_connections)
            }
            _ => {}
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert: cert.clone(), key: key.clone(), client_ca: self.client_ca.clone() }),
            _ => None,
        };
        if let Some(t) = &tls {
            // Fail at start, not at the first handshake.
            gnomon_server::listener::tls_config(t).map(|(_, task)| task.abort()).map_err(|e| anyhow!(e))?;
        }
        Ok(ListenConfig {
            max_connections: self.max_connections,
            max_connections_per_client: self.max_connections_per_client,
            tls,
            ..Default::default()
        })
    }

    /// With TLS on, the embedded worker dials its own listener over
    /// loopback and accepts that listener's certificate as is (pinned);
    /// other servers it is sent to are checked against `--ca` (or the
    /// public roots). With `--client-ca` it presents the server's
    /// certificate, which must then allow client authentication.
    fn embedded_worker_tls(&self, ca: Option<&Path>) -> Option<WorkerTls> {
        let (cert, key) = (self.tls_cert.clone()?, self.tls_key.clone()?);
        Some(WorkerTls { ca: ca.map(Path::to_path_buf), identity: self.client_ca.as_ref().map(|_| (cert.clone(), key)), pin: Some(cert) })
    }

    /// The Host policy; `credentials`: whether any are configured (`*` is
    /// refused without).
    fn hosts(&self, advertise: &str, credentials: bool) -> anyhow::Result<HostPolicy> {
        let names = self.allowed_hosts.iter().cloned().chain(gnomon_server::browser::advertised_host(advertise));
        HostPolicy::new(names).and_then(|p| p.with_credentials(credentials)).map_err(|e| anyhow!(e))
    }
}

/// Which user shell jobs run as, shared by `worker`, `dev` and `server`.
#[derive(Args, Debug, Default)]
pub struct JobUserArgs {
    /// Run shell jobs as this user (this process must run as root; jobs
    /// get that user's primary group only and its HOME). Without it, jobs
    /// run as this process's own user and can reach what it can: its data
    /// dir, its files (a --token-file, TLS keys), its other jobs' files.
    #[arg(long, value_name = "USER", env = "GNOMON_RUN_AS")]
    pub run_as: Option<String>,
    /// Run shell jobs as root when this process runs as root without
    /// --run-as (refused otherwise): every job can then do anything on
    /// this host.
    #[arg(long, env = "GNOMON_ALLOW_ROOT_JOBS", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_root_jobs: bool,
}

impl JobUserArgs {
    /// The user shell jobs run as, checked before anything is created:
    /// `--run-as` looked up; without it, a root process refuses to start
    /// unless `--allow-root-jobs`, and any other warns (when `exposed`
    /// says what a job could reach) that its jobs run as its own user.
    fn resolve(&self, shell: bool, exposed: Option<&str>) -> anyhow::Result<Option<gnomon_worker::isolation::RunAs>> {
        if let Some(u) = &self.run_as {
            let user = gnomon_worker::isolation::RunAs::lookup(u).map_err(|e| anyhow!(e))?;
            tracing::info!(user = %user.name, uid = user.uid, "shell jobs run as {}", user.name);
            return Ok(Some(user));
        }
        if !shell {
            return Ok(None);
        }
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if euid == 0 {
            if !self.allow_root_jobs {
                bail!(
                    "refusing to run shell jobs as root: every job could do anything on this host. \
                     Pass --run-as USER to run them as an unprivileged user (for example --run-as nobody), \
                     or --allow-root-jobs (GNOMON_ALLOW_ROOT_JOBS=1) to accept root jobs"
                );
            }
            tracing::warn!(
                "shell jobs run as root (--allow-root-jobs): every job can do anything on this host, {}; \
                 --run-as USER runs them as an unprivileged user",
                exposed.unwrap_or("this process's files included")
            );
        } else if let Some(what) = exposed {
            tracing::warn!(
                uid = euid,
                "shell jobs run as this process's user (uid {euid}) and can reach what it can: {what}; \
                 run this process as root with --run-as USER to run them as another user"
            );
        }
        Ok(None)
    }
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Stable worker id (default: generated once and kept in the data dir).
    #[arg(long, env = "GNOMON_ID")]
    id: Option<String>,
    /// Attempts run at once.
    #[arg(long, default_value_t = 16, env = "GNOMON_CAPACITY")]
    capacity: u32,
    /// Assignments accepted beyond --capacity, queued and started the moment
    /// a slot frees (default: eight times --capacity; 0: none). The leader
    /// only queues runs of jobs whose recent attempts were short, on a worker
    /// whose held attempts are all short, and only as many as start within
    /// about 100 ms at the worker's recent pace, so nothing waits long
    /// behind a slow run.
    #[arg(long, env = "GNOMON_PREFETCH")]
    prefetch: Option<u32>,
    /// A label for routing (`--label zone=a`), repeatable.
    #[arg(long = "label", value_name = "K=V", env = "GNOMON_LABEL")]
    labels: Vec<String>,
    /// Keeps the worker id and the spool of unacknowledged reports.
    #[arg(long, default_value = "./.gnomon-worker", env = "GNOMON_DATA_DIR")]
    data_dir: PathBuf,
    /// The executor kinds this worker runs (comma-separated: shell, http,
    /// handler; default: all). A worker for HTTP jobs only never runs a
    /// shell command.
    #[arg(long, value_delimiter = ',', value_parser = ["shell", "http", "handler"], env = "GNOMON_EXECUTORS")]
    executors: Vec<String>,
    #[command(flatten)]
    jobs: JobUserArgs,
    /// Run each shell attempt in its own cgroup v2 (auto: when this
    /// process may create them, with a note at start when not; off;
    /// required: refuse to start without). In a cgroup, ending an attempt
    /// kills everything it started, and its memory and processes limits
    /// cover all its processes together.
    #[arg(long, default_value = "auto", value_name = "MODE", env = "GNOMON_CGROUPS")]
    cgroups: gnomon_worker::cgroup::Mode,
    /// An address range HTTP jobs may not reach (repeatable), on top of
    /// the link-local ones (cloud metadata), which are denied by default.
    #[arg(long = "deny-cidr", value_name = "CIDR", env = "GNOMON_DENY_CIDR")]
    deny_cidrs: Vec<String>,
    /// Let HTTP jobs reach link-local addresses (169.254.0.0/16, fe80::/10).
    #[arg(long, env = "GNOMON_ALLOW_LINK_LOCAL")]
    allow_link_local: bool,
    /// Send HTTP jobs through this proxy (http:// or https:// URL). The
    /// worker still resolves and checks every target host first. Without
    /// it, HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are ignored.
    #[arg(long, value_name = "URL", env = "GNOMON_HTTP_PROXY")]
    http_proxy: Option<String>,
    /// Client certificate (PEM) for servers that require mutual TLS.
    #[arg(long, requires = "tls_key", env = "GNOMON_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires = "tls_cert", env = "GNOMON_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// On SIGTERM, how long running attempts may take to finish.
    #[arg(long, default_value = "30s", env = "GNOMON_DRAIN_TIMEOUT", value_parser = crate::leader_args::duration_arg)]
    drain_timeout: String,
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
    #[command(flatten)]
    jobs: JobUserArgs,
    #[command(flatten)]
    access: AccessArgs,
    #[command(flatten)]
    leader: LeaderArgs,
    #[command(flatten)]
    raft: crate::raft_member::RaftArgs,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    Text,
    /// One JSON object per line (timestamp, level, target, fields), for
    /// log collectors.
    Json,
}

/// The log format of servers and workers, set once from the global
/// `--log-format` before any command runs.
pub static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// What the log shows unless `GNOMON_LOG` says otherwise. The Raft
/// library's own lines (peers unreachable while they restart, at ERROR)
/// are off: the raft store logs what matters itself (members unreachable
/// and back, elections, snapshots installed, a member stopped).
const DEFAULT_LOG: &str = "info,sqlx=warn,openraft=off";

fn init_tracing() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("GNOMON_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG));
    if LOG_FORMAT.get() == Some(&LogFormat::Json) {
        let _ = tracing_subscriber::fmt().json().with_env_filter(filter).with_writer(std::io::stderr).try_init();
        log_start_notes();
        return;
    }
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
    log_start_notes();
}

/// The warnings `main` found before logging was set up.
fn log_start_notes() {
    for note in crate::hardening::NOTES.get().into_iter().flatten() {
        tracing::warn!("{note}");
    }
}

fn parse_listen(listen: &str) -> anyhow::Result<SocketAddr> {
    listen.parse().map_err(|e| anyhow!("--listen {listen:?} is not an address like 127.0.0.1:7400: {e}"))
}

fn default_node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "node".into());
    format!("{host}-{}", std::process::id())
}

/// Holds an exclusive lock on the data directory so two processes never
/// share one embedded store (the local elector would otherwise fence them
/// against each other).
struct DirLock {
    _file: std::fs::File,
}

fn lock_data_dir(dir: &Path) -> anyhow::Result<DirLock> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).with_context(|| format!("creating data dir {}", dir.display()))?;
    // The store and the spool hold job specs, env and output: owner only.
    let meta = std::fs::metadata(dir).with_context(|| format!("reading data dir {}", dir.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making data dir {} private (0700)", dir.display()))?;
    }
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a file descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        bail!("data dir {} is in use by another gnomon process", dir.display());
    }
    Ok(DirLock { _file: file })
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
    let run_as = args.jobs.resolve(true, exposed.as_deref())?;
    let cgroups = worker.isolation.cgroups.clone();
    worker.isolation =
        Arc::new(gnomon_worker::isolation::Isolation { work_root: Some(args.data_dir.join("worker-work")), run_as, cgroups });
    let _lock = lock_data_dir(&args.data_dir)?;
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
    let auth = args.access.authenticator(token.as_deref(), worker.as_mut())?;
    let listen = args.access.listen_config()?;
    gnomon_server::auth::check_listen(&addr, auth.enabled(), listen.tls.is_some(), args.insecure).map_err(|e| anyhow!(e))?;
    let store_kind = store_kind(&args.store.store)?;
    // A raft member is reached at its --raft-peers address.
    let raft_addr = match (store_kind, &args.raft.raft_peers, args.raft.raft_id) {
        ("raft", Some(p), Some(id)) => crate::raft_member::parse_peers(p)?.get(&id).cloned(),
        _ => None,
    };
    let advertise = args.advertise.clone().or(raft_addr).unwrap_or_else(|| addr.to_string());
    let config = args.leader.node_config(node_id.clone(), advertise.clone(), if store_kind == "etcd" { "15s" } else { "10s" })?;
    let hosts = args.access.hosts(&advertise, auth.enabled())?;
    if let Some(w) = worker.as_mut() {
        w.tls = args.access.embedded_worker_tls(ca.as_deref());
        let exposed = "the store's files or credentials where this process can read them (a --config file, \
             the SQLite or raft data dir), the files it reads (--token-file, --auth-file, TLS keys) and its processes";
        let run_as = args.jobs.resolve(true, Some(exposed))?;
        let cgroups = w.isolation.cgroups.clone();
        w.isolation = Arc::new(gnomon_worker::isolation::Isolation { work_root: None, run_as, cgroups });
    } else if args.jobs.run_as.is_some() {
        bail!("--run-as applies to the embedded worker: give --capacity N too");
    }
    if store_kind == "raft" {
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
        "etcd" => Some(gnomon_backend::etcd::parse_url(&args.store.store).map_err(|e| anyhow!("--store: {e}"))?),
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
            if store_kind != "sqlite" {
                tracing::warn!(backend = store_kind, "--single-server: the local elector leads unconditionally on this shared store");
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
fn store_kind(url: &str) -> anyhow::Result<&'static str> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    Ok(match scheme {
        "sqlite" => "sqlite",
        "mysql" | "mariadb" => "mysql",
        "postgres" | "postgresql" => "postgres",
        "etcd" => "etcd",
        "raft" => "raft",
        _ => bail!("--store {:?} must start with sqlite://, mysql://, postgres://, etcd:// or raft://", without_credentials(url)),
    })
}

/// The embedded worker of `dev` / `server --capacity N`.
fn embedded_worker(node_id: &str, capacity: u32, spool_dir: Option<PathBuf>) -> WorkerConfig {
    let mut w = WorkerConfig::new(format!("{node_id}-worker"), vec![]);
    w.capacity = capacity;
    w.prefetch = gnomon_worker::session::default_prefetch(capacity);
    w.spool_dir = spool_dir;
    w.drain_timeout = std::time::Duration::from_secs(5);
    w.isolation = Arc::new(gnomon_worker::isolation::Isolation { work_root: None, run_as: None, cgroups: embedded_cgroups() });
    w
}

async fn run_node(
    config: NodeConfig,
    store: Arc<dyn gnomon_backend::Store>,
    elector: Arc<dyn Elector>,
    addr: SocketAddr,
    (auth, hosts, listen, ca): (Authenticator, HostPolicy, ListenConfig, Option<&Path>),
    embedded_worker: Option<WorkerConfig>,
    raft: Option<gnomon_backend::raft::Service>,
) -> anyhow::Result<()> {
    let metrics = gnomon_server::metrics_setup::install();
    let resign_first = elector.backend() != "local";
    let node = Node::new(config, store, elector, Arc::new(gnomon_core::SystemClock));
    let _reloader = auth.spawn_reloader(Duration::from_secs(1));
    let forward = match (&listen.tls, ca) {
        (None, _) => gnomon_server::api::forward::Forwarder::plain(),
        (Some(_), ca) => {
            let pem = ca.map(|p| std::fs::read(p).with_context(|| format!("reading --ca {}", p.display()))).transpose()?;
            gnomon_server::api::forward::Forwarder::tls(pem.as_deref()).map_err(|e| anyhow!(e))?
        }
    };
    let state =
        ApiState { node: node.handle.clone(), metrics, auth, hosts: Arc::new(hosts), ready: Arc::default(), raft, forward: Some(forward) };
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    let scheme = if listen.tls.is_some() { "https" } else { "http" };
    tracing::info!("gnomon listening on {scheme}://{local} (console at {scheme}://{local}/, workers connect here too)");
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let node_task = tokio::spawn(node.run(shutdown_rx));
    let (http_stop_tx, http_shutdown) = tokio::sync::watch::channel(false);
    let server_task = tokio::spawn(gnomon_server::listener::serve(listener, router(state), listen, http_shutdown, Duration::from_secs(5)));
    // The embedded worker speaks the same protocol as `gnomon worker`, over
    // loopback to this listener: one code path for both.
    let (worker_stop_tx, worker_stop_rx) = tokio::sync::watch::channel(false);
    let worker_task = embedded_worker.map(|mut w| {
        w.servers = vec![local.to_string()];
        let drain = w.drain_timeout;
        (tokio::spawn(WorkerRuntime::new(w, HandlerRegistry::with_builtins()).run(worker_stop_rx)), drain)
    });
    wait_for_signal().await;
    // With an HA elector: resign first, so another replica
    // takes over within about a second, then drain (workers connected here
    // are answered NotLeader and follow the new leader). The local elector
    // has nobody to hand over to: drain first, so the embedded worker's
    // last results still reach this leader.
    let drain = |task: Option<(tokio::task::JoinHandle<()>, Duration)>| async move {
        if let Some((task, drain)) = task {
            let _ = tokio::time::timeout(drain + Duration::from_secs(6), task).await;
        }
    };
    if resign_first {
        tracing::info!("shutting down: resigning leadership, then draining");
        let _ = shutdown_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), node_task).await;
        let _ = worker_stop_tx.send(true);
        drain(worker_task).await;
    } else {
        tracing::info!("shutting down: draining the embedded worker, then resigning");
        let _ = worker_stop_tx.send(true);
        drain(worker_task).await;
        let _ = shutdown_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), node_task).await;
    }
    let _ = http_stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), server_task).await;
    Ok(())
}

/// `gnomon worker`: runs attempts for the leader among `servers`.
pub async fn worker(args: WorkerArgs, servers: &str, token: Option<String>, ca: Option<PathBuf>) -> anyhow::Result<()> {
    init_tracing();
    let list: Vec<&str> = servers.split(',').map(|s| s.trim().trim_end_matches('/')).filter(|s| !s.is_empty()).collect();
    if list.is_empty() {
        bail!("--server needs at least one address (host:port, comma-separated)");
    }
    if token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        bail!("--token (GNOMON_TOKEN) is empty; give the worker credential, or leave it unset for a server without credentials");
    }
    let https = list.iter().filter(|s| s.starts_with("https://")).count();
    if https != 0 && https != list.len() {
        bail!("--server: use https:// for every server or for none");
    }
    let servers: Vec<String> = list.iter().map(|s| s.trim_start_matches("https://").trim_start_matches("http://").to_string()).collect();
    for s in &servers {
        if s.contains("://") || !s.contains(':') {
            bail!("--server {s:?} must be host:port (or http://host:port, https://host:port)");
        }
    }
    if https == 0 && (ca.is_some() || args.tls_cert.is_some()) {
        bail!("--ca and --tls-cert apply to https:// servers");
    }
    check_capacity(args.capacity)?;
    let mut labels = std::collections::BTreeMap::new();
    for l in &args.labels {
        let (k, v) = l.split_once('=').ok_or_else(|| anyhow!("--label {l:?} must be key=value"))?;
        if k.is_empty() {
            bail!("--label {l:?} has an empty key");
        }
        labels.insert(k.to_string(), v.to_string());
    }
    let drain = gnomon_core::duration::parse_duration(&args.drain_timeout).map_err(|e| anyhow!("--drain-timeout: {e}"))?;
    let shell = args.executors.is_empty() || args.executors.iter().any(|k| k == "shell");
    let exposed = format!(
        "its data dir {} (the spool, other attempts' working directories), the files it reads (TLS keys, a --config file{}) \
         and its processes",
        args.data_dir.display(),
        if token.as_deref().is_some_and(|t| !t.is_empty()) { " that may hold its token" } else { "" }
    );
    let run_as = args.jobs.resolve(shell, Some(&exposed))?;
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("creating {}", args.data_dir.display()))?;
    let _lock = lock_data_dir(&args.data_dir)?;
    let id = match args.id {
        Some(id) => id,
        None => {
            let path = args.data_dir.join("worker-id");
            match std::fs::read_to_string(&path) {
                Ok(id) if !id.trim().is_empty() => id.trim().to_string(),
                _ => {
                    let id = format!("{}-{:06x}", default_node_id().split('-').next().unwrap_or("worker"), rand_suffix());
                    std::fs::write(&path, &id).with_context(|| format!("writing {}", path.display()))?;
                    id
                }
            }
        }
    };
    let prefetch = args.prefetch.unwrap_or_else(|| gnomon_worker::session::default_prefetch(args.capacity));
    if prefetch > gnomon_worker::session::MAX_PREFETCH {
        bail!("--prefetch {prefetch} is over the limit of {}", gnomon_worker::session::MAX_PREFETCH);
    }
    let mut config = WorkerConfig::new(id.clone(), servers);
    config.capacity = args.capacity;
    config.prefetch = prefetch;
    config.labels = labels;
    config.spool_dir = Some(args.data_dir.join("spool"));
    config.drain_timeout = drain;
    config.token = token;
    config.executors = args.executors.clone();
    let cgroups = gnomon_worker::cgroup::Cgroups::shared(args.cgroups).map_err(|e| anyhow!(e))?;
    config.isolation = Arc::new(gnomon_worker::isolation::Isolation { work_root: Some(args.data_dir.join("work")), run_as, cgroups });
    let mut egress =
        if args.allow_link_local { gnomon_worker::egress::Egress::default() } else { gnomon_worker::egress::Egress::with_defaults() };
    for c in &args.deny_cidrs {
        egress.denied.push(gnomon_worker::egress::Egress::parse_cidr(c).map_err(|e| anyhow!(e))?);
    }
    egress.proxy = args.http_proxy.as_deref().map(gnomon_worker::egress::Egress::parse_proxy).transpose().map_err(|e| anyhow!(e))?;
    config.egress = egress;
    if https > 0 {
        let identity = match (&args.tls_cert, &args.tls_key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            _ => None,
        };
        config.tls = Some(WorkerTls { ca, identity, pin: None });
    }
    tracing::info!(worker = %id, capacity = args.capacity, "gnomon worker starting");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(WorkerRuntime::new(config, HandlerRegistry::with_builtins()).run(stop_rx));
    wait_for_signal().await;
    tracing::info!("SIGTERM: draining");
    let _ = stop_tx.send(true);
    let _ = task.await;
    Ok(())
}

fn rand_suffix() -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    (t ^ std::process::id().rotate_left(12)) & 0xff_ffff
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// `--capacity`: at least 1, at most what the server accepts in a Hello.
fn check_capacity(capacity: u32) -> anyhow::Result<()> {
    if capacity == 0 {
        bail!("--capacity must be at least 1");
    }
    if capacity > gnomon_worker::session::MAX_CAPACITY {
        bail!("--capacity {capacity} is over the limit of {}", gnomon_worker::session::MAX_CAPACITY);
    }
    Ok(())
}
