//! Readable tables (default), JSON, JSON lines or YAML (`--output`) of the
//! API's answers.

use gnomon_api::{ClusterStatus, Job, Leader, Run, RunList, SchedulePreview, TriggerAnswer, WorkerList};
use gnomon_core::spec::Executor;
use serde::Serialize;

use crate::Output;

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(T::to_string).unwrap_or_else(|| "-".into())
}

fn print_table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut table = comfy_table::Table::new();
    table
        .load_style(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(headers.iter().map(|h| h.to_uppercase()));
    for r in rows {
        table.add_row(r);
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    for line in table.lines() {
        println!("{}", line.trim_end());
    }
}

/// Prints `v` in a structured format and returns true, or returns false
/// for a table.
fn structured(v: &impl Serialize, out: Output) -> anyhow::Result<bool> {
    match out {
        Output::Table => return Ok(false),
        Output::Json => println!("{}", serde_json::to_string_pretty(v)?),
        Output::Jsonl => println!("{}", serde_json::to_string(v)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(v)?),
    }
    Ok(true)
}

/// As [`structured`] for a list: JSON lines print one item a line, the
/// other formats the whole answer.
fn structured_list<T: Serialize>(whole: &impl Serialize, items: &[T], out: Output) -> anyhow::Result<bool> {
    if out == Output::Jsonl {
        for item in items {
            println!("{}", serde_json::to_string(item)?);
        }
        return Ok(true);
    }
    structured(whole, out)
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
    if structured_list(&serde_json::json!({ "jobs": list }), list, out)? {
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
    if structured(job, out)? {
        return Ok(());
    }
    jobs(std::slice::from_ref(job), out)?;
    println!("\n{}", serde_json::to_string_pretty(job)?);
    Ok(())
}

pub fn runs(page: &RunList, out: Output) -> anyhow::Result<()> {
    if structured_list(page, &page.runs, out)? {
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
    if structured(v, out)? {
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
    if let Some(serde_json::Value::Object(params)) = &v.params {
        for (i, (k, value)) in params.iter().enumerate() {
            println!("{:<11}{k} = {value}", if i == 0 { "params" } else { "" });
        }
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
    if let Some(g) = &v.graph {
        println!();
        let side = |name: &str, list: &[gnomon_api::GraphRun]| -> Vec<Vec<String>> {
            list.iter()
                .map(|r| {
                    let state = r.state.map(|s| s.as_str().to_string()).unwrap_or_else(|| "(no run)".into());
                    vec![name.to_string(), r.job.clone(), r.on.as_str().to_string(), state, opt(&r.id)]
                })
                .collect()
        };
        let mut rows = side("upstream", &g.upstream);
        rows.extend(side("downstream", &g.downstream));
        print_table(&["graph", "job", "on", "state", "run"], rows);
    }
    let notes = v.notifications.as_deref().unwrap_or_default();
    if !notes.is_empty() {
        println!();
        let rows = notes
            .iter()
            .map(|n| {
                let detail = match (&n.next_at, &n.last_error) {
                    (Some(at), Some(e)) => format!("{e}; next at {at}"),
                    (Some(at), None) => format!("next at {at}"),
                    (None, e) => opt(e),
                };
                vec![n.outcome.clone(), n.kind.clone(), n.destination.clone(), n.state.clone(), n.attempts.to_string(), detail]
            })
            .collect();
        print_table(&["notify", "kind", "to", "state", "tries", "detail"], rows);
    }
    Ok(())
}

fn backfill_row(b: &gnomon_api::Backfill) -> Vec<String> {
    vec![
        b.id.clone(),
        format!("{}/{}", b.namespace, b.job),
        format!("{} .. {}", b.from, b.to),
        b.state.clone(),
        format!("{}/{}", b.created + b.kept, b.total),
        b.created.to_string(),
        b.kept.to_string(),
        format!("{}/s", b.rate),
    ]
}

const BACKFILL_HEADERS: [&str; 8] = ["id", "job", "range", "state", "done", "created", "kept", "rate"];

pub fn backfills(list: &gnomon_api::BackfillList, out: Output) -> anyhow::Result<()> {
    if structured_list(list, &list.backfills, out)? {
        return Ok(());
    }
    print_table(&BACKFILL_HEADERS, list.backfills.iter().map(backfill_row).collect());
    Ok(())
}

pub fn backfill(b: &gnomon_api::Backfill, out: Output) -> anyhow::Result<()> {
    if structured(b, out)? {
        return Ok(());
    }
    print_table(&BACKFILL_HEADERS, vec![backfill_row(b)]);
    if let Some(r) = &b.reason {
        println!("\n{r}");
    }
    Ok(())
}

/// A webhook call's answer: its run's id and state.
pub fn hook_run(run: &gnomon_api::HookRun, out: Output) -> anyhow::Result<()> {
    if !structured(run, out)? {
        println!("{} {}", run.id, run.state.as_str());
    }
    Ok(())
}

pub fn triggered(t: &TriggerAnswer, out: Output) -> anyhow::Result<()> {
    match t {
        TriggerAnswer::One(run) => run_detail(run, out),
        TriggerAnswer::Many(many) => {
            if structured(many, out)? {
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
    if structured_list(v, &v.workers, out)? {
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
                w.namespaces.as_ref().map_or_else(|| "all".into(), |n| n.join(",")),
                w.lease_expires_at.clone(),
            ]
        })
        .collect();
    print_table(&["id", "state", "running", "capacity", "prefetch", "labels", "namespaces", "lease expires"], rows);
    Ok(())
}

pub fn cluster(v: &ClusterStatus, out: Output) -> anyhow::Result<()> {
    if structured(v, out)? {
        return Ok(());
    }
    println!("this member: {}  state: {}  term: {}  leader: {}  applied: {}", v.this, v.state, v.term, opt(&v.leader), opt(&v.applied));
    let rows = v.members.iter().map(|m| vec![m.id.to_string(), m.address.clone(), m.role.clone(), opt(&m.matched)]).collect();
    print_table(&["id", "address", "role", "matched"], rows);
    Ok(())
}

pub fn leader(v: &Leader, out: Output) -> anyhow::Result<()> {
    if structured(v, out)? {
        return Ok(());
    }
    print_table(
        &["scope", "backend", "holder", "token", "address", "since"],
        vec![vec![v.scope.clone(), v.backend.clone(), opt(&v.holder), opt(&v.token), opt(&v.address), opt(&v.since)]],
    );
    Ok(())
}

pub fn preview(v: &SchedulePreview, out: Output) -> anyhow::Result<()> {
    if structured(v, out)? {
        return Ok(());
    }
    println!("next fire times after {} ({}):", v.after, v.timezone);
    match (&v.start_at, &v.end_at) {
        (Some(from), Some(to)) => println!("instants from {from} to {to} only"),
        (Some(from), None) => println!("instants from {from} on only"),
        (None, Some(to)) => println!("instants up to {to} only"),
        (None, None) => {}
    }
    let jittered = v.fires.iter().any(|f| f.fire_at.is_some());
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
            let mut row = vec![f.local.clone(), f.at.clone()];
            if jittered {
                row.push(f.fire_at.clone().unwrap_or_default());
            }
            row.push(note);
            row
        })
        .collect();
    if jittered {
        print_table(&["local time", "utc", "fires at (jitter)", "daylight saving"], rows);
    } else {
        print_table(&["local time", "utc", "daylight saving"], rows);
    }
    if v.fires.is_empty() {
        println!("(this schedule does not fire again)");
    }
    Ok(())
}

pub fn settings(file: Option<&std::path::Path>, settings: &[crate::config::Setting], out: Output) -> anyhow::Result<()> {
    let whole = serde_json::json!({ "file": file.map(|f| f.display().to_string()), "settings": settings });
    if structured_list(&whole, settings, out)? {
        return Ok(());
    }
    match file {
        Some(f) => println!("configuration file: {}", f.display()),
        None => println!("no configuration file (--config or GNOMON_CONFIG)"),
    }
    let rows = settings
        .iter()
        .filter(|s| s.source != "unset")
        .map(|s| vec![s.name.clone(), s.value.clone(), s.source.to_string(), s.variable.clone().unwrap_or_default()])
        .collect();
    print_table(&["setting", "value", "source", "variable"], rows);
    Ok(())
}
