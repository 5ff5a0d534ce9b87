//! `gnomon doctor`: the checks a server and a worker make when they start,
//! run on demand against a store, an etcd cluster, a listener address and
//! the servers a worker would use; one line each, exit code 0 or 1.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use gnomon_backend::election::ElectionConfig;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The store to check (opening it applies its pending migrations, as a
    /// server does).
    #[arg(long, env = "GNOMON_STORE")]
    store: Option<String>,
    /// etcd endpoints to check: host:2379,host:2379,…
    #[arg(long, env = "GNOMON_ETCD")]
    etcd: Option<String>,
    /// TLS to the --etcd members: the CA that signed their certificates.
    #[arg(long, env = "GNOMON_ETCD_CA", requires = "etcd")]
    etcd_ca: Option<std::path::PathBuf>,
    /// TLS client certificate for --etcd (with --etcd-key).
    #[arg(long, env = "GNOMON_ETCD_CERT", requires_all = ["etcd_ca", "etcd_key"])]
    etcd_cert: Option<std::path::PathBuf>,
    /// TLS client key for --etcd.
    #[arg(long, env = "GNOMON_ETCD_KEY", requires_all = ["etcd_ca", "etcd_cert"])]
    etcd_key: Option<std::path::PathBuf>,
    /// The address a server would listen on.
    #[arg(long, env = "GNOMON_LISTEN")]
    listen: Option<String>,
    /// With --listen: the credentials and TLS a server there would have.
    #[arg(long, env = "GNOMON_AUTH_FILE")]
    auth_file: Option<std::path::PathBuf>,
    /// With --listen: as the server's --token-file (credentials are set).
    #[arg(long, env = "GNOMON_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,
    /// With --listen: as the server's --tls-cert (the listener has TLS).
    #[arg(long, env = "GNOMON_TLS_CERT")]
    tls_cert: Option<std::path::PathBuf>,
    /// With --listen: as the server's --insecure (a public listener
    /// without credentials or TLS is accepted).
    #[arg(long, env = "GNOMON_INSECURE")]
    insecure: bool,
    /// Check the servers in --server as a worker reaches them (health, the
    /// leader they report, whether they agree).
    #[arg(long)]
    workers_view: bool,
    /// The user a worker here would run shell jobs as (checked: it must
    /// exist, and this must run as root to switch to it).
    #[arg(long, value_name = "USER", env = "GNOMON_RUN_AS")]
    run_as: Option<String>,
    /// The uid range a worker here would run each namespace's shell jobs
    /// in (checked: no id of a user or group of this host, and this must
    /// run as root).
    #[arg(long, value_name = "FIRST-LAST", env = "GNOMON_RUN_AS_RANGE", conflicts_with = "run_as",
          value_parser = crate::serve::parse_run_as_range)]
    run_as_range: Option<gnomon_worker::isolation::UidRange>,
    /// As a worker's --allow-root-jobs: root jobs are accepted.
    #[arg(long, env = "GNOMON_ALLOW_ROOT_JOBS", value_parser = clap::builder::BoolishValueParser::new())]
    allow_root_jobs: bool,
}

struct Report {
    failed: usize,
    warned: usize,
}

impl Report {
    fn warn(&mut self, what: impl std::fmt::Display) {
        self.warned += 1;
        println!("WARN  {what}");
    }
    fn ok(&mut self, what: impl std::fmt::Display) {
        println!("ok    {what}");
    }
    fn fail(&mut self, what: impl std::fmt::Display) {
        self.failed += 1;
        println!("FAIL  {what}");
    }
    fn check<T, E: std::fmt::Display>(&mut self, what: &str, r: Result<T, E>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.fail(format!("{what}: {e}"));
                None
            }
        }
    }
}

