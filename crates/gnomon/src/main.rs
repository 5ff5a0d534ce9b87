//! The `gnomon` binary: `dev`, `server`, and the client commands.

mod auth_cmd;
mod client;
mod leader_args;
mod raft_member;
mod serve;
mod table;

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// jemalloc instead of glibc malloc: with many threads glibc keeps one arena
/// per thread and a 100,000-job server fragments to about 40 % more RSS.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc options: return freed memory to the OS within about a second
/// (from a background thread) instead of keeping dirty pages for 10 s, with
/// two arenas (one per core here) so fewer partly-used pages are held.
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = b"background_thread:true,narenas:2,dirty_decay_ms:250,muzzy_decay_ms:0\0";

#[derive(Parser, Debug)]
#[command(name = "gnomon", version, about = "A fenced, exactly-once-firing distributed job scheduler")]
struct Cli {
    /// Server URL for client commands.
    #[arg(long, global = true, env = "GNOMON_SERVER", default_value = "http://127.0.0.1:7400")]
    server: String,
    /// Bearer token (client commands send it; dev/server require it).
    #[arg(long, global = true, env = "GNOMON_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA certificate (PEM) to trust for https:// servers (default: the
    /// public web roots). Client commands and `gnomon worker` use it.
    #[arg(long, global = true, env = "GNOMON_CA")]
    ca: Option<PathBuf>,
    /// Output format of client commands.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One process: server, embedded worker, SQLite store, local election.
    Dev(serve::DevArgs),
    /// A server replica (leader candidate) on a shared store.
    Server(Box<serve::ServerArgs>),
    /// Apply the store's migrations and exit (servers also apply them on start).
    Migrate(serve::MigrateArgs),
    /// Manage jobs.
    #[command(subcommand)]
    Job(JobCmd),
    /// Inspect and cancel runs.
    #[command(subcommand)]
    Run(RunCmd),
    /// Run a worker for the servers in `--server` (comma-separated
    /// host:port); `gnomon worker list` shows the leader's worker sessions.
    Worker(WorkerCommand),
    /// Show who leads.
    Leader,
    /// The members of a raft:// cluster: status, learners, promotion, removal.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Make credentials for --auth-file.
    #[command(subcommand)]
    Auth(auth_cmd::AuthCmd),
}

#[derive(Subcommand, Debug)]
enum ClusterCmd {
    /// Every member, its role (voter or learner) and how far it has the log.
    Status,
    /// Add a member that receives the log but does not vote (answers once
    /// it has caught up); start it first with its own --raft-id.
    AddLearner {
        id: u64,
        /// HOST:PORT of the new member's gnomon listener.
        address: String,
    },
    /// Make a learner a voter.
    Promote { id: u64 },
    /// Remove a voter or a learner from the cluster.
    Remove { id: u64 },
}

