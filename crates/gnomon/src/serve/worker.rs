//! `gnomon worker`: its flags and its start.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use gnomon_worker::{HandlerRegistry, WorkerConfig, WorkerRuntime, WorkerTls};

use super::access::JobUserArgs;
use super::process::{default_node_id, init_tracing, lock_data_dir, wait_for_signal};

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
    /// Keeps the worker id, the spool of unacknowledged reports, the
    /// attempts' working directories (`work/`) and, with --run-as-range,
    /// the namespaces' uids (`uids.json`).
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
    let users = args.jobs.resolve(shell, Some(&exposed))?;
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("creating {}", args.data_dir.display()))?;
    let _lock = lock_data_dir(&args.data_dir)?;
    let users = users.open(Some(&args.data_dir))?;
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
    config.isolation =
        Arc::new(gnomon_worker::isolation::Isolation::new(Some(args.data_dir.join("work")), users, cgroups).map_err(|e| anyhow!(e))?);
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

/// `--capacity`: at least 1, at most what the server accepts in a Hello.
pub(super) fn check_capacity(capacity: u32) -> anyhow::Result<()> {
    if capacity == 0 {
        bail!("--capacity must be at least 1");
    }
    if capacity > gnomon_worker::session::MAX_CAPACITY {
        bail!("--capacity {capacity} is over the limit of {}", gnomon_worker::session::MAX_CAPACITY);
    }
    Ok(())
}