pub async fn run(args: DoctorArgs, server: &str, token: Option<&str>, ca: Option<&std::path::Path>) -> anyhow::Result<()> {
    let mut r = Report { failed: 0, warned: 0 };
    if args.store.is_none() && args.etcd.is_none() && args.listen.is_none() && !args.workers_view {
        anyhow::bail!("nothing to check: give --store, --etcd, --listen or --workers-view (or set them in --config's [server])");
    }
    if let Some(listen) = &args.listen {
        let authenticated = token.is_some() || args.auth_file.is_some() || args.token_file.is_some();
        listener(&mut r, listen, authenticated, args.tls_cert.is_some(), args.insecure);
    }
    if let Some(url) = &args.store {
        store(&mut r, url).await;
    }
    if let Some(endpoints) = &args.etcd {
        let tls =
            args.etcd_ca.clone().map(|ca| gnomon_backend::etcd::EtcdTls { ca, cert: args.etcd_cert.clone(), key: args.etcd_key.clone() });
        etcd(&mut r, endpoints, tls).await;
    }
    if args.workers_view {
        servers(&mut r, server, token, ca).await;
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    match args.run_as_range {
        Some(range) if root => r.ok(format!(
            "each namespace's shell jobs would run as a uid of its own from {range} ({} uids, none of a user or group here)",
            range.len()
        )),
        Some(range) => r.fail(format!("--run-as-range {range}: only a worker running as root can run jobs as other users")),
        None => jobs_user(&mut r, args.run_as.as_deref(), args.allow_root_jobs),
    }
    if r.failed > 0 {
        println!("{} check(s) failed", r.failed);
        std::process::exit(1);
    }
    match r.warned {
        0 => println!("all checks passed"),
        n => println!("all checks passed, with {n} warning(s)"),
    }
    Ok(())
}

fn listener(r: &mut Report, listen: &str, authenticated: bool, tls: bool, insecure: bool) {
    let Some(addr) = r.check(&format!("listen address {listen:?}"), listen.parse::<SocketAddr>()) else { return };
    match std::net::TcpListener::bind(addr) {
        Ok(_) => r.ok(format!("{addr} is free to listen on")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => r.ok(format!("{addr} is in use (a server running here?)")),
        Err(e) => r.fail(format!("cannot listen on {addr}: {e}")),
    }
    match gnomon_server::auth::check_listen(&addr, authenticated, tls, insecure) {
        Ok(()) if addr.ip().is_loopback() => r.ok(format!("{addr} is loopback: reachable from this host only")),
        Ok(()) => r.ok(format!("{addr} is not loopback, and a server there would have what that needs")),
        Err(e) => r.fail(e),
    }
}

/// Which user a worker started here (as this user) would run shell jobs as.
fn jobs_user(r: &mut Report, run_as: Option<&str>, allow_root_jobs: bool) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    match run_as {
        Some(u) => match gnomon_worker::isolation::RunAs::lookup(u) {
            Ok(user) => r.ok(format!(
                "shell jobs would run as {} (uid {}), out of reach of the data dir and the process's memory",
                user.name, user.uid
            )),
            Err(e) => r.fail(e),
        },
        None if euid == 0 && !allow_root_jobs => r.warn(
            "running as root without --run-as: a worker (or a server with an embedded worker, or dev) started so refuses \
             to run shell jobs; pass --run-as USER (or --allow-root-jobs to accept root jobs)",
        ),
        None if euid == 0 => r.warn("shell jobs would run as root (--allow-root-jobs): every job can do anything on this host"),
        None => r.warn(format!(
            "shell jobs would run as this user (uid {euid}) and could reach what it can (data dir, token and key files, \
             configuration); run as root with --run-as USER to run them as another user"
        )),
    }
}

async fn store(r: &mut Report, url: &str) {
    let shown = crate::config::redact("store", url);
    let opened = tokio::time::timeout(Duration::from_secs(15), gnomon_backend::open_store(url)).await;
    let store = match opened {
        Err(_) => return r.fail(format!("store {shown}: no answer within 15 s")),
        Ok(Err(e)) => return r.fail(format!("store {shown}: {e}")),
        Ok(Ok(s)) => s,
    };
    r.ok(format!("store {shown} opens, its schema is current and this user has every privilege gnomon uses"));
    match gnomon_backend::electors::lock_elector_for(url, store.clone(), ElectionConfig::default()).await {
        Ok(Some(_)) => r.ok("the store's election lock can be taken and released"),
        Ok(None) => {}
        Err(e) => r.fail(format!("election lock: {e}")),
    }
    match store.leadership(gnomon_server::node::SCOPE).await {
        Ok(Some(l)) => r.ok(format!(
            "leadership record: {} (token {}, {} election) since {}",
            l.holder,
            l.token,
            l.backend,
            gnomon_core::format_millis(l.since)
        )),
        Ok(None) => r.ok("no leader has been recorded in this store yet"),
        Err(e) => r.fail(format!("reading the leadership record: {e}")),
    }
    if let Some(bytes) = store.size_bytes().await {
        r.ok(format!("store size {:.1} MiB", bytes as f64 / 1048576.0));
    }
}

async fn etcd(r: &mut Report, endpoints: &str, tls: Option<gnomon_backend::etcd::EtcdTls>) {
    let Some(list) = r.check(&format!("etcd endpoints {endpoints:?}"), gnomon_backend::etcd::parse_endpoints(endpoints)) else { return };
    let target = gnomon_backend::etcd::EtcdTarget { endpoints: list.clone(), user: None, tls };
    let client = match gnomon_backend::etcd::connect_target(&target, Duration::from_secs(5)).await {
        Ok(c) => c,
        Err(e) => return r.fail(format!("etcd {endpoints}: {e}")),
    };
    r.ok(format!("etcd {endpoints}: a quorum answers"));
    let mut c = client.clone();
    match tokio::time::timeout(Duration::from_secs(5), c.member_list()).await {
        Ok(Ok(m)) => r.ok(format!("etcd has {} members", m.members().len())),
        Ok(Err(e)) => r.fail(format!("etcd member list: {e}")),
        Err(_) => r.fail("etcd member list: no answer within 5 s"),
    }
    for endpoint in list {
        let one = gnomon_backend::etcd::EtcdTarget { endpoints: vec![endpoint.clone()], ..target.clone() };
        match gnomon_backend::etcd::connect_target(&one, Duration::from_secs(3)).await {
            Ok(mut c) => match tokio::time::timeout(Duration::from_secs(3), c.status()).await {
                Ok(Ok(s)) => r.ok(format!("etcd member {endpoint}: version {}, raft term {}", s.version(), s.raft_term())),
                Ok(Err(e)) => r.fail(format!("etcd member {endpoint}: {e}")),
                Err(_) => r.fail(format!("etcd member {endpoint}: no answer within 3 s")),
            },
            Err(e) => r.fail(format!("etcd member {endpoint}: {e}")),
        }
    }
}

async fn servers(r: &mut Report, server: &str, token: Option<&str>, ca: Option<&std::path::Path>) {
    let mut leaders = std::collections::BTreeSet::new();
    for s in server.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let base = if s.starts_with("http://") || s.starts_with("https://") { s.to_string() } else { format!("http://{s}") };
        let Some(c) = r.check(&format!("server {base}"), crate::client::Client::new(&base, token, ca)) else { continue };
        match c.get::<gnomon_api::Leader>("/v1/leader", &[]).await {
            Ok(l) => {
                let holder = l.holder.clone().unwrap_or_else(|| "none".into());
                r.ok(format!(
                    "server {base} ({}) answers; leader {holder}, token {}",
                    l.answered_by,
                    l.token.map(|t| t.to_string()).unwrap_or("-".into())
                ));
                if let Some(v) = l.clock.verdict.filter(|v| v != "ok") {
                    r.fail(format!("server {base}: its clock is {v} ({} ms from the leader time)", l.clock.skew_ms.unwrap_or(0)));
                }
                leaders.insert(holder);
            }
            Err(e) => r.fail(format!("server {base}: {e:#}")),
        }
    }
    match leaders.len() {
        0 => {}
        1 if leaders.contains("none") => r.fail("no server reports a leader"),
        1 => r.ok("every server reports the same leader"),
        _ => r.fail(format!("the servers disagree on the leader: {}", leaders.into_iter().collect::<Vec<_>>().join(", "))),
    }
}
