//! Readable traces of the checker's discoveries.

use std::fmt::Write;

use stateright::Path;

use crate::model::Action;
use crate::state::*;

/// A one-line summary of a state.
pub fn summary(s: &State) -> String {
    let mut out = format!("fence={}", s.store.fence);
    match s.leader {
        Some(l) => {
            let _ = write!(out, " leader(token {}", l.token);
            for (r, lr) in l.runs.iter().enumerate() {
                if lr.holder != Holder::None {
                    let _ = write!(out, ", run{r} {:?}", lr.holder);
                    if let Some(b) = lr.began_age {
                        let _ = write!(out, " believed began {b} ago");
                    }
                }
            }
            out.push(')');
        }
        None => out.push_str(" no leader"),
    }
    if let Some(t) = s.deposed {
        let _ = write!(out, " deposed(token {t})");
    }
    for (r, run) in s.store.runs.iter().enumerate() {
        let Some(run) = run else { continue };
        let _ = write!(out, " | run{r} {:?}", run.state);
        for (i, a) in run.attempts.iter().enumerate() {
            let Some(a) = a else { continue };
            let _ = write!(out, " a{}[w{} token {} {:?}", i + 1, a.worker, a.token, a.state);
            if a.state.is_live() {
                let _ = write!(out, ", {} {} ago", if a.started { "started" } else { "assigned" }, a.age);
            }
            if a.healthy && a.state.is_live() {
                out.push_str(", healthy");
            }
            out.push(']');
        }
    }
    for (w, wk) in s.workers.iter().enumerate() {
        let _ = write!(out, " | w{w} {:?}{} ack {} ago", wk.status, if wk.connected { "" } else { " cut" }, wk.ack_age);
        if let Some(sl) = wk.slot {
            let _ = write!(out, ", holds run{}/a{} {:?} step {:?}", sl.run, sl.attempt, sl.phase, sl.step);
            if sl.aborted {
                out.push_str(" (abort pending)");
            }
        }
        if let Some(a) = wk.inbox {
            let _ = write!(out, ", sent run{}/a{}", a.run, a.attempt);
        }
    }
    for r in 0..MAX_RUNS {
        if s.db.commits[r] > 0 || s.db.lock[r].is_some() {
            let _ = write!(out, " | db run{r}: {} commit(s)", s.db.commits[r]);
            if let Some(w) = s.db.lock[r] {
                let _ = write!(out, ", locked by w{w}");
            }
            if let Some(a) = s.db.record[r] {
                let _ = write!(out, ", record by a{a}");
            }
        }
    }
    out
}

/// A path as numbered lines: each action, then the state it led to.
pub fn render(path: &Path<State, Action>) -> String {
    let mut out = String::new();
    let mut previous: Option<Action> = None;
    for (i, (state, action)) in path.clone().into_vec().into_iter().enumerate() {
        let label = previous.map_or_else(|| "init".to_string(), |a| format!("{a:?}"));
        let _ = writeln!(out, "  {i:2}. {label:<24} {}", summary(&state));
        previous = action;
    }
    out
}
