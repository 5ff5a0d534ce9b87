//! The `gnomon` binary: `dev`, `server`, and the client commands.

// Doc comments here are the CLI's help text (clap), not rustdoc: brackets
// such as "[server]" or "<cluster>" are words, not links or tags.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

mod auth_cmd;
mod backfill;
mod client;
mod commands;
mod config;
mod doctor;
mod hardening;
mod job_flags;
mod leader_args;
mod raft_member;
mod serve;
mod table;

use std::path::PathBuf;

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
    /// A TOML file of settings (a table per command: [server], [dev],
    /// [worker]); environment variables and flags override it.
    #[arg(long, global = true, env = "GNOMON_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// How servers and workers write their log lines (`GNOMON_LOG` sets
    /// what is logged).
    #[arg(long, global = true, value_enum, env = "GNOMON_LOG_FORMAT", default_value_t = serve::LogFormat::Text)]
    log_format: serve::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// Aligned columns for people.
    Table,
    /// The API's answer, pretty-printed.
    Json,
    /// One JSON object a line (a list's items one per line).
    Jsonl,
    /// The API's answer as YAML.
    Yaml,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One process: server, embedded worker, SQLite store, local election.
    Dev(Box<serve::DevArgs>),
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
    /// Follow, list and cancel backfills (`gnomon job backfill` starts one).
    #[command(subcommand)]
    Backfill(backfill::BackfillCmd),
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
    /// Print a shell completion script: `gnomon completions bash >
    /// /etc/bash_completion.d/gnomon` (or zsh, fish, elvish, powershell).
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `gnomon man > gnomon.1; man ./gnomon.1`.
    Man,
    /// The configuration: file, environment and flags.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Check a store, an etcd cluster, a listen address and the servers a
    /// worker would use, one line each (exit code 1 when a check fails).
    Doctor(doctor::DoctorArgs),
}

