//! The invariants, checked after a seed against the store and the workers'
//! history.

use std::collections::{BTreeMap, HashMap};

use gnomon_backend::{NotificationState, RunDetail, RunFilter, Store};
use gnomon_core::{AttemptState, Millis, RunState};
use gnomon_proto::v1;

use crate::history::History;
use crate::{SimDep, SimJob};

/// How long after the end a fire may still be missing (not yet due).
const END_SLACK_MS: Millis = 3_000;
/// How late a pause may take effect (the leader reads the change feed at
/// least every second; faults delay it).
const PAUSE_SLACK_MS: Millis = 5_000;
/// Every run fired this long before the end is terminal. Faults stop 50 s
/// before the end; a worker frozen when they stop wakes within 12.5 s, its
/// lease runs out 5 s later, and retries take at most a few seconds.
pub const TERMINAL_WITHIN_MS: Millis = 30_000;

pub async fn check(
    store: &dyn Store,
    jobs: &[SimJob],
    deps: &[SimDep],
    h: &History,
    end: Millis,
    v: &mut Vec<String>,
) -> Result<usize, String> {
    let mut runs: Vec<RunDetail> = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.list_runs(&RunFilter::default(), 1000, cursor).await.map_err(|e| e.to_string())?;
        for r in &page.runs {
            if let Some(d) = store.get_run(&r.id).await.map_err(|e| e.to_string())? {
                runs.push(d);
            }
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let by_id: HashMap<&str, &RunDetail> = runs.iter().map(|d| (d.run.id.as_str(), d)).collect();
    let backfills = store.list_backfills(None).await.map_err(|e| e.to_string())?;

    // 1. One record per scheduled instant: none missing, none twice, none
    //    at an instant the schedule does not have, none while paused.
    for job in jobs {
        let mut seen: BTreeMap<Millis, usize> = BTreeMap::new();
        for d in runs.iter().filter(|d| d.run.job == job.name && !d.run.manual) {
            *seen.entry(d.run.scheduled_at).or_default() += 1;
        }
        // Instants a backfill covers: exactly one record up to its cursor
        // (paused or not: a backfill fills them), at most one past it.
        let mut covered: BTreeMap<Millis, bool> = BTreeMap::new();
        for b in backfills.iter().filter(|b| b.job == job.name) {
            let mut t = (b.from + job.every_ms - 1).div_euclid(job.every_ms) * job.every_ms;
            while t <= b.to {
                let handled = t <= b.cursor;
                if job.in_bounds(t) {
                    covered.entry(t).and_modify(|h| *h |= handled).or_insert(handled);
                }
                t += job.every_ms;
            }
        }
        for (t, handled) in &covered {
            let n = seen.remove(t).unwrap_or(0);
            if n > 1 || (*handled && n != 1) {
                v.push(format!("job {}: {n} records at backfilled instant {t} (handled: {handled})", job.name));
            }
        }
        let paused = h.paused.get(&job.name).cloned().unwrap_or_default();
        let in_pause = |t: Millis, slack: Millis| paused.iter().any(|(p, r)| t > p + slack && r.is_none_or(|r| t <= r));
        // A record made before its instant's (jittered) fire time, except
        // at a pause, which fires what was scheduled before it at once.
        for d in runs.iter().filter(|d| d.run.job == job.name && !d.run.manual && !covered.contains_key(&d.run.scheduled_at)) {
            let (t, due) = (d.run.scheduled_at, job.schedule.fire_at(d.run.scheduled_at));
            if due - t > job.jitter_ms {
                v.push(format!("job {}: instant {t} delayed by {} ms, more than its jitter {}", job.name, due - t, job.jitter_ms));
            }
            let at_pause = paused.iter().any(|(p, _)| *p + PAUSE_SLACK_MS >= t && *p <= due);
            if d.run.fired_at < due && !at_pause {
                v.push(format!(
                    "job {}: instant {t} recorded at +{}, before its fire time +{}",
                    job.name,
                    d.run.fired_at - crate::T0,
                    due - crate::T0
                ));
            }
        }
        let mut t = (job.created_at / job.every_ms + 1) * job.every_ms;
        while t <= end - END_SLACK_MS {
            if covered.contains_key(&t) || !job.in_bounds(t) {
                t += job.every_ms;
                continue;
            }
            let n = seen.remove(&t).unwrap_or(0);
            if n > 1 {
                v.push(format!("job {}: {n} runs at instant {t}", job.name));
            }
            // The last instants' jittered fires may not have come.
            if n == 0 && !in_pause(t, 0) && t <= end - END_SLACK_MS - job.jitter_ms {
                v.push(format!("job {}: no run or skip record for instant {t} (+{} ms)", job.name, t - crate::T0));
            }
            if n > 0 && in_pause(t, PAUSE_SLACK_MS) {
                let why: Vec<String> = runs
                    .iter()
                    .filter(|d| d.run.job == job.name && d.run.scheduled_at == t && !d.run.manual)
                    .map(|d| format!("{} {} {:?} fired at +{}", d.run.id, d.run.state.as_str(), d.run.reason, d.run.fired_at - crate::T0))
                    .collect();
                v.push(format!("job {}: instant {t} fired while the job was paused: {why:?}", job.name));
            }
            t += job.every_ms;
        }
        for (t, _) in seen.range(..end - END_SLACK_MS) {
            v.push(format!("job {}: a scheduled run at {t}, which is not an instant of its schedule", job.name));
        }
    }

    // 2. Attempts are numbered 1, 2, 3… and every run is terminal in time.
    for d in &runs {
        for (i, a) in d.attempts.iter().enumerate() {
            if a.attempt as usize != i + 1 {
                v.push(format!("run {}: attempts numbered {:?}", d.run.id, d.attempts.iter().map(|a| a.attempt).collect::<Vec<_>>()));
                break;
            }
        }
        if d.run.fired_at <= end - TERMINAL_WITHIN_MS && !d.run.state.is_terminal() {
            let attempts: Vec<String> = d
                .attempts
                .iter()
                .map(|a| format!("{} on {} {} at +{}", a.attempt, a.worker, a.state.as_str(), a.assigned_at - crate::T0))
                .collect();
            v.push(format!(
                "run {}: still {} {} ms after it fired; attempts {attempts:?}",
                d.run.id,
                d.run.state.as_str(),
                end - d.run.fired_at
            ));
        }
    }

    // 3. No two attempts of a run live at once; no attempt started after a
    //    later attempt of its run was assigned.
    let mut segments: HashMap<&str, Vec<(u32, Millis, Millis)>> = HashMap::new();
    for (run, attempt, from, to) in &h.segments {
        if to > from {
            segments.entry(run.as_str()).or_default().push((*attempt, *from, *to));
        }
    }
    for (run, segs) in &segments {
        for (i, a) in segs.iter().enumerate() {
            for b in &segs[i + 1..] {
                if a.0 != b.0 && a.1 < b.2 && b.1 < a.2 {
                    v.push(format!("run {run}: attempts {} ({}..{}) and {} ({}..{}) were live at once", a.0, a.1, a.2, b.0, b.1, b.2));
                }
            }
        }
    }
    for (run, attempt, worker, at) in &h.starts {
        let Some(d) = by_id.get(run.as_str()) else {
            v.push(format!("run {run}: started by {worker} but not in the store"));
            continue;
        };
        if let Some(next) = d.attempts.iter().find(|a| a.attempt == attempt + 1) {
            if next.assigned_at < *at {
                v.push(format!(
                    "run {run}: attempt {attempt} started on {worker} at {at}, after attempt {} was assigned at {}",
                    next.attempt, next.assigned_at
                ));
            }
        }
    }

    // 4. No lost result: a report the leader acked as recorded is the
    //    attempt's outcome in the store.
    for (run, attempt, outcome) in &h.recorded {
        let want = match v1::Outcome::try_from(*outcome).unwrap_or(v1::Outcome::Failed) {
            v1::Outcome::Succeeded => AttemptState::Succeeded,
            v1::Outcome::Cancelled => AttemptState::Cancelled,
            v1::Outcome::Lost => AttemptState::Lost,
            v1::Outcome::TimedOut => AttemptState::TimedOut,
            _ => AttemptState::Failed,
        };
        let got = by_id.get(run.as_str()).and_then(|d| d.attempts.iter().find(|a| a.attempt == *attempt)).map(|a| a.state);
        if got != Some(want) {
            v.push(format!("run {run}: attempt {attempt}'s report ({}) was acked, but the store has {got:?}", want.as_str()));
        }
    }

    // 5. Notifications ride with the outcome they tell of: every job
    //    notifies on failed, succeeded and recovered, so a failed run has
    //    exactly its `failed` row, a succeeded one its `succeeded` and
    //    `recovered` rows (no delivery runs here: all pending), any other
    //    none — whatever faults hit the writes that ended them.
    for d in &runs {
        let mut want: Vec<String> = match d.run.state {
            RunState::Failed => vec!["failed".into()],
            RunState::Succeeded => vec!["recovered".into(), "succeeded".into()],
            _ => Vec::new(),
        };
        want.iter_mut().for_each(|o| *o = format!("{}/{o}/0", d.run.id));
        let notes = store.run_notifications(&d.run.id).await.map_err(|e| e.to_string())?;
        let got: Vec<String> = notes.iter().map(|n| n.id.clone()).collect();
        if got != want || notes.iter().any(|n| n.state != NotificationState::Pending || n.attempts != 0) {
            v.push(format!("run {} ({}): notifications {got:?}, expected {want:?} pending", d.run.id, d.run.state.as_str()));
        }
    }
    // 6. One run per idempotency key: every answer for a (job, key) names
    //    the run that key's id derives from, that run is in the store, at
    //    most one answer says it created it, and no keyed run exists that
    //    no trigger asked for.
    let mut answers: BTreeMap<(&str, &str), (Vec<&str>, usize)> = BTreeMap::new();
    for (job, key, id, existed) in &h.keyed {
        let e = answers.entry((job.as_str(), key.as_str())).or_default();
        e.0.push(id.as_str());
        e.1 += usize::from(!existed);
    }
    let mut asked: std::collections::HashSet<String> = std::collections::HashSet::new();
    for job in jobs {
        let Some(uid) = runs.iter().find(|d| d.run.job == job.name).map(|d| d.run.job_uid.clone()) else { continue };
        for key in &h.keys_tried {
            asked.insert(gnomon_backend::keyed_run_id(&uid, key));
        }
    }
    for ((job, key), (ids, created)) in &answers {
        let Some(d) = ids.first().and_then(|id| by_id.get(id)) else {
            v.push(format!("job {job}, key {key}: the answered run {:?} is not in the store", ids.first()));
            continue;
        };
        let want = gnomon_backend::keyed_run_id(&d.run.job_uid, key);
        if ids.iter().any(|id| *id != want) || *created > 1 {
            v.push(format!("job {job}, key {key}: answers {ids:?} ({created} created), expected {want} once"));
        }
    }
    for d in runs.iter().filter(|d| d.run.manual && d.run.id.contains("-k")) {
        if !asked.contains(&d.run.id) {
            v.push(format!("run {}: a keyed run no trigger's key names", d.run.id));
        }
    }
    check_params(&runs, &by_id, jobs, h, v);
    check_dependencies(&runs, &by_id, deps, v);
    check_hints(&by_id, h, v);
    crate::check_attempts::check_attempts(&runs, jobs, deps, h, v);
    // 9. Every backfill ended: done (its cursor at its end) or cancelled.
    for b in &backfills {
        if b.state == gnomon_backend::BackfillState::Running || (b.state == gnomon_backend::BackfillState::Done && b.cursor != b.to) {
            v.push(format!("backfill {} of {}: {} at cursor {} (range {}..{})", b.id, b.job, b.state.as_str(), b.cursor, b.from, b.to));
        }
        if b.state == gnomon_backend::BackfillState::Done && b.created + b.kept != b.total {
            v.push(format!("backfill {}: created {} + kept {} of {}", b.id, b.created, b.kept, b.total));
        }
    }
    Ok(runs.len())
}

/// 10. A failure's retry hint, when the leader accepted the report (the
///     stored attempt is `failed`): with no_retry the run failed and had no
///     later attempt; with retry_after its next attempt was assigned no
///     sooner than that after the failure ended.
fn check_hints(by_id: &HashMap<&str, &RunDetail>, h: &History, v: &mut Vec<String>) {
    for (run, attempt, no_retry, after) in &h.hints {
        let Some(d) = by_id.get(run.as_str()) else { continue };
        let Some(a) = d.attempts.iter().find(|a| a.attempt == *attempt) else { continue };
        if a.state != AttemptState::Failed {
            continue;
        }
        let next = d.attempts.iter().find(|n| n.attempt == attempt + 1);
        if *no_retry && (next.is_some() || d.run.state != RunState::Failed) {
            v.push(format!(
                "run {run}: attempt {attempt} failed asking not to be retried, yet the run is {:?} with {} attempts",
                d.run.state,
                d.attempts.len()
            ));
        }
        if let (Some(n), Some(ended)) = (next, a.ended_at) {
            if *after > 0 && n.assigned_at < ended + i64::try_from(*after).unwrap_or(0) {
                v.push(format!(
                    "run {run}: attempt {} assigned at {}, before {ended} + the {after} ms attempt {attempt} asked for",
                    n.attempt, n.assigned_at
                ));
            }
        }
    }
}

/// 8. Dependencies: every run of an upstream (skip records and manual runs
///    included) has its downstream jobs' runs of its instant (made in the
///    same write); a downstream run that ran had every edge accepted, by
///    upstream runs that had all ended before its first attempt was
///    assigned; one skipped by its edges had an edge refused; none is left
///    waiting (check 2).
fn check_dependencies(runs: &[RunDetail], by_id: &HashMap<&str, &RunDetail>, deps: &[SimDep], v: &mut Vec<String>) {
    let uid_of = |name: &str| runs.iter().find(|d| d.run.job == name).map(|d| d.run.job_uid.clone());
    for dep in deps {
        let Some(dep_uid) = uid_of(&dep.name) else { continue };
        for (up, _) in &dep.after {
            for u in runs.iter().filter(|d| &d.run.job == up) {
                let id = gnomon_backend::dep_run_id(&dep_uid, u.run.scheduled_at);
                if !by_id.contains_key(id.as_str()) {
                    v.push(format!("run {} of {up} ({}): no run {id} of {} at its instant", u.run.id, u.run.state.as_str(), dep.name));
                }
            }
        }
        for d in runs.iter().filter(|d| d.run.job == dep.name) {
            let Some(after) = d.run.upstream.as_deref() else {
                v.push(format!("run {} of {}: no upstream record", d.run.id, dep.name));
                continue;
            };
            let at = d.run.scheduled_at;
            // Made for the upstream run that made it, at that run's instant
            // as stored (a repeated key or a replayed call makes none).
            match by_id.get(after.of.as_str()) {
                Some(maker) if maker.run.scheduled_at == at => {}
                Some(maker) => v.push(format!(
                    "run {} of {}: at {at}, but the run {} that made it is at {}",
                    d.run.id, dep.name, maker.run.id, maker.run.scheduled_at
                )),
                None => v.push(format!("run {} of {}: the run {} that made it is not in the store", d.run.id, dep.name, after.of)),
            }
            let mut refused = false;
            let mut last_end = Millis::MIN;
            // Judged by what existed when it was decided: an upstream run a
            // later backfill made (of an instant it had none of) does not
            // change a decision made before it.
            let decided_at = d.attempts.first().map_or(d.run.updated_at, |a| a.assigned_at);
            for (edge, candidates) in after.edges.iter().zip(gnomon_backend::upstream_candidates(after, at)) {
                let found: Vec<&RunDetail> =
                    candidates.iter().filter_map(|c| by_id.get(c.as_str()).copied()).filter(|u| u.run.fired_at <= decided_at).collect();
                if found.is_empty() || found.iter().any(|u| !u.run.state.is_terminal() || !edge.on.accepts(u.run.state)) {
                    refused = true;
                }
                for u in found.iter().filter(|u| u.run.state.is_terminal()) {
                    last_end = last_end.max(u.run.updated_at);
                }
            }
            let ran = !d.attempts.is_empty();
            if ran && refused {
                v.push(format!("run {} of {}: ran though an edge was not accepted ({:?})", d.run.id, dep.name, d.run.upstream));
            }
            if let Some(first) = d.attempts.first().filter(|a| a.assigned_at < last_end) {
                v.push(format!("run {}: attempt 1 assigned at {} before its upstreams ended at {last_end}", d.run.id, first.assigned_at));
            }
            let skipped_by_edges = d.run.state == RunState::Skipped && d.run.reason.as_deref().is_some_and(|r| r.starts_with("after:"));
            if skipped_by_edges && !refused {
                v.push(format!("run {} of {}: skipped ({:?}) though every edge accepted", d.run.id, dep.name, d.run.reason));
            }
            if d.run.state == RunState::Skipped && !skipped_by_edges {
                v.push(format!("run {} of {}: skipped for {:?}", d.run.id, dep.name, d.run.reason));
            }
        }
    }
}

/// 7. Every run records the params it runs with: a scheduled run of a job
///    with params its defaults, a triggered run what its trigger set over
///    them, a run of a job without params none; every attempt was assigned
///    with exactly its run's values; no trigger was refused.
fn check_params(runs: &[RunDetail], by_id: &HashMap<&str, &RunDetail>, jobs: &[SimJob], h: &History, v: &mut Vec<String>) {
    let defaults = r#"{"tier":"std"}"#;
    for d in runs.iter().filter(|d| d.run.state != RunState::Skipped) {
        let Some(job) = jobs.iter().find(|j| j.name == d.run.job) else { continue };
        let got = d.run.params.as_deref();
        let ok = match (job.params, d.run.manual) {
            (false, _) => got.is_none(),
            (true, false) => got == Some(defaults),
            (true, true) => got.is_some_and(|p| p.starts_with(r#"{"tier":""#)),
        };
        if !ok {
            v.push(format!("run {} of {} (manual {}): params {got:?}", d.run.id, job.name, d.run.manual));
        }
    }
    for (ids, expected) in &h.trigger_params {
        for id in ids {
            let got = by_id.get(id.as_str()).map(|d| d.run.params.clone());
            if got.as_ref().is_some_and(|g| g != expected) {
                v.push(format!("run {id}: params {got:?}, its trigger set {expected:?}"));
            }
        }
    }
    for (run, attempt, sent) in &h.assigned_params {
        let stored = by_id.get(run.as_str()).map(|d| d.run.params.clone().unwrap_or_default());
        if stored.as_ref().is_some_and(|s| s != sent) {
            v.push(format!("run {run} attempt {attempt}: assigned with params {sent:?}, the run has {stored:?}"));
        }
    }
    // Payloads: a webhook's run records its call's body, every other run
    // none, and every attempt gets what its run recorded.
    for d in runs.iter().filter(|d| !d.run.manual && d.run.payload.is_some()) {
        v.push(format!("scheduled run {} has a payload", d.run.id));
    }
    for (ids, expected) in &h.trigger_payloads {
        for id in ids {
            let got = by_id.get(id.as_str()).map(|d| d.run.payload.clone());
            if got.as_ref().is_some_and(|g| g != expected) {
                v.push(format!("run {id}: payload {got:?}, its trigger sent {expected:?}"));
            }
        }
    }
    for (run, attempt, sent) in &h.assigned_payloads {
        let stored = by_id.get(run.as_str()).map(|d| d.run.payload.clone().unwrap_or_default());
        if stored.as_ref().is_some_and(|s| s != sent) {
            v.push(format!("run {run} attempt {attempt}: assigned with payload {sent:?}, the run has {stored:?}"));
        }
    }
    for why in &h.refused_triggers {
        v.push(format!("a trigger was refused: {why}"));
    }
}
