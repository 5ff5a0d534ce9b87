//! Readable tables (default) or JSON (`--output json`).

use serde_json::Value;

use crate::Output;

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
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

fn json(v: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn schedule_text(j: &Value) -> String {
    let sch = &j["schedule"];
    if let Some(c) = sch["cron"].as_str() {
        format!("cron {c} {}", sch["timezone"].as_str().unwrap_or("UTC"))
    } else if let Some(e) = sch["every"].as_str() {
        format!("every {e}")
    } else if let Some(a) = sch["at"].as_str() {
        format!("at {a}")
    } else {
        "manual".into()
    }
}

pub fn jobs(v: &Value, out: Output) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(v);
    }
    let rows = v["jobs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|j| {
                    vec![
                        s(&j["name"]),
                        s(&j["namespace"]),
                        schedule_text(j),
                        j["executor"].as_object().and_then(|o| o.keys().next().cloned()).unwrap_or_default(),
                        s(&j["status"]["paused"]),
                        s(&j["status"]["version"]),
                        s(&j["status"]["next_fire_at"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    print_table(&["name", "namespace", "schedule", "executor", "paused", "version", "next fire"], rows);
    Ok(())
}

pub fn job_detail(v: &Value, out: Output) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(v);
    }
    jobs(&serde_json::json!({"jobs": [v]}), out)?;
    println!("\n{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub fn runs(v: &Value, out: Output) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(v);
    }
    let rows = v["runs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| vec![s(&r["id"]), s(&r["job"]), s(&r["scheduled_at"]), s(&r["state"]), s(&r["attempt"]), s(&r["reason"])])
                .collect()
        })
        .unwrap_or_default();
    print_table(&["id", "job", "scheduled at", "state", "attempt", "reason"], rows);
    if let Some(c) = v["next_cursor"].as_str() {
        println!("(more: --cursor {c})");
    }
    Ok(())
}

pub fn run_detail(v: &Value, out: Output) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(v);
    }
    println!("run        {}", s(&v["id"]));
    println!("job        {}/{}", s(&v["namespace"]), s(&v["job"]));
    println!("scheduled  {}", s(&v["scheduled_at"]));
    println!("fired      {}", s(&v["fired_at"]));
    println!("state      {} (attempt {})", s(&v["state"]), s(&v["attempt"]));
    if !v["reason"].is_null() {
        println!("reason     {}", s(&v["reason"]));
    }
    for a in v["attempts"].as_array().into_iter().flatten() {
        println!(
            "\nattempt {}  worker {}  token {}  {}  exit {}  {} .. {}",
            s(&a["attempt"]),
            s(&a["worker"]),
            s(&a["token"]),
            s(&a["state"]),
            s(&a["exit_code"]),
            s(&a["started_at"]),
            s(&a["ended_at"])
        );
        if let Some(o) = a["output"].as_str().filter(|o| !o.is_empty()) {
            for line in o.lines() {
                println!("  | {line}");
            }
        }
    }
    Ok(())
}

pub fn workers(v: &Value, out: Output) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(v);
    }
    let rows = v["workers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|w| {
                    vec![
                        s(&w["id"]),
                        s(&w["state"]),
                        s(&w["running"]),
                        s(&w["capacity"]),
                        s(&w["prefetch"]),
                        s(&w["labels"]),
                        s(&w["lease_expires_at"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    print_table(&["id", "state", "running", "capacity", "prefetch", "labels", "lease expires"], rows);
    Ok(())
}

pub fn cluster(v: &Value, out: Output) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(v);
    }
    println!(
        "this member: {}  state: {}  term: {}  leader: {}  applied: {}",
        s(&v["this"]),
        s(&v["state"]),
        s(&v["term"]),
        s(&v["leader"]),
        s(&v["applied"])
    );
    let rows = v["members"]
        .as_array()
        .map(|ms| ms.iter().map(|m| vec![s(&m["id"]), s(&m["address"]), s(&m["role"]), s(&m["matched"])]).collect())
        .unwrap_or_default();
    print_table(&["id", "address", "role", "matched"], rows);
    Ok(())
}

pub fn leader(v: &Value, out: Output) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(v);
    }
    print_table(
        &["scope", "backend", "holder", "token", "address", "since"],
        vec![vec![s(&v["scope"]), s(&v["backend"]), s(&v["holder"]), s(&v["token"]), s(&v["address"]), s(&v["since"])]],
    );
    Ok(())
}
