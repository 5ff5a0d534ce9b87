//! Job dependencies: the `after` edges a job declares, the checks they get
//! when the job is written, and the rule that decides a waiting downstream
//! run from what its upstreams' runs of the same instant came to.
//!
//! A downstream run belongs to one *logical instant*: the `scheduled_at` of
//! the upstream run that made it. It waits until every edge is decided:
//! - an edge is **refused** as soon as one of its upstream's runs at the
//!   instant ends in an outcome the edge does not accept, or when the
//!   upstream has no run at the instant and will get none;
//! - it is **accepted** once every run of the upstream at the instant has
//!   ended, each in an outcome the edge accepts;
//! - otherwise it **waits**.
//!
//! One refused edge skips the run (with the reason); all accepted runs it.
//! Which runs an upstream has at an instant, and whether it will get one,
//! is the server's knowledge; this module only decides.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::spec::{validate_name, MAX_NAME_LEN};
use crate::{RunState, SpecError};

/// The most upstreams one job may name.
pub const MAX_UPSTREAMS: usize = 32;

/// Which outcomes of an upstream's run release the downstream run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum On {
    /// The upstream's run succeeded (the default).
    #[default]
    Succeeded,
    /// The upstream's run failed (its last attempt failed, timed out or was lost).
    Failed,
    /// The upstream's run ended after it ran or was cancelled: succeeded,
    /// failed or cancelled (a skipped instant never ran, and releases no
    /// edge).
    Any,
}

impl On {
    /// The edge's name as the spec writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            On::Succeeded => "succeeded",
            On::Failed => "failed",
            On::Any => "any",
        }
    }

    /// Whether a run that ended in `state` releases the edge.
    pub fn accepts(self, state: RunState) -> bool {
        match self {
            On::Succeeded => state == RunState::Succeeded,
            On::Failed => state == RunState::Failed,
            On::Any => state.is_terminal() && state != RunState::Skipped,
        }
    }
}

/// One dependency: a job of the same namespace, and the outcomes of its
/// runs that release this job's run of the same instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AfterEdge {
    /// The upstream job's name, in this job's namespace: an existing job,
    /// not the job itself, named by one edge only.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub job: String,
    /// `succeeded` (default), `failed` or `any`.
    #[serde(default)]
    pub on: On,
}

/// Checks a job's edges on their own: each names a job of the same
/// namespace (a plain name), not the job itself, once, and there are at
/// most [`MAX_UPSTREAMS`].
pub fn validate_edges(name: &str, edges: &[AfterEdge]) -> Result<(), SpecError> {
    if edges.len() > MAX_UPSTREAMS {
        return Err(SpecError::new("invalid_after", "after", format!("{} upstreams; at most {MAX_UPSTREAMS}", edges.len())));
    }
    let mut seen = BTreeSet::new();
    for (i, edge) in edges.iter().enumerate() {
        let field = format!("after[{i}].job");
        if edge.job.contains('/') {
            return Err(SpecError::new(
                "cross_namespace",
                field,
                format!("{:?} names another namespace; a job depends only on jobs of its own namespace", edge.job),
            ));
        }
        validate_name(&field, &edge.job, MAX_NAME_LEN)?;
        if edge.job == name {
            return Err(SpecError::new("dependency_cycle", field, format!("{name} cannot run after itself")));
        }
        if !seen.insert(edge.job.as_str()) {
            return Err(SpecError::new("invalid_after", field, format!("{:?} is named twice", edge.job)));
        }
    }
    Ok(())
}

/// What a dependency run records of where it came from: the run whose
/// fire made it, and its job's edges as they were then, each with the
/// upstream's uid (a job deleted and created again is another job). The
/// edges recorded decide the run, whatever becomes of its job's spec while
/// it waits. Stored with the run as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAfter {
    /// The id of the upstream run that made this one…
    pub of: String,
    /// …and its job's uid.
    pub of_uid: String,
    /// The job's edges when the run was made, in the order it declared them.
    pub edges: Vec<StoredEdge>,
}

