//! The API's side of job dependencies: a job's edges are checked against
//! its namespace when it is written (every upstream exists, no cycle), a
//! job others run after is not deleted, and a run's answer shows the graph
//! of its instant.

use axum::http::StatusCode;
use gnomon_api::{GraphRun, RunGraph};
use gnomon_backend::{dep_run_id, upstream_candidates, RunRecord, Store};
use gnomon_core::deps::{check_graph, dependents, Graph, RunAfter};
use gnomon_core::spec::JobSpec;
use gnomon_core::RunState;

use super::error::{ApiError, ApiResult};

/// The namespace's dependency graph as stored (each job's upstreams).
async fn namespace_graph(store: &dyn Store, namespace: &str) -> ApiResult<(Graph, Vec<gnomon_backend::JobRecord>)> {
    let jobs = store.list_jobs(Some(namespace)).await?;
    let graph = jobs.iter().map(|j| (j.name.clone(), j.spec.after.iter().map(|e| e.job.clone()).collect())).collect();
    Ok((graph, jobs))
}

/// Refuses a job whose edges name a job its namespace does not have, or
/// close a cycle (with its path), as a conflict with the jobs the
/// namespace holds (409); nothing is written then.
pub(super) async fn check_edges(store: &dyn Store, spec: &JobSpec) -> ApiResult<()> {
    if spec.after.is_empty() {
        return Ok(());
    }
    let (graph, _) = namespace_graph(store, spec.namespace()).await?;
    check_graph(&spec.name, &spec.after, &graph).map_err(|e| ApiError::from(e).conflict())
}

/// Refuses to delete a job that others run after (409 `has_dependents`,
/// naming them): their runs would wait for a job that no longer fires.
pub(super) async fn check_no_dependents(store: &dyn Store, namespace: &str, name: &str) -> ApiResult<()> {
    let (graph, _) = namespace_graph(store, namespace).await?;
    let names = dependents(name, &graph);
    if names.is_empty() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "has_dependents",
        format!("{} run after {namespace}/{name}: remove it from their `after` first", names.join(", ")),
    ))
}

/// The graph of the run's instant, and for a waiting run what it waits
/// for; `None` for a run of a job with neither upstreams nor dependents.
pub(super) async fn instant_graph(store: &dyn Store, run: &RunRecord) -> ApiResult<(Option<RunGraph>, Option<String>)> {
    let at = run.scheduled_at;
    let mut graph = RunGraph::default();
    let mut waiting_for = Vec::new();
    if let Some(after) = run.upstream.as_deref().and_then(RunAfter::parse) {
        for (edge, candidates) in after.edges.iter().zip(upstream_candidates(&after, at)) {
            let mut found = Vec::new();
            for id in candidates {
                if let Some(d) = store.get_run(&id).await? {
                    found.push((id, d.run.state));
                }
            }
            if found.is_empty() || found.iter().any(|(_, s)| !s.is_terminal()) {
                waiting_for.push(edge.job.clone());
            }
            if found.is_empty() {
                graph.upstream.push(GraphRun { job: edge.job.clone(), on: edge.on, id: None, state: None });
            }
            for (id, state) in found {
                graph.upstream.push(GraphRun { job: edge.job.clone(), on: edge.on, id: Some(id), state: Some(state) });
            }
        }
    }
    let (_, jobs) = namespace_graph(store, &run.namespace).await?;
    for job in jobs.iter() {
        let Some(edge) = job.spec.after.iter().find(|e| e.job == run.job) else { continue };
        let id = dep_run_id(&job.uid, at);
        let state = store.get_run(&id).await?.map(|d| d.run.state);
        graph.downstream.push(GraphRun { job: job.name.clone(), on: edge.on, id: state.map(|_| id), state });
    }
    let waiting = (run.state == RunState::Waiting && !waiting_for.is_empty()).then(|| format!("after: {}", waiting_for.join(", ")));
    if graph.upstream.is_empty() && graph.downstream.is_empty() {
        return Ok((None, waiting));
    }
    Ok((Some(graph), waiting))
}