#[derive(Subcommand, Debug)]
enum ConfigCmd {
    /// The effective settings of a command and where each comes from
    /// (flag, env, file, default), secrets hidden: `gnomon --config
    /// gnomon.toml config show server -- --retain-for 1d`.
    Show {
        /// server, dev or worker.
        command: String,
        /// Flags as the command would be given them (after `--`).
        #[arg(last = true)]
        flags: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCmd {
    /// Every member, its role (voter or learner) and how far it has the log.
    Status,
    /// Add a member that receives the log but does not vote (answers once
    /// it has caught up); start it first with its own --raft-id.
    AddLearner {
        /// The new member's id (not used by any member yet).
        id: u64,
        /// HOST:PORT of the new member's gnomon listener.
        address: String,
    },
    /// Make a learner a voter.
    Promote {
        /// The learner's member id.
        id: u64,
    },
    /// Remove a voter or a learner from the cluster.
    Remove {
        /// The member's id.
        id: u64,
    },
}

#[derive(Subcommand, Debug)]
enum JobCmd {
    /// Create a shell job: `gnomon job create NAME --cron EXPR -- CMD ARGS…`;
    /// `--after` puts it in a pipeline, `--param` declares its params and
    /// `--webhook-secret` lets signed webhook calls start it.
    #[command(after_help = "Examples:\n  \
        gnomon job create extract --cron '0 0 2 * * *' --param day=today -- /opt/etl/extract\n  \
        gnomon job create transform --after extract -- /opt/etl/transform\n  \
        gnomon job create cleanup --after extract:failed --after transform:any -- /opt/etl/cleanup\n  \
        gnomon job create deploy --param branch=main --webhook-secret DEPLOY --webhook-param branch=/ref -- ./deploy.sh")]
    Create(CreateArgs),
    /// Create or update jobs from a JSON file (one job or an array); `-` reads stdin.
    Apply {
        /// The JSON file (`-`: standard input).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// List jobs: schedule, next fire time, paused or not.
    List {
        /// Only this namespace's jobs (default: every namespace the
        /// credential may see).
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Show one job: its spec and status (version, next fire time).
    Get(NameArg),
    /// Trigger manual runs now.
    Trigger {
        #[command(flatten)]
        job: NameArg,
        /// How many runs to create (1 to 10,000).
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// Name the run with this key (1 to 255 visible ASCII characters):
        /// a repeat with the same key, from anywhere and across leader
        /// changes, shows the run the first call created and creates none.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        /// Set one of the job's params (repeatable): the value is read as
        /// JSON when it is (5, true, {"a":1}, "007"), else as text.
        #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_param)]
        params: Vec<(String, serde_json::Value)>,
    },
    /// Call a job's webhook (`triggers.webhook`) as a sender would: the
    /// body signed with the secret from this process's environment, so a
    /// run starts with the body as its payload. No credential is needed.
    Hook {
        #[command(flatten)]
        job: NameArg,
        /// The body to send (the run's payload).
        #[arg(long, conflicts_with = "data_file", value_name = "TEXT")]
        data: Option<String>,
        /// Send this file's content as the body (`-`: standard input).
        #[arg(long, value_name = "PATH")]
        data_file: Option<std::path::PathBuf>,
        /// The environment variable holding the secret (default: the one
        /// the job names, read from the server, which needs a credential).
        #[arg(long, value_name = "VAR")]
        secret_env: Option<String>,
        /// Name the run with this key: a repeat shows the run the first
        /// call started and starts none.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// Create the runs of the past instants of a job's schedule in a range:
    /// an instant that has a run or a skip record keeps it, so a repeated
    /// or overlapping backfill creates nothing twice.
    Backfill {
        #[command(flatten)]
        job: NameArg,
        /// The range's first instant (RFC 3339), included.
        #[arg(long)]
        from: String,
        /// The range's last instant (RFC 3339), included; not in the future.
        #[arg(long)]
        to: String,
        /// Set one of the job's params for every run (repeatable), as for
        /// `job trigger`.
        #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_param)]
        params: Vec<(String, serde_json::Value)>,
        /// Instants per second (1 to 1000; default 10).
        #[arg(long)]
        rate: Option<u32>,
        /// Follow it until it ends, with a progress bar.
        #[arg(long)]
        wait: bool,
    },
    /// The next fire times of a job's schedule, or of a schedule given here,
    /// with daylight-saving changes marked.
    Preview(PreviewArgs),
    /// Stop a job's schedule firing: times that elapse while it is paused
    /// are neither fired nor recorded.
    Pause(NameArg),
    /// Let a paused job's schedule fire again.
    Resume(NameArg),
    /// Delete a job: it stops firing at once.
    Delete(NameArg),
}

#[derive(Args, Debug)]
struct NameArg {
    /// The job's name.
    name: String,
    /// The job's namespace (default: `default`).
    #[arg(long)]
    namespace: Option<String>,
}

#[derive(Args, Debug)]
struct PreviewArgs {
    /// A job whose schedule to preview (or give --cron, --every or --at).
    #[arg(conflicts_with_all = ["cron", "every", "at"])]
    name: Option<String>,
    /// The job's namespace (default: `default`).
    #[arg(long)]
    namespace: Option<String>,
    #[command(flatten)]
    schedule: ScheduleArgs,
    /// How many fire times (1 to 100).
    #[arg(long, default_value_t = 10)]
    count: u32,
    /// List the fire times after this RFC 3339 time (default: now).
    #[arg(long)]
    after: Option<String>,
}

/// A schedule on the command line: at most one of --cron, --every, --at.
#[derive(Args, Debug)]
struct ScheduleArgs {
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
    /// The schedule's first instant (RFC 3339, included; cron or every).
    #[arg(long)]
    start_at: Option<String>,
    /// The schedule's last instant (RFC 3339, included; cron or every).
    #[arg(long)]
    end_at: Option<String>,
    /// Delay each fire by up to this much, by an amount fixed per job and
    /// instant (e.g. 30s; at most 1h).
    #[arg(long)]
    jitter: Option<String>,
}

#[derive(Args, Debug)]
struct CreateArgs {
    /// The job's name (letters, digits, `-`, `_`, `.`).
    name: String,
    #[command(flatten)]
    schedule: ScheduleArgs,
    /// An attempt running longer than this is ended (e.g. 10m).
    #[arg(long)]
    timeout: Option<String>,
    /// Attempts per run, the first included (retries after a failure).
    #[arg(long)]
    max_attempts: Option<u32>,
    /// What to do with times missed while no leader ran.
    #[arg(long, value_parser = ["skip", "fire_once", "fire_all"])]
    misfire: Option<String>,
    /// What a fire does while a run of the job is still active.
    #[arg(long, value_parser = ["allow", "forbid", "replace", "buffer_one"])]
    overlap: Option<String>,
    /// The job's namespace (default: `default`).
    #[arg(long)]
    namespace: Option<String>,
    #[command(flatten)]
    pipeline: job_flags::PipelineArgs,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum RunCmd {
    /// List runs, newest first (every scheduled instant is a run or a skip).
    List {
        /// Only this job's runs.
        #[arg(long)]
        job: Option<String>,
        /// Only runs in this state.
        #[arg(long, value_parser = ["waiting", "pending", "assigned", "running", "retrying", "succeeded", "failed", "cancelled", "skipped"])]
        state: Option<String>,
        /// Only this namespace's runs (needed when the credential is
        /// limited to several).
        #[arg(long)]
        namespace: Option<String>,
        /// At most this many runs (a page).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// The next page: the cursor a previous page printed.
        #[arg(long)]
        cursor: Option<String>,
        /// Keep watching: redraw the table every 2 s (with `-o jsonl`,
        /// print each run again when it changes) until interrupted.
        #[arg(long, conflicts_with = "cursor")]
        watch: bool,
    },
    /// Show one run: its attempts, their workers, exit codes and output.
    Get {
        /// The run's id.
        id: String,
    },
    /// Cancel a run: one not yet started ends at once; a running attempt
    /// is ended by its worker (its whole process group).
    Cancel {
        /// The run's id.
        id: String,
    },
    /// Print an attempt's output: what it has written so far while it
    /// runs (its newest 64 KiB), else the output kept with it.
    Logs {
        /// The run's id.
        id: String,
        /// This attempt (default: the run's current one).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        attempt: Option<u32>,
        /// Keep following: print new output as it arrives, through the
        /// run's later attempts, until the run ends (or Ctrl-C).
        #[arg(short, long)]
        follow: bool,
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
    /// Release a worker id from the credential it belongs to (the first
    /// one that opened a session with it), so that the next credential to
    /// open a session with it takes it. Needs an admin credential not
    /// limited to namespaces; stop the id's worker first.
    Forget {
        /// The worker id.
        id: String,
    },
}

/// `NAME=VALUE` of `--param`: the value as JSON when it is JSON, else as text.
fn parse_param(arg: &str) -> Result<(String, serde_json::Value), String> {
    let (name, value) = arg.split_once('=').ok_or_else(|| format!("{arg:?} is not NAME=VALUE"))?;
    if name.is_empty() {
        return Err(format!("{arg:?} has no name before '='"));
    }
    let value = serde_json::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
    Ok((name.to_string(), value))
}

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let loaded = match config::load(&args) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    let matches = <Cli as clap::CommandFactory>::command().get_matches_from(args);
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.format(&mut <Cli as clap::CommandFactory>::command()).exit(),
    };
    let serving = matches!(&cli.command, Command::Dev(_) | Command::Server(_) | Command::Migrate(_))
        || matches!(&cli.command, Command::Worker(w) if w.cmd.is_none());
    // clap reads an empty variable as unset: an empty GNOMON_TOKEN would
    // quietly mean "no credentials".
    if serving && cli.token.is_none() && std::env::var_os("GNOMON_TOKEN").is_some_and(|v| v.is_empty()) {
        eprintln!("error: GNOMON_TOKEN is set but empty; give a token of at least 16 bytes, or unset it");
        std::process::exit(2);
    }
    if serving {
        // The store, the spool and the credentials' files are the process's
        // own: files it creates are private (jobs keep the usual umask).
        gnomon_worker::isolation::private_files();
        // Jobs running as this process's user cannot read its memory or
        // environment, and nothing it starts inherits its secrets. Still
        // single-threaded: the runtime starts below.
        let mut notes = Vec::new();
        if !hardening::non_dumpable() {
            notes.push(format!(
                "cannot mark this process non-dumpable ({}): processes of its user can read its memory",
                std::io::Error::last_os_error()
            ));
        }
        gnomon_server::notifier::capture_env_secrets();
        hardening::scrub_environment();
        for flag in hardening::secrets_on_command_line(&matches) {
            notes.push(format!(
                "a secret is given as the command-line flag {flag}: every local user can read it in /proc/PID/cmdline; \
                 use its environment variable or a file (--token-file) instead"
            ));
        }
        let _ = hardening::NOTES.set(notes);
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
    if let Err(e) = runtime.block_on(run(cli, loaded)) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli, loaded: config::Loaded) -> anyhow::Result<()> {
    let out = cli.output;
    let _ = serve::LOG_FORMAT.set(cli.log_format);
    match cli.command {
        Command::Dev(args) => serve::dev(*args, cli.token, cli.ca).await,
        Command::Server(args) => serve::server(*args, cli.token, cli.ca).await,
        Command::Migrate(args) => serve::migrate(args).await,
        Command::Auth(cmd) => auth_cmd::run(cmd),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut <Cli as clap::CommandFactory>::command(), "gnomon", &mut std::io::stdout());
            Ok(())
        }
        Command::Man => {
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command()).render(&mut std::io::stdout())?;
            Ok(())
        }
        Command::Doctor(args) => doctor::run(args, &cli.server, cli.token.as_deref(), cli.ca.as_deref()).await,
        Command::Config(ConfigCmd::Show { command, flags }) => {
            table::settings(loaded.path.as_deref(), &config::effective(&command, &flags, &loaded)?, out)
        }
        Command::Worker(WorkerCommand { cmd: None, run }) => serve::worker(run, &cli.server, cli.token, cli.ca).await,
        command => {
            let c = client::Client::new(&cli.server, cli.token.as_deref(), cli.ca.as_deref())?;
            match command {
                Command::Job(cmd) => commands::job(&c, cmd, out).await,
                Command::Run(cmd) => commands::runs(&c, cmd, out).await,
                Command::Backfill(cmd) => backfill::run(&c, cmd, out).await,
                Command::Worker(WorkerCommand { cmd: Some(WorkerCmd::List), .. }) => table::workers(&c.get("/v1/workers", &[]).await?, out),
                Command::Worker(WorkerCommand { cmd: Some(WorkerCmd::Forget { id }), .. }) => commands::forget_worker(&c, &id, out).await,
                Command::Leader => table::leader(&c.get("/v1/leader", &[]).await?, out),
                Command::Cluster(cmd) => commands::cluster(&c, cmd, out).await,
                Command::Dev(_)
                | Command::Server(_)
                | Command::Migrate(_)
                | Command::Auth(_)
                | Command::Completions { .. }
                | Command::Man
                | Command::Config(_)
                | Command::Doctor(_)
                | Command::Worker(WorkerCommand { cmd: None, .. }) => {
                    unreachable!("handled above")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand says what it does and every flag and argument what
    /// it takes, in `--help` and the manual page.
    #[test]
    fn every_command_and_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if matches!(id, "help" | "version") || a.is_hide_set() {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                let here = format!("{path} {}", sub.get_name());
                if sub.get_name() != "help" && sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(here.clone());
                }
                walk(sub, &here, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "gnomon", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:#?}");
    }
}