#[derive(Subcommand, Debug)]
enum JobCmd {
    /// Create a shell job: `gnomon job create NAME --cron EXPR -- CMD ARGS…`.
    Create(CreateArgs),
    /// Create or update jobs from a JSON file (one job or an array); `-` reads stdin.
    Apply {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    List {
        #[arg(long)]
        namespace: Option<String>,
    },
    Get(NameArg),
    Trigger(NameArg),
    Pause(NameArg),
    Resume(NameArg),
    Delete(NameArg),
}

#[derive(Args, Debug)]
struct NameArg {
    name: String,
    #[arg(long)]
    namespace: Option<String>,
}

#[derive(Args, Debug)]
struct CreateArgs {
    name: String,
    /// Cron expression (6 fields with seconds, or 5).
    #[arg(long, group = "sched")]
    cron: Option<String>,
    /// IANA time zone for --cron.
    #[arg(long, requires = "cron")]
    timezone: Option<String>,
    /// Fixed interval, e.g. 10s.
    #[arg(long, group = "sched")]
    every: Option<String>,
    /// One-shot RFC 3339 time.
    #[arg(long, group = "sched")]
    at: Option<String>,
    #[arg(long)]
    timeout: Option<String>,
    #[arg(long)]
    max_attempts: Option<u32>,
    #[arg(long)]
    misfire: Option<String>,
    #[arg(long)]
    overlap: Option<String>,
    #[arg(long)]
    namespace: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum RunCmd {
    List {
        #[arg(long)]
        job: Option<String>,
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        namespace: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[arg(long)]
        cursor: Option<String>,
    },
    Get {
        id: String,
    },
    Cancel {
        id: String,
    },
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
struct WorkerCommand {
    #[command(subcommand)]
    cmd: Option<WorkerCmd>,
    #[command(flatten)]
    run: serve::WorkerArgs,
}

#[derive(Subcommand, Debug)]
enum WorkerCmd {
    /// The leader's worker sessions.
    List,
}

fn main() {
    let cli = Cli::parse();
    let serving = matches!(&cli.command, Command::Dev(_) | Command::Server(_) | Command::Migrate(_))
        || matches!(&cli.command, Command::Worker(w) if w.cmd.is_none());
    if serving {
        // The store, the spool and the credentials' files are the process's
        // own: files it creates are private (jobs keep the usual umask).
        gnomon_worker::isolation::private_files();
    }
    if !serving {
        // Client output piped into `head` ends quietly, like other Unix tools.
        // SAFETY: restoring the default disposition of SIGPIPE at start-up.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(cli)) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let out = cli.output;
    match cli.command {
        Command::Dev(args) => serve::dev(args, cli.token, cli.ca).await,
        Command::Server(args) => serve::server(*args, cli.token, cli.ca).await,
        Command::Migrate(args) => serve::migrate(args).await,
        Command::Auth(cmd) => auth_cmd::run(cmd),
        Command::Worker(WorkerCommand { cmd: None, run }) => serve::worker(run, &cli.server, cli.token, cli.ca).await,
        command => {
            let c = client::Client::new(&cli.server, cli.token.as_deref(), cli.ca.as_deref())?;
            match command {
                Command::Job(cmd) => job(&c, cmd, out).await,
                Command::Run(cmd) => runs(&c, cmd, out).await,
                Command::Worker(WorkerCommand { cmd: Some(WorkerCmd::List), .. }) => table::workers(&c.get("/v1/workers", &[]).await?, out),
                Command::Leader => table::leader(&c.get("/v1/leader", &[]).await?, out),
                Command::Cluster(cmd) => {
                    let v = match cmd {
                        ClusterCmd::Status => c.get("/v1/cluster", &[]).await?,
                        ClusterCmd::AddLearner { id, address } => {
                            c.send("POST", "/v1/cluster/learners", &[], Some(serde_json::json!({"id": id, "address": address}))).await?
                        }
                        ClusterCmd::Promote { id } => c.send("POST", &format!("/v1/cluster/members/{id}/promote"), &[], None).await?,
                        ClusterCmd::Remove { id } => {
                            c.send("DELETE", &format!("/v1/cluster/members/{id}"), &[], None).await?["status"].take()
                        }
                    };
                    table::cluster(&v, out)
                }
                Command::Dev(_)
                | Command::Server(_)
                | Command::Migrate(_)
                | Command::Auth(_)
                | Command::Worker(WorkerCommand { cmd: None, .. }) => {
                    unreachable!("handled above")
                }
            }
        }
    }
}

fn ns_query(ns: &Option<String>) -> Vec<(&'static str, String)> {
    ns.iter().map(|n| ("namespace", n.clone())).collect()
}

async fn job(c: &client::Client, cmd: JobCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        JobCmd::Create(a) => {
            let mut schedule = serde_json::Map::new();
            if let Some(cron) = a.cron {
                schedule.insert("cron".into(), cron.into());
            }
            if let Some(tz) = a.timezone {
                schedule.insert("timezone".into(), tz.into());
            }
            if let Some(every) = a.every {
                schedule.insert("every".into(), every.into());
            }
            if let Some(at) = a.at {
                schedule.insert("at".into(), at.into());
            }
            let Some((command, args)) = a.command.split_first() else { bail!("give the command after `--`") };
            let mut spec = serde_json::json!({
                "name": a.name, "schedule": schedule,
                "executor": {"shell": {"command": command, "args": args}},
            });
            if let Some(ns) = a.namespace {
                spec["namespace"] = ns.into();
            }
            if let Some(t) = a.timeout {
                spec["timeout"] = t.into();
            }
            if let Some(n) = a.max_attempts {
                spec["retry"] = serde_json::json!({"max_attempts": n});
            }
            if let Some(m) = a.misfire {
                spec["misfire"] = m.into();
            }
            if let Some(o) = a.overlap {
                spec["overlap"] = o.into();
            }
            let job = c.send("POST", "/v1/jobs", &[], Some(spec)).await?;
            table::jobs(&serde_json::json!({"jobs": [job]}), out)
        }
        JobCmd::Apply { file } => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading stdin")?
            } else {
                std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?
            };
            let doc: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
            let items = match doc {
                serde_json::Value::Array(items) => items,
                serde_json::Value::Object(ref o) if o.contains_key("jobs") => doc["jobs"].as_array().cloned().unwrap_or_default(),
                other => vec![other],
            };
            let mut applied = Vec::new();
            for item in items {
                let name = item.get("name").and_then(|n| n.as_str()).context("every job needs a \"name\"")?.to_string();
                let ns = item.get("namespace").and_then(|n| n.as_str()).map(str::to_string);
                let path = format!("/v1/jobs/{}", client::path_segment(&name));
                applied.push(c.send("PUT", &path, &ns_query(&ns), Some(item)).await?);
            }
            table::jobs(&serde_json::json!({"jobs": applied}), out)
        }
        JobCmd::List { namespace } => table::jobs(&c.get("/v1/jobs", &ns_query(&namespace)).await?, out),
        JobCmd::Get(n) => {
            table::job_detail(&c.get(&format!("/v1/jobs/{}", client::path_segment(&n.name)), &ns_query(&n.namespace)).await?, out)
        }
        JobCmd::Trigger(n) => table::run_detail(
            &c.send("POST", &format!("/v1/jobs/{}/trigger", client::path_segment(&n.name)), &ns_query(&n.namespace), None).await?,
            out,
        ),
        JobCmd::Pause(n) => table::jobs(
            &serde_json::json!({"jobs": [c.send("POST", &format!("/v1/jobs/{}/pause", client::path_segment(&n.name)), &ns_query(&n.namespace), None).await?]}),
            out,
        ),
        JobCmd::Resume(n) => table::jobs(
            &serde_json::json!({"jobs": [c.send("POST", &format!("/v1/jobs/{}/resume", client::path_segment(&n.name)), &ns_query(&n.namespace), None).await?]}),
            out,
        ),
        JobCmd::Delete(n) => {
            c.send("DELETE", &format!("/v1/jobs/{}", client::path_segment(&n.name)), &ns_query(&n.namespace), None).await?;
            if out == Output::Json {
                println!("{}", serde_json::json!({"deleted": n.name}));
            } else {
                println!("deleted job {}", n.name);
            }
            Ok(())
        }
    }
}

async fn runs(c: &client::Client, cmd: RunCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        RunCmd::List { job, state, namespace, limit, cursor } => {
            let mut q = vec![("limit", limit.to_string())];
            q.extend(job.map(|j| ("job", j)));
            q.extend(state.map(|s| ("state", s)));
            q.extend(namespace.map(|n| ("namespace", n)));
            q.extend(cursor.map(|c| ("cursor", c)));
            table::runs(&c.get("/v1/runs", &q).await?, out)
        }
        RunCmd::Get { id } => table::run_detail(&c.get(&format!("/v1/runs/{}", client::path_segment(&id)), &[]).await?, out),
        RunCmd::Cancel { id } => {
            table::run_detail(&c.send("POST", &format!("/v1/runs/{}/cancel", client::path_segment(&id)), &[], None).await?, out)
        }
    }
}
