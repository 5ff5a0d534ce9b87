//! `gnomon run logs RUN [-f]`: an attempt's output, followed live.

use std::io::Write;
use std::time::Duration;

use gnomon_api::RunOutput;

use crate::client::{path_segment, Client};

/// How often `--follow` asks for more.
const POLL: Duration = Duration::from_millis(500);

pub(super) async fn print(c: &Client, id: &str, attempt: Option<u32>, follow: bool) -> anyhow::Result<()> {
    let path = format!("/v1/runs/{}/output", path_segment(id));
    let mut from = 0u64;
    // Whether this attempt's live output has been printed (then its kept
    // output, the same text, is not printed again when it ends).
    let mut printed_live = false;
    let mut stdout = std::io::stdout();
    loop {
        let mut q = vec![("from", from.to_string())];
        q.extend(attempt.map(|a| ("attempt", a.to_string())));
        let o: RunOutput = c.get(&path, &q).await?;
        if o.skipped > 0 {
            writeln!(stdout, "[gnomon: {} earlier bytes are no longer kept]", o.skipped)?;
        }
        if o.live {
            stdout.write_all(o.text.as_bytes())?;
            printed_live |= !o.text.is_empty();
            from = o.next;
        } else if !printed_live {
            stdout.write_all(o.text.as_bytes())?;
        } else if o.from > 0 {
            // The rest of what was followed, to its end.
            stdout.write_all(o.text.as_bytes())?;
        } else {
            eprintln!("[gnomon: the rest of this attempt's output is in what was kept: gnomon run logs {id} --attempt {}]", o.attempt);
        }
        stdout.flush()?;
        if !follow {
            return Ok(());
        }
        if !o.live {
            // The attempt ended. A later attempt (a retry) is followed
            // too, unless one was asked for by number.
            if o.state.is_terminal() || attempt.is_some() {
                eprintln!("[gnomon: run {} {}]", o.run_id, o.state.as_str());
                return Ok(());
            }
            if o.attempt > 0 && printed_live {
                eprintln!("[gnomon: attempt {} ended; the run is {}]", o.attempt, o.state.as_str());
            }
            // Wait for the next attempt to start.
            let mut next = o.attempt;
            while next == o.attempt {
                tokio::select! {
                    _ = tokio::time::sleep(POLL) => {}
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                }
                let n: RunOutput = c.get(&path, &[]).await?;
                if n.state.is_terminal() {
                    eprintln!("[gnomon: run {} {}]", n.run_id, n.state.as_str());
                    return Ok(());
                }
                next = n.attempt;
            }
            (from, printed_live) = (0, false);
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
