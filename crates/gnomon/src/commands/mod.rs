//! The client commands: jobs, runs and the cluster, over the typed REST API.

use anyhow::{bail, Context};
use gnomon_api::{
    ClusterStatus, Job, JobList, NewLearner, Removed, Run, RunList, SchedulePreview, SchedulePreviewRequest, TriggerAnswer, TriggerBody,
};
use gnomon_core::spec::ScheduleSpec;

use crate::client::{path_segment, Client, Method};
use crate::{table, ClusterCmd, CreateArgs, JobCmd, Output, PreviewArgs, RunCmd, ScheduleArgs};

impl ScheduleArgs {
    fn spec(self) -> ScheduleSpec {
        ScheduleSpec {
            cron: self.cron,
            timezone: self.timezone,
            every: self.every,
            at: self.at,
            start_at: self.start_at,
            end_at: self.end_at,
            jitter: self.jitter,
        }
    }
}

fn ns_query(ns: &Option<String>) -> Vec<(&'static str, String)> {
    ns.iter().map(|n| ("namespace", n.clone())).collect()
}

fn job_path(name: &str, action: &str) -> String {
    format!("/v1/jobs/{}{action}", path_segment(name))
}

pub(crate) fn create_body(a: CreateArgs) -> anyhow::Result<serde_json::Value> {
    let Some((command, args)) = a.command.split_first() else { bail!("give the command after `--`") };
    let schedule = a.schedule.spec();
    let scheduled = schedule.cron.is_some() || schedule.every.is_some() || schedule.at.is_some();
    let mut spec = serde_json::json!({
        "name": a.name.clone(), "schedule": schedule,
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
    a.pipeline.apply(&mut spec, &a.name, scheduled)?;
    Ok(spec)
}

/// The jobs of a file or of stdin (`-`): one job, an array, or `{"jobs": [...]}`.
fn read_jobs(file: &std::path::Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading stdin")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let doc: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    Ok(match doc {
        serde_json::Value::Array(items) => items,
        serde_json::Value::Object(ref o) if o.contains_key("jobs") => doc["jobs"].as_array().cloned().unwrap_or_default(),
        other => vec![other],
    })
}

pub async fn job(c: &Client, cmd: JobCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        JobCmd::Create(a) => {
            let job: Job = c.call(Method::POST, "/v1/jobs", &[], Some(&create_body(a)?)).await?;
            table::jobs(&[job], out)
        }
        JobCmd::Apply { file } => {
            let mut applied = Vec::new();
            for item in read_jobs(&file)? {
                let name = item.get("name").and_then(|n| n.as_str()).context("every job needs a \"name\"")?.to_string();
                let ns = item.get("namespace").and_then(|n| n.as_str()).map(str::to_string);
                applied.push(c.call::<Job>(Method::PUT, &job_path(&name, ""), &ns_query(&ns), Some(&item)).await?);
            }
            table::jobs(&applied, out)
        }
        JobCmd::List { namespace } => table::jobs(&c.get::<JobList>("/v1/jobs", &ns_query(&namespace)).await?.jobs, out),
        JobCmd::Get(n) => table::job_detail(&c.get(&job_path(&n.name, ""), &ns_query(&n.namespace)).await?, out),
        JobCmd::Trigger { job, count, idempotency_key, params } => {
            let mut q = ns_query(&job.namespace);
            if count != 1 {
                q.push(("count", count.to_string()));
            }
            let headers: Vec<(&str, String)> = idempotency_key.into_iter().map(|k| ("Idempotency-Key", k)).collect();
            let body = TriggerBody { params: params.into_iter().collect() };
            let answer: TriggerAnswer = c.call_with(Method::POST, &job_path(&job.name, "/trigger"), &q, &headers, Some(&body)).await?;
            table::triggered(&answer, out)
        }
        JobCmd::Hook { job, data, data_file, secret_env, idempotency_key } => {
            let body = match (data, data_file) {
                (Some(d), _) => d.into_bytes(),
                (None, Some(p)) if p.as_os_str() == "-" => {
                    let mut b = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut b).context("reading the body from standard input")?;
                    b
                }
                (None, Some(p)) => std::fs::read(&p).with_context(|| format!("--data-file {}", p.display()))?,
                (None, None) => Vec::new(),
            };
            let ns = job.namespace.as_deref().unwrap_or(gnomon_core::spec::DEFAULT_NAMESPACE);
            let vars = match secret_env {
                Some(v) => vec![v],
                None => {
                    let spec: Job = c.get(&job_path(&job.name, ""), &ns_query(&job.namespace)).await?;
                    let Some(hook) = spec.spec.triggers.webhook else {
                        bail!("job {} takes no webhook calls (it has no triggers.webhook)", job.name)
                    };
                    hook.secret_envs(ns)
                }
            };
            let secret = vars.iter().find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()));
            let Some(secret) = secret else { bail!("none of {} (the webhook's secret) is set", vars.join(", ")) };
            let now = chrono::Utc::now().timestamp_millis();
            let key = idempotency_key.unwrap_or_default();
            let signed = gnomon_server::signing::Signed { namespace: ns, job: &job.name, key: &key, body: &body };
            let mut headers =
                vec![("Gnomon-Timestamp", now.to_string()), ("Gnomon-Signature", gnomon_server::signing::signature(&secret, now, &signed))];
            if !key.is_empty() {
                headers.push(("Idempotency-Key", key.clone()));
            }
            let path = format!("/v1/hooks/{}/{}", path_segment(ns), path_segment(&job.name));
            let run: gnomon_api::HookRun = c.post_bytes(&path, &headers, body).await?;
            table::hook_run(&run, out)
        }
        JobCmd::Backfill { job, from, to, params, rate, wait } => {
            let params = (!params.is_empty()).then(|| params.into_iter().collect());
            let request = gnomon_api::BackfillRequest { from, to, params, rate };
            crate::backfill::create(c, crate::backfill::Ask { name: job.name, namespace: job.namespace, request, wait }, out).await
        }
        JobCmd::Preview(p) => preview(c, p, out).await,
        JobCmd::Pause(n) => {
            let job: Job = c.call(Method::POST, &job_path(&n.name, "/pause"), &ns_query(&n.namespace), None::<&()>).await?;
            table::jobs(&[job], out)
        }
        JobCmd::Resume(n) => {
            let job: Job = c.call(Method::POST, &job_path(&n.name, "/resume"), &ns_query(&n.namespace), None::<&()>).await?;
            table::jobs(&[job], out)
        }
        JobCmd::Delete(n) => {
            c.call_empty(Method::DELETE, &job_path(&n.name, ""), &ns_query(&n.namespace)).await?;
            if out == Output::Json {
                println!("{}", serde_json::json!({"deleted": n.name}));
            } else {
                println!("deleted job {}", n.name);
            }
            Ok(())
        }
    }
}

