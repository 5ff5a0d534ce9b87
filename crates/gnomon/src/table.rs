//! Readable tables (default) or JSON (`--output json`) of the API's answers.

use gnomon_api::{ClusterStatus, Job, Leader, Run, RunList, SchedulePreview, TriggerAnswer, WorkerList};
use gnomon_core::spec::Executor;
use serde::Serialize;

use crate::Output;

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(T::to_string).unwrap_or_else(|| "-".into())
}

fn print_table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_uppercase()).collect());
    for r in rows {
        line(r);
    }
}

/// Prints `v` as JSON and returns true when the output is JSON.
fn as_json(v: &impl Serialize, out: Output) -> anyhow::Result<bool> {
    if out == Output::Json {
        println!("{}", serde_json::to_string_pretty(v)?);
        return Ok(true);
    }
    Ok(false)
}

fn schedule_text(j: &Job) -> String {
    let sch = &j.spec.schedule;
    if let Some(c) = &sch.cron {
        format!("cron {c} {}", sch.timezone.as_deref().unwrap_or("UTC"))
    } else if let Some(e) = &sch.every {
        format!("every {e}")
    } else if let Some(a) = &sch.at {
        format!("at {a}")
    } else {
        "manual".into()
    }
}

fn executor_text(e: &Executor) -> String {
    match e {
        Executor::Handler(h) => format!("handler {}", h.name),
        other => other.kind().to_string(),
    }
}

pub fn jobs(list: &[Job], out: Output) -> anyhow::Result<()> {
    if as_json(&serde_json::json!({ "jobs": list }), out)? {
        return Ok(());
    }
    let rows = list
        .iter()
        .map(|j| {
            vec![
                j.spec.name.clone(),
                j.spec.namespace().to_string(),
                schedule_text(j),
                executor_text(&j.spec.executor),
                j.status.paused.to_string(),
                j.status.version.to_string(),
                opt(&j.status.next_fire_at),
            ]
        })
        .collect();
    print_table(&["name", "namespace", "schedule", "executor", "paused", "version", "next fire"], rows);
    Ok(())
}

pub fn job_detail(job: &Job, out: Output) -> anyhow::Result<()> {
    if as_json(job, out)? {
        return Ok(());
    }
    jobs(std::slice::from_ref(job), out)?;
    println!("\n{}", serde_json::to_string_pretty(job)?);
    Ok(())
}

pub fn runs(page: &RunList, out: Output) -> anyhow::Result<()> {
    if as_json(page, out)? {
        return Ok(());
    }
    let rows = page
        .runs
        .iter()
        .map(|r| {
            vec![r.id.clone(), r.job.clone(), r.scheduled_at.clone(), r.state.as_str().to_string(), r.attempt.to_string(), opt(&r.reason)]
        })
        .collect();
    print_table(&["id", "job", "scheduled at", "state", "attempt", "reason"], rows);
    if let Some(c) = &page.next_cursor {
        println!("(more: --cursor {c})");
    }
    Ok(())
}

pub fn run_detail(v: &Run, out: Output) -> anyhow::Result<()> {
    if as_json(v, out)? {
        return Ok(());
    }
    println!("run        {}", v.id);
    println!("job        {}/{}", v.namespace, v.job);
    println!("scheduled  {}", v.scheduled_at);
    println!("fired      {}", v.fired_at);
    println!("state      {} (attempt {})", v.state.as_str(), v.attempt);
    if let Some(r) = &v.reason {
        println!("reason     {r}");
    }
    if let Some(w) = &v.waiting_for {
        println!("waiting    {w}");
    }
    for a in v.attempts.iter().flatten() {
        println!(
            "\nattempt {}  worker {}  token {}  {}  exit {}  {} .. {}",
            a.attempt,
            a.worker,
            a.token,
            a.state.as_str(),
            opt(&a.exit_code),
            opt(&a.started_at),
            opt(&a.ended_at)
        );
        if let Some(o) = a.output.as_deref().filter(|o| !o.is_empty()) {
            for line in o.lines() {
                println!("  | {line}");
            }
        }
    }
    Ok(())
}

pub fn triggered(t: &TriggerAnswer, out: Output) -> anyhow::Result<()> {
    match t {
        TriggerAnswer::One(run) => run_detail(run, out),
        TriggerAnswer::Many(many) => {
            if as_json(many, out)? {
                return Ok(());
            }
            println!("created {} runs", many.count);
            for id in &many.ids {
                println!("{id}");
            }
            Ok(())
        }
    }
}

pub fn workers(v: &WorkerList, out: Output) -> anyhow::Result<()> {
    if as_json(v, out)? {
        return Ok(());
    }
    let rows = v
        .workers
        .iter()
        .map(|w| {
            let labels: Vec<String> = w.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            vec![
                w.id.clone(),
                serde_json::to_value(w.state).ok().and_then(|s| s.as_str().map(str::to_string)).unwrap_or_default(),
                w.running.to_string(),
                w.capacity.to_string(),
                w.prefetch.to_string(),
                if labels.is_empty() { "-".into() } else { labels.join(",") },
                w.lease_expires_at.clone(),
            ]
        })
        .collect();
    print_table(&["id", "state", "running", "capacity", "prefetch", "labels", "lease expires"], rows);
    Ok(())
}

pub fn cluster(v: &ClusterStatus, out: Output) -> anyhow::Result<()> {
    if as_json(v, out)? {
        return Ok(());
    }
    println!("this member: {}  state: {}  term: {}  leader: {}  applied: {}", v.this, v.state, v.term, opt(&v.leader), opt(&v.applied));
    let rows = v.members.iter().map(|m| vec![m.id.to_string(), m.address.clone(), m.role.clone(), opt(&m.matched)]).collect();
    print_table(&["id", "address", "role", "matched"], rows);
    Ok(())
}

pub fn leader(v: &Leader, out: Output) -> anyhow::Result<()> {
    if as_json(v, out)? {
        return Ok(());
    }
    print_table(
        &["scope", "backend", "holder", "token", "address", "since"],
        vec![vec![v.scope.clone(), v.backend.clone(), opt(&v.holder), opt(&v.token), opt(&v.address), opt(&v.since)]],
    );
    Ok(())
}

pub fn preview(v: &SchedulePreview, out: Output) -> anyhow::Result<()> {
    if as_json(v, out)? {
        return Ok(());
    }
    println!("next fire times after {} ({}):", v.after, v.timezone);
    let rows = v
        .fires
        .iter()
        .map(|f| {
            let change = f.offset_changed_from.as_ref().map(|from| format!("clocks changed {from} → {}", f.offset)).unwrap_or_default();
            let note = match (change.is_empty(), &f.note) {
                (_, None) => change,
                (true, Some(n)) => n.clone(),
                (false, Some(n)) => format!("{change}; {n}"),
            };
            vec![f.local.clone(), f.at.clone(), note]
        })
        .collect();
    print_table(&["local time", "utc", "daylight saving"], rows);
    if v.fires.is_empty() {
        println!("(this schedule does not fire again)");
    }
    Ok(())
}
