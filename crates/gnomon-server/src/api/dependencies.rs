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
use super::state::ApiState;

/// Refuses a job write that would let one run make more dependency runs
/// than its namespace's `downstream_runs` quota (429): with `spec`'s
/// edges, no job of the namespace may have more jobs after it, at any
/// depth. Checked against the jobs as read before the write: racing
/// writes may pass it together, and a trigger is checked again by the
/// leader against the runs it would really make.
pub(super) async fn check_fan_out(state: &ApiState, spec: &gnomon_core::spec::JobSpec) -> ApiResult<()> {
    // Only an edge into the graph adds downstream runs to the jobs above.
    if spec.after.is_empty() {
        return Ok(());
    }
    let ns = spec.namespace();
    let limit = state.node.config.leader.quotas.of(ns).downstream_runs;
    let mut graph: std::collections::BTreeMap<String, Vec<String>> = state
        .node
        .store
        .list_jobs(Some(ns))
        .await?
        .into_iter()
        .map(|j| (j.name, j.spec.after.into_iter().map(|e| e.job).collect()))
        .collect();
    graph.insert(spec.name.clone(), spec.after.iter().map(|e| e.job.clone()).collect());
    let most = most_downstream(&spec.name, &graph);
    gnomon_core::quota::Quota { downstream_runs: limit, ..Default::default() }
        .check(ns, gnomon_core::quota::QuotaName::DownstreamRuns, 0, most)
        .map_err(Into::into)
}

/// The most jobs after one job (at any depth) among `job` and the jobs it
/// runs after, in `graph` (job → its upstreams). Cycles end the walk.
fn most_downstream(job: &str, graph: &std::collections::BTreeMap<String, Vec<String>>) -> u64 {
    use std::collections::{BTreeMap, BTreeSet};
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, ups) in graph {
        for u in ups {
            children.entry(u.as_str()).or_default().push(name.as_str());
        }
    }
    let walk = |start: &str, next: &dyn Fn(&str) -> Vec<String>| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start.to_string()];
        while let Some(n) = todo.pop() {
            for m in next(&n) {
                if m != start && seen.insert(m.clone()) {
                    todo.push(m);
                }
            }
        }
        seen
    };
    let ups = |n: &str| graph.get(n).cloned().unwrap_or_default();
    let downs = |n: &str| children.get(n).map(|c| c.iter().map(|s| s.to_string()).collect()).unwrap_or_default();
    let mut above = walk(job, &ups);
    above.insert(job.to_string());
    above.iter().map(|a| walk(a, &downs).len() as u64).max().unwrap_or(0)
}

/// The graph of the run's instant, and for a waiting run what it waits
/// for; `None` for a run of a job with neither upstreams nor dependents.
/// It reads the runs its record names and the jobs after its own, never
/// the rest of the namespace.
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
    // Only the jobs after the run's own are read (the store's edge index).
    let jobs = store.dependents(&run.namespace, &run.job).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_downstream_counts_every_depth_once() {
        let g = |edges: &[(&str, &[&str])]| -> std::collections::BTreeMap<String, Vec<String>> {
            edges.iter().map(|(j, ups)| (j.to_string(), ups.iter().map(|u| u.to_string()).collect())).collect()
        };
        // a → b → c, a → d → c: a has b, c, d after it.
        let graph = g(&[("a", &[]), ("b", &["a"]), ("d", &["a"]), ("c", &["b", "d"])]);
        assert_eq!(most_downstream("c", &graph), 3);
        assert_eq!(most_downstream("b", &graph), 3, "b's upstream a counts");
        // A cycle does not loop.
        let cycle = g(&[("x", &["y"]), ("y", &["x"])]);
        assert_eq!(most_downstream("x", &cycle), 1);
    }
}
