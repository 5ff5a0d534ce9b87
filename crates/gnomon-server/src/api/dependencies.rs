//! The API's side of job dependencies: a run's answer shows the graph of
//! its instant. A job's edges are checked against its namespace (every
//! upstream exists, no cycle) and a job others run after is not deleted by
//! the store, in the write's own transaction: its refusals
//! ([`gnomon_backend::StoreError::Graph`], `HasDependents`) become the
//! API's 409 with the spec error's code (a conflict with the jobs the
//! namespace holds) and 409 `has_dependents`.

use gnomon_api::{GraphRun, RunGraph};
use gnomon_backend::{dep_run_id, upstream_candidates, RunRecord, Store};
use gnomon_core::RunState;

use super::error::ApiResult;

/// The graph of the run's instant, and for a waiting run what it waits
/// for; `None` for a run of a job with neither upstreams nor dependents.
pub(super) async fn instant_graph(store: &dyn Store, run: &RunRecord) -> ApiResult<(Option<RunGraph>, Option<String>)> {
    let at = run.scheduled_at;
    let mut graph = RunGraph::default();
    let mut waiting_for = Vec::new();
    if let Some(after) = run.upstream.as_deref() {
        for (edge, candidates) in after.edges.iter().zip(upstream_candidates(after, at)) {
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
    let jobs = store.list_jobs(Some(&run.namespace)).await?;
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