async fn preview(c: &Client, p: PreviewArgs, out: Output) -> anyhow::Result<()> {
    let schedule = match &p.name {
        Some(name) => c.get::<Job>(&job_path(name, ""), &ns_query(&p.namespace)).await?.spec.schedule,
        None if p.schedule.cron.is_none() && p.schedule.every.is_none() && p.schedule.at.is_none() => {
            bail!("name a job, or give a schedule with --cron (and --timezone), --every or --at")
        }
        None => p.schedule.spec(),
    };
    let body = SchedulePreviewRequest { schedule, count: Some(p.count), after: p.after, job: p.name, namespace: p.namespace };
    let answer: SchedulePreview = c.call(Method::POST, "/v1/schedules/preview", &[], Some(&body)).await?;
    table::preview(&answer, out)
}

mod logs;

pub async fn runs(c: &Client, cmd: RunCmd, out: Output) -> anyhow::Result<()> {
    match cmd {
        RunCmd::List { job, state, namespace, limit, cursor, watch } => {
            let mut q = vec![("limit", limit.to_string())];
            q.extend(job.map(|j| ("job", j)));
            q.extend(state.map(|s| ("state", s)));
            q.extend(namespace.map(|n| ("namespace", n)));
            q.extend(cursor.map(|c| ("cursor", c)));
            if watch {
                return watch_runs(c, &q, out).await;
            }
            table::runs(&c.get::<RunList>("/v1/runs", &q).await?, out)
        }
        RunCmd::Get { id } => table::run_detail(&c.get::<Run>(&format!("/v1/runs/{}", path_segment(&id)), &[]).await?, out),
        RunCmd::Cancel { id } => {
            let run: Run = c.call(Method::POST, &format!("/v1/runs/{}/cancel", path_segment(&id)), &[], None::<&()>).await?;
            table::run_detail(&run, out)
        }
        RunCmd::Logs { id, attempt, follow } => logs::print(c, &id, attempt, follow).await,
    }
}

/// `run list --watch`: the newest runs again every 2 s, until interrupted.
/// A table is redrawn; JSON lines print each run whose state changed.
async fn watch_runs(c: &Client, q: &[(&str, String)], out: Output) -> anyhow::Result<()> {
    let mut seen: std::collections::HashMap<String, (gnomon_core::RunState, String)> = std::collections::HashMap::new();
    loop {
        match c.get::<RunList>("/v1/runs", q).await {
            Ok(page) if out == Output::Jsonl => {
                // Oldest first, so the stream reads in time order.
                for run in page.runs.iter().rev() {
                    let now = (run.state, run.updated_at.clone());
                    if seen.get(&run.id) != Some(&now) {
                        println!("{}", serde_json::to_string(run)?);
                        seen.insert(run.id.clone(), now);
                    }
                }
            }
            Ok(page) => {
                // Clear the terminal and draw the page again.
                print!("\x1b[2J\x1b[H");
                println!("{} (every 2 s; Ctrl-C to stop)", chrono_now());
                table::runs(&page, out)?;
            }
            Err(e) => eprintln!("{e:#} (retrying)"),
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

fn chrono_now() -> String {
    gnomon_core::format_millis(gnomon_core::chrono::Utc::now().timestamp_millis())
}

pub async fn cluster(c: &Client, cmd: ClusterCmd, out: Output) -> anyhow::Result<()> {
    let status: ClusterStatus = match cmd {
        ClusterCmd::Status => c.get("/v1/cluster", &[]).await?,
        ClusterCmd::AddLearner { id, address } => {
            c.call(Method::POST, "/v1/cluster/learners", &[], Some(&NewLearner { id, address })).await?
        }
        ClusterCmd::Promote { id } => c.call(Method::POST, &format!("/v1/cluster/members/{id}/promote"), &[], None::<&()>).await?,
        ClusterCmd::Remove { id } => {
            c.call::<Removed>(Method::DELETE, &format!("/v1/cluster/members/{id}"), &[], None::<&()>).await?.status
        }
    };
    table::cluster(&status, out)
}

/// `gnomon worker forget ID`: releases the worker id's binding.
pub async fn forget_worker(c: &Client, id: &str, out: Output) -> anyhow::Result<()> {
    c.call_empty(Method::DELETE, &format!("/v1/workers/{}/binding", path_segment(id)), &[]).await?;
    match out {
        Output::Table => println!("released worker id {id}: the next credential to open a session with it takes it"),
        _ => println!("{}", serde_json::json!({"released": id})),
    }
    Ok(())
}
