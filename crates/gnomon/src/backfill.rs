//! `gnomon job backfill` and `gnomon backfill …`: asking for a backfill,
//! following its progress (a bar on a terminal), listing and cancelling.

use std::io::{IsTerminal, Write};

use clap::Subcommand;
use gnomon_api::{Backfill, BackfillList, BackfillRequest};
use reqwest::Method;

use crate::client::{path_segment, Client};
use crate::table;
use crate::Output;

#[derive(Subcommand, Debug)]
pub enum BackfillCmd {
    /// List backfills, newest first.
    List {
        /// Only this namespace's.
        #[arg(long)]
        namespace: Option<String>,
        /// Only this job's.
        #[arg(long)]
        job: Option<String>,
    },
    /// Show one backfill's progress.
    Get {
        /// The backfill's id.
        id: String,
        /// Follow it until it ends, with a progress bar.
        #[arg(long)]
        wait: bool,
    },
    /// Cancel a running backfill: it creates no more runs (those it
    /// created stay).
    Cancel {
        /// The backfill's id.
        id: String,
    },
}

/// What `gnomon job backfill` asks for.
pub struct Ask {
    pub name: String,
    pub namespace: Option<String>,
    pub request: BackfillRequest,
    pub wait: bool,
}

pub async fn create(c: &Client, ask: Ask, out: Output) -> anyhow::Result<()> {
    let q: Vec<(&str, String)> = ask.namespace.map(|n| ("namespace", n)).into_iter().collect();
    let path = format!("/v1/jobs/{}/backfill", path_segment(&ask.name));
    let b: Backfill = c.call(Method::POST, &path, &q, Some(&ask.request)).await?;
    if ask.wait {
        return follow(c, b, out).await;
    }
    table::backfill(&b, out)
}

pub async fn run(c: &Client, cmd: BackfillCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        BackfillCmd::List { namespace, job } => {
            let mut q: Vec<(&str, String)> = namespace.map(|n| ("namespace", n)).into_iter().collect();
            q.extend(job.map(|j| ("job", j)));
            table::backfills(&c.get::<BackfillList>("/v1/backfills", &q).await?, out)
        }
        BackfillCmd::Get { id, wait } => {
            let b: Backfill = c.get(&format!("/v1/backfills/{}", path_segment(&id)), &[]).await?;
            if wait {
                return follow(c, b, out).await;
            }
            table::backfill(&b, out)
        }
        BackfillCmd::Cancel { id } => {
            let b: Backfill = c.call(Method::POST, &format!("/v1/backfills/{}/cancel", path_segment(&id)), &[], None::<&()>).await?;
            table::backfill(&b, out)
        }
    }
}

/// Follows a backfill until it ends: a bar redrawn on a terminal's
/// standard error, else a line per change; then the backfill as `out`
/// prints it. A cancelled backfill exits non-zero.
async fn follow(c: &Client, mut b: Backfill, out: Output) -> anyhow::Result<()> {
    let tty = std::io::stderr().is_terminal();
    let mut last = None;
    loop {
        let line = progress_line(&b);
        if last.as_ref() != Some(&line) {
            let mut err = std::io::stderr();
            if tty {
                let _ = write!(err, "\r\x1b[2K{line}");
            } else {
                let _ = writeln!(err, "{line}");
            }
            let _ = err.flush();
            last = Some(line);
        }
        if b.state != "running" {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
            _ = tokio::signal::ctrl_c() => { eprintln!(); return Ok(()) }
        }
        b = c.get(&format!("/v1/backfills/{}", path_segment(&b.id)), &[]).await?;
    }
    if tty {
        eprintln!();
    }
    table::backfill(&b, out)?;
    if b.state == "cancelled" {
        anyhow::bail!("backfill {} was cancelled", b.id);
    }
    Ok(())
}

/// `[#########-----------]  45% 450/1000 (created 400, kept 50) running`
pub fn progress_line(b: &Backfill) -> String {
    const WIDTH: u64 = 30;
    let done = b.created + b.kept;
    let total = b.total.max(1);
    let filled = (done.min(total) * WIDTH / total) as usize;
    format!(
        "[{}{}] {:>3}% {done}/{} (created {}, kept {}) {}",
        "#".repeat(filled),
        "-".repeat(WIDTH as usize - filled),
        done.min(total) * 100 / total,
        b.total,
        b.created,
        b.kept,
        b.state
    )
}
