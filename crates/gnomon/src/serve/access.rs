//! Who may call a server (`AccessArgs`: credentials, TLS, hosts,
//! connection limits) and which user its shell jobs run as (`JobUserArgs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail};
use clap::Args;
use gnomon_server::auth::{AuthConfig, Authenticator, Principal, Role};
use gnomon_server::browser::HostPolicy;
use gnomon_server::listener::{ListenConfig, TlsFiles};
use gnomon_worker::isolation::{JobUsers, RunAs, UidAllocator, UidRange};
use gnomon_worker::{WorkerConfig, WorkerTls};

/// Who may call the server, shared by `dev` and `server`.
#[derive(Args, Debug)]
pub struct AccessArgs {
    /// A file holding one admin token (re-read when it changes).
    #[arg(long, env = "GNOMON_TOKEN_FILE")]
    pub(super) token_file: Option<PathBuf>,
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
    /// A connection must start its first request (TLS handshake included)
    /// within this, and an HTTP/1 request's headers must arrive within it.
    #[arg(long, default_value = "10s", value_name = "DURATION", env = "GNOMON_HEADER_READ_TIMEOUT",
          value_parser = crate::leader_args::duration_arg)]
    header_read_timeout: String,
    /// A connection with no request in flight this long is closed (worker
    /// sessions and raft streams count as in flight while they last).
    #[arg(long, default_value = "30s", value_name = "DURATION", env = "GNOMON_IDLE_TIMEOUT",
          value_parser = crate::leader_args::duration_arg)]
    idle_timeout: String,
    /// An API request's body must arrive whole within this of the request's
    /// start (408 otherwise).
    #[arg(long, default_value = "30s", value_name = "DURATION", env = "GNOMON_BODY_TIMEOUT",
          value_parser = crate::leader_args::duration_arg)]
    body_timeout: String,
    /// Most memory the bodies of webhook calls whose signature is not yet
    /// checked may take together (each call counts its declared length, at
    /// most 64 KiB). Past it a call is answered 503 `webhooks_busy`, unread.
    #[arg(long, default_value = "16MiB", value_name = "BYTES", env = "GNOMON_WEBHOOK_BODY_MEMORY")]
    webhook_body_memory: String,
}

