//! The checks on attempts ended early: a failover, a rebuild or a lost
//! connection of the leader's must change nothing a live worker is doing.

use std::collections::HashMap;

use gnomon_backend::RunDetail;
use gnomon_core::{AttemptState, Millis};
use gnomon_proto::v1;

use crate::history::History;
use crate::{SimDep, SimJob, DEP_TIMEOUT_MS};

/// 11. No attempt ends `timed_out` before its job's timeout, measured from
///     its start (or its assignment, if it never reported a start).
/// 12. No attempt a worker started is ended `lost` unless that worker was
///     crashed, paused, cut off or fenced itself while it ran.
/// 14. A trigger its caller withdrew before the leader planned it is never
///     written.
/// 13. No run gets a second execution unless the one before it failed or
///     timed out on its worker, or its worker was crashed, paused, cut off
///     or fenced itself between the two starts.
pub fn check_attempts(runs: &[RunDetail], jobs: &[SimJob], deps: &[SimDep], h: &History, v: &mut Vec<String>) {
    let timeouts: HashMap<&str, Millis> =
        jobs.iter().map(|j| (j.name.as_str(), j.timeout_ms)).chain(deps.iter().map(|d| (d.name.as_str(), DEP_TIMEOUT_MS))).collect();
    let by_id: HashMap<&str, &RunDetail> = runs.iter().map(|d| (d.run.id.as_str(), d)).collect();
    let mut starts: HashMap<&str, Vec<(u32, &str, Millis)>> = HashMap::new();
    for (run, attempt, worker, at) in &h.starts {
        starts.entry(run.as_str()).or_default().push((*attempt, worker.as_str(), *at));
    }
    // 11.
    for d in runs {
        let Some(timeout) = timeouts.get(d.run.job.as_str()) else { continue };
        for a in d.attempts.iter().filter(|a| a.state == AttemptState::TimedOut) {
            let began = a.started_at.unwrap_or(a.assigned_at).max(a.assigned_at);
            if let Some(ended) = a.ended_at {
                if ended - began < *timeout {
                    v.push(format!(
                        "run {}: attempt {} on {} ended timed_out {} ms after it began (+{}), before its timeout of {timeout} ms: {:?}",
                        d.run.id,
                        a.attempt,
                        a.worker,
                        ended - began,
                        began - crate::T0,
                        a.output
                    ));
                }
            }
        }
    }
    // 12.
    for (run, list) in &starts {
        let Some(d) = by_id.get(run) else { continue };
        for (attempt, worker, at) in list {
            let Some(a) = d.attempts.iter().find(|a| a.attempt == *attempt) else { continue };
            if a.state != AttemptState::Lost {
                continue;
            }
            let ended = a.ended_at.unwrap_or(Millis::MAX);
            if !h.was_disrupted(worker, *at, ended) {
                v.push(format!(
                    "run {run}: attempt {attempt} started on {worker} at +{} was ended lost at +{} though its worker was never crashed, paused, cut off or fenced: {:?}",
                    at - crate::T0,
                    ended - crate::T0,
                    a.output
                ));
            }
        }
    }
    // 14. A trigger withdrawn before the leader planned it is never
    //     written: no run carries its tier.
    for tier in &h.withdrawn {
        let marker = format!(r#""{tier}""#);
        for d in runs.iter().filter(|d| d.run.params.as_deref().is_some_and(|p| p.contains(&marker))) {
            v.push(format!("run {}: created for trigger {tier}, which its caller had withdrawn", d.run.id));
        }
    }
    // 13.
    let decided: HashMap<(&str, u32), i32> = h.decided.iter().map(|(r, a, o)| ((r.as_str(), *a), *o)).collect();
    for (run, list) in &mut starts {
        list.sort_by_key(|(attempt, _, at)| (*attempt, *at));
        for pair in list.windows(2) {
            let ((prev, worker, from), (next, _, to)) = (pair[0], pair[1]);
            let failed = decided.get(&(*run, prev)).is_some_and(|o| [v1::Outcome::Failed as i32, v1::Outcome::TimedOut as i32].contains(o));
            if !failed && !h.was_disrupted(worker, from, to) {
                let outcome = by_id
                    .get(run)
                    .and_then(|d| d.attempts.iter().find(|a| a.attempt == prev))
                    .map(|a| format!("{} {:?}", a.state.as_str(), a.output));
                v.push(format!(
                    "run {run}: attempt {next} executed at +{} after attempt {prev} (started on {worker} at +{}, ended {outcome:?}), whose worker neither failed it nor was disrupted",
                    to - crate::T0,
                    from - crate::T0
                ));
            }
        }
    }
}