/// One edge as a dependency run records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEdge {
    /// The upstream job's name…
    pub job: String,
    /// …and its uid when the run was made.
    pub uid: String,
    /// The outcomes of the upstream's runs that release the edge.
    #[serde(default)]
    pub on: On,
}

impl RunAfter {
    /// The record as the run stores it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The record in `text`; `None` when it is not one.
    pub fn parse(text: &str) -> Option<RunAfter> {
        serde_json::from_str(text).ok()
    }
}

/// A namespace's dependency graph: each job's upstreams, by name.
pub type Graph = BTreeMap<String, Vec<String>>;

/// Checks `job`'s edges against the other jobs of its namespace (`others`,
/// each with its upstreams; `job`'s stored entry, if any, is ignored):
/// every upstream exists (`unknown_upstream`), and no path of edges leads
/// from `job` back to itself (`dependency_cycle`, with the path).
pub fn check_graph(job: &str, edges: &[AfterEdge], others: &Graph) -> Result<(), SpecError> {
    for (i, edge) in edges.iter().enumerate() {
        if !others.contains_key(&edge.job) || edge.job == job {
            return Err(SpecError::new("unknown_upstream", format!("after[{i}].job"), format!("no job {:?} in this namespace", edge.job)));
        }
    }
    let upstreams_of = |name: &str| -> Vec<String> {
        if name == job {
            edges.iter().map(|e| e.job.clone()).collect()
        } else {
            others.get(name).cloned().unwrap_or_default()
        }
    };
    // Depth-first from `job` along upstream edges; reaching `job` again is
    // a cycle, reported in the order the runs would wait: job after ….
    let mut path = vec![job.to_string()];
    let mut stack: Vec<(Vec<String>, usize)> = vec![(upstreams_of(job), 0)];
    let mut done: BTreeSet<String> = BTreeSet::new();
    while let Some((next, i)) = stack.last_mut() {
        let Some(up) = next.get(*i).cloned() else {
            stack.pop();
            if let Some(finished) = path.pop() {
                done.insert(finished);
            }
            continue;
        };
        *i += 1;
        if up == job {
            path.push(up);
            let shown: Vec<&str> = path.iter().rev().map(String::as_str).collect();
            return Err(SpecError::new("dependency_cycle", "after", format!("the edges make a cycle: {}", shown.join(" → "))));
        }
        if done.contains(&up) || path.contains(&up) {
            continue;
        }
        stack.push((upstreams_of(&up), 0));
        path.push(up);
    }
    Ok(())
}

/// The jobs of `graph` that name `job` as an upstream, by name.
pub fn dependents<'a>(job: &str, graph: &'a Graph) -> Vec<&'a str> {
    graph.iter().filter(|(_, ups)| ups.iter().any(|u| u == job)).map(|(name, _)| name.as_str()).collect()
}

/// What one run of an upstream at the instant has come to, as the server
/// knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamRun {
    /// It exists and has not ended.
    Open,
    /// It ended in this state.
    Ended(RunState),
    /// It does not exist yet, and the upstream's timeline will still make it.
    Expected,
    /// It does not exist and never will (the upstream has no such instant,
    /// passed it, is paused at it or was deleted).
    Absent,
}

/// An edge at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EdgeState {
    /// A run of the upstream at the instant is open or expected.
    Waiting,
    /// Every run of the upstream at the instant ended as the edge accepts.
    Accepted,
    /// The edge cannot release the run: why, for the run's reason.
    Refused(String),
}

/// Decides one edge from the upstream's runs at the instant (its
/// scheduled run, its own dependency run, the run that made the downstream
/// one: whichever the server looks at).
pub fn edge_state(upstream: &str, on: On, runs: &[UpstreamRun]) -> EdgeState {
    if let Some(state) = runs.iter().find_map(|r| match r {
        UpstreamRun::Ended(s) if !on.accepts(*s) => Some(*s),
        _ => None,
    }) {
        return EdgeState::Refused(format!("{upstream} ended {}; the edge runs on {}", state.as_str(), on.as_str()));
    }
    if runs.iter().any(|r| matches!(r, UpstreamRun::Open | UpstreamRun::Expected)) {
        return EdgeState::Waiting;
    }
    if runs.iter().any(|r| matches!(r, UpstreamRun::Ended(_))) {
        EdgeState::Accepted
    } else {
        EdgeState::Refused(format!("{upstream} has no run at this instant"))
    }
}