impl AccessArgs {
    /// The credentials in force, with an embedded worker's own when there is
    /// one. The embedded worker never holds the admin token: with `--token`
    /// it uses the worker credential every server derives from that token
    /// (so it can follow the leader to another server); otherwise a worker
    /// credential made here for its own id, valid on this server only.
    pub(super) fn authenticator(&self, token: Option<&str>, embedded_worker: Option<&mut WorkerConfig>) -> anyhow::Result<Authenticator> {
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
    pub(super) fn listen_config(&self) -> anyhow::Result<ListenConfig> {
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
        let deadline = |flag: &str, text: &str| -> anyhow::Result<std::time::Duration> {
            let d = gnomon_core::duration::parse_duration(text).map_err(|e| anyhow!("--{flag}: {e}"))?;
            if !(std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(3600)).contains(&d) {
                bail!("--{flag} must be between 1s and 1h");
            }
            Ok(d)
        };
        Ok(ListenConfig {
            max_connections: self.max_connections,
            max_connections_per_client: self.max_connections_per_client,
            header_read_timeout: deadline("header-read-timeout", &self.header_read_timeout)?,
            idle_timeout: deadline("idle-timeout", &self.idle_timeout)?,
            body_timeout: deadline("body-timeout", &self.body_timeout)?,
            unproven_body_memory: self.unproven_body_memory()?,
            tls,
        })
    }

    /// `--webhook-body-memory`: room for at least one whole webhook body,
    /// at most 1 GiB.
    fn unproven_body_memory(&self) -> anyhow::Result<usize> {
        let text = &self.webhook_body_memory;
        let bytes = gnomon_core::spec::parse_bytes(text).map_err(|e| anyhow!("--webhook-body-memory: {e}"))?;
        let (least, most) = (gnomon_core::triggers::MAX_PAYLOAD_BYTES as u64, 1u64 << 30);
        if !(least..=most).contains(&bytes) {
            bail!("--webhook-body-memory must be between 64KiB (one whole webhook body) and 1GiB, not {text}");
        }
        Ok(bytes as usize)
    }

    /// With TLS on, the embedded worker dials its own listener over
    /// loopback and accepts that listener's certificate as is (pinned);
    /// other servers it is sent to are checked against `--ca` (or the
    /// public roots). With `--client-ca` it presents the server's
    /// certificate, which must then allow client authentication.
    pub(super) fn embedded_worker_tls(&self, ca: Option<&Path>) -> Option<WorkerTls> {
        let (cert, key) = (self.tls_cert.clone()?, self.tls_key.clone()?);
        Some(WorkerTls { ca: ca.map(Path::to_path_buf), identity: self.client_ca.as_ref().map(|_| (cert.clone(), key)), pin: Some(cert) })
    }

    /// The Host policy; `credentials`: whether any are configured (`*` is
    /// refused without).
    pub(super) fn hosts(&self, advertise: &str, credentials: bool) -> anyhow::Result<HostPolicy> {
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
    /// Every namespace's jobs share the user: --run-as-range keeps them apart.
    #[arg(long, value_name = "USER", env = "GNOMON_RUN_AS")]
    pub run_as: Option<String>,
    /// Run each namespace's shell jobs as a uid of its own from this range
    /// (this process must run as root). A namespace gets the lowest free uid
    /// of the range the first time it runs a job here and keeps it (recorded
    /// in uids.json in the data dir); its group is the same id, with no
    /// other groups, and HOME is the attempt's directory. The range must
    /// hold no id of a user or group of /etc/passwd or /etc/group, and no
    /// other worker on this host may use any of it. When every uid is taken,
    /// a new namespace's attempts fail.
    #[arg(long, value_name = "FIRST-LAST", env = "GNOMON_RUN_AS_RANGE", conflicts_with = "run_as", value_parser = parse_run_as_range)]
    pub run_as_range: Option<UidRange>,
    /// Run shell jobs as root when this process runs as root without
    /// --run-as or --run-as-range (refused otherwise): every job can then
    /// do anything on this host.
    #[arg(long, env = "GNOMON_ALLOW_ROOT_JOBS", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_root_jobs: bool,
}

/// `--run-as-range`: `FIRST-LAST` above 0, holding no id of this host's
/// users or groups.
pub fn parse_run_as_range(text: &str) -> Result<UidRange, String> {
    let range = UidRange::parse(text)?;
    range.check_host()?;
    Ok(range)
}

/// Which users shell jobs run as, checked, before anything is opened.
#[derive(Debug)]
pub enum JobUserPlan {
    Own,
    One(RunAs),
    /// A uid per namespace from the range, allocated in the data dir.
    PerNamespace(UidRange),
}

impl JobUserPlan {
    /// The users, with a namespace's uids kept in `data_dir` (which this
    /// process has locked; a server's embedded worker has one only with
    /// --worker-data-dir).
    pub(super) fn open(self, data_dir: Option<&Path>) -> anyhow::Result<JobUsers> {
        Ok(match self {
            JobUserPlan::Own => JobUsers::Own,
            JobUserPlan::One(u) => JobUsers::One(u),
            JobUserPlan::PerNamespace(range) => {
                let Some(data_dir) = data_dir else {
                    bail!(
                        "--run-as-range keeps the namespaces' uids in the embedded worker's data dir: give --worker-data-dir DIR \
                         (a directory of its own, for example /var/lib/gnomon/worker)"
                    )
                };
                let alloc = UidAllocator::open(data_dir, range).map_err(|e| anyhow!("--run-as-range {range}: {e}"))?;
                tracing::info!(
                    range = %range,
                    namespaces = alloc.allocations().len(),
                    file = %alloc.file().display(),
                    "each namespace's shell jobs run as a uid of its own"
                );
                JobUsers::PerNamespace(Arc::new(alloc))
            }
        })
    }
}

impl JobUserArgs {
    /// Which users shell jobs run as, checked before anything is created:
    /// `--run-as` looked up; `--run-as-range` needs root; without either, a
    /// root process refuses to start unless `--allow-root-jobs`, and any
    /// other warns (when `exposed` says what a job could reach) that its
    /// jobs run as its own user.
    pub(super) fn resolve(&self, shell: bool, exposed: Option<&str>) -> anyhow::Result<JobUserPlan> {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if let Some(range) = self.run_as_range {
            if euid != 0 {
                bail!("--run-as-range {range}: only a process running as root can run jobs as other users (this one is uid {euid})");
            }
            return Ok(JobUserPlan::PerNamespace(range));
        }
        if let Some(u) = &self.run_as {
            let user = RunAs::lookup(u).map_err(|e| anyhow!(e))?;
            tracing::info!(user = %user.name, uid = user.uid, "shell jobs run as {}", user.name);
            return Ok(JobUserPlan::One(user));
        }
        if !shell {
            return Ok(JobUserPlan::Own);
        }
        if euid == 0 {
            if !self.allow_root_jobs {
                bail!(
                    "refusing to run shell jobs as root: every job could do anything on this host. \
                     Pass --run-as USER to run them as an unprivileged user (for example --run-as nobody), \
                     --run-as-range FIRST-LAST to run each namespace's as a uid of its own, \
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
        Ok(JobUserPlan::Own)
    }

    /// Whether a user switch was asked for (`--run-as` or `--run-as-range`).
    pub(super) fn given(&self) -> bool {
        self.run_as.is_some() || self.run_as_range.is_some()
    }
}