/// What becomes of a waiting run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// Some edges are still open: the upstreams it waits for, in edge order.
    Wait(Vec<String>),
    /// Every edge accepted: the run becomes pending.
    Run,
    /// An edge refused: the run is recorded skipped with this reason.
    Skip(String),
}

/// Decides a waiting run from its edges, each as (upstream, state), in
/// the order the job declares them: the first refused edge skips it.
pub fn decide(edges: &[(String, EdgeState)]) -> Release {
    if let Some(reason) = edges.iter().find_map(|(_, s)| match s {
        EdgeState::Refused(why) => Some(why.clone()),
        _ => None,
    }) {
        return Release::Skip(format!("after: {reason}"));
    }
    let waiting: Vec<String> = edges.iter().filter(|(_, s)| *s == EdgeState::Waiting).map(|(u, _)| u.clone()).collect();
    if waiting.is_empty() {
        Release::Run
    } else {
        Release::Wait(waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(job: &str, on: On) -> AfterEdge {
        AfterEdge { job: job.into(), on }
    }

    fn graph(entries: &[(&str, &[&str])]) -> Graph {
        entries.iter().map(|(j, ups)| (j.to_string(), ups.iter().map(|u| u.to_string()).collect())).collect()
    }

    #[test]
    fn an_edge_defaults_to_succeeded_and_refuses_unknown_fields() {
        let e: AfterEdge = serde_json::from_str(r#"{"job": "load"}"#).unwrap();
        assert_eq!(e, edge("load", On::Succeeded));
        assert!(serde_json::from_str::<AfterEdge>(r#"{"job": "load", "on": "maybe"}"#).is_err());
        assert!(serde_json::from_str::<AfterEdge>(r#"{"job": "load", "when": "x"}"#).is_err());
    }

    #[test]
    fn edges_name_other_jobs_of_the_namespace_once() {
        assert!(validate_edges("report", &[edge("load", On::Succeeded), edge("clean", On::Any)]).is_ok());
        let e = validate_edges("report", &[edge("report", On::Any)]).unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("dependency_cycle", "after[0].job"));
        let e = validate_edges("report", &[edge("load", On::Any), edge("load", On::Failed)]).unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("invalid_after", "after[1].job"));
        let e = validate_edges("report", &[edge("other/load", On::Any)]).unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("cross_namespace", "after[0].job"));
        let e = validate_edges("report", &[edge("", On::Any)]).unwrap_err();
        assert_eq!(e.code, "invalid_name");
        let many: Vec<AfterEdge> = (0..=MAX_UPSTREAMS).map(|i| edge(&format!("j{i}"), On::Any)).collect();
        assert_eq!(validate_edges("report", &many).unwrap_err().code, "invalid_after");
    }

    #[test]
    fn an_unknown_upstream_is_named() {
        let g = graph(&[("load", &[]), ("report", &[])]);
        let e = check_graph("report", &[edge("load", On::Succeeded), edge("lod", On::Succeeded)], &g).unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("unknown_upstream", "after[1].job"));
        assert!(e.message.contains("\"lod\""), "{e}");
        assert!(check_graph("report", &[edge("load", On::Succeeded)], &g).is_ok());
    }

    #[test]
    fn a_cycle_is_refused_with_its_path() {
        // load ← transform ← report; load after report closes the circle.
        let g = graph(&[("load", &[]), ("transform", &["load"]), ("report", &["transform"])]);
        let e = check_graph("load", &[edge("report", On::Succeeded)], &g).unwrap_err();
        assert_eq!((e.code, e.field.as_str()), ("dependency_cycle", "after"));
        assert!(e.message.ends_with("load → transform → report → load"), "{e}");
        // A diamond is no cycle, and a job's stored edges are replaced.
        let g = graph(&[("a", &[]), ("b", &["a"]), ("c", &["a"]), ("d", &["a"])]);
        assert!(check_graph("d", &[edge("b", On::Any), edge("c", On::Any)], &g).is_ok());
        // A cycle elsewhere (two writes that raced) is not this write's.
        let g = graph(&[("x", &["y"]), ("y", &["x"]), ("a", &[])]);
        assert!(check_graph("b", &[edge("a", On::Any), edge("x", On::Any)], &g).is_ok());
    }

    #[test]
    fn the_dependents_of_a_job_are_found() {
        let g = graph(&[("load", &[]), ("transform", &["load"]), ("audit", &["load", "transform"])]);
        assert_eq!(dependents("load", &g), ["audit", "transform"]);
        assert!(dependents("audit", &g).is_empty());
    }

    #[test]
    fn an_edge_waits_accepts_or_refuses() {
        use UpstreamRun::*;
        assert_eq!(edge_state("a", On::Succeeded, &[Open]), EdgeState::Waiting);
        assert_eq!(edge_state("a", On::Succeeded, &[Expected, Absent]), EdgeState::Waiting);
        assert_eq!(edge_state("a", On::Succeeded, &[Ended(RunState::Succeeded), Absent]), EdgeState::Accepted);
        assert_eq!(edge_state("a", On::Failed, &[Ended(RunState::Failed)]), EdgeState::Accepted);
        assert_eq!(edge_state("a", On::Any, &[Ended(RunState::Cancelled)]), EdgeState::Accepted);
        // A refusal does not wait for the rest.
        let refused = edge_state("a", On::Succeeded, &[Ended(RunState::Failed), Open]);
        assert_eq!(refused, EdgeState::Refused("a ended failed; the edge runs on succeeded".into()));
        assert!(matches!(edge_state("a", On::Failed, &[Ended(RunState::Skipped)]), EdgeState::Refused(_)));
        // No run at the instant, and none to come.
        assert_eq!(edge_state("a", On::Any, &[Absent]), EdgeState::Refused("a has no run at this instant".into()));
        assert_eq!(edge_state("a", On::Any, &[]), EdgeState::Refused("a has no run at this instant".into()));
    }

    #[test]
    fn a_run_waits_for_every_edge_and_skips_on_the_first_refusal() {
        let w = |u: &str| (u.to_string(), EdgeState::Waiting);
        let ok = |u: &str| (u.to_string(), EdgeState::Accepted);
        let no = |u: &str| (u.to_string(), EdgeState::Refused(format!("{u} ended failed")));
        assert_eq!(decide(&[ok("a"), w("b"), w("c")]), Release::Wait(vec!["b".into(), "c".into()]));
        assert_eq!(decide(&[ok("a"), ok("b")]), Release::Run);
        assert_eq!(decide(&[w("a"), no("b"), no("c")]), Release::Skip("after: b ended failed".into()));
        assert_eq!(decide(&[]), Release::Run);
    }

    #[test]
    fn a_runs_record_of_its_edges_round_trips() {
        let after = RunAfter {
            of: "u1-1000".into(),
            of_uid: "u1".into(),
            edges: vec![StoredEdge { job: "load".into(), uid: "u1".into(), on: On::Any }],
        };
        assert_eq!(RunAfter::parse(&after.to_json()), Some(after));
        assert_eq!(RunAfter::parse("not json"), None);
    }

    #[test]
    fn on_accepts_only_terminal_states() {
        for s in crate::run::ALL_RUN_STATES {
            assert_eq!(On::Any.accepts(s), s.is_terminal() && s != RunState::Skipped);
            assert_eq!(On::Succeeded.accepts(s), s == RunState::Succeeded);
            assert_eq!(On::Failed.accepts(s), s == RunState::Failed);
        }
    }
}
