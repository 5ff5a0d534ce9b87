//! [`DepGraph`]: the dependency edges of the jobs the leader holds, by
//! upstream name, and the plan of the dependency runs an upstream run makes.
//! Owned by [`JobTimeline`](crate::timeline::JobTimeline), which keeps it in step with its entries (a job
//! is in the graph exactly while it has an entry).
//!
//! Invariants (checked by the tests below):
//! - a job named by `dependents` or `by_name` has a node, and removing the
//!   node removes it from both;
//! - the runs one upstream run makes are one per job reachable from its
//!   job along the edges, each once, however the edges fan out and in (and
//!   even if writes that raced left a cycle).

use crate::HashMap;
use gnomon_core::Millis;
use gnomon_core::RunState;
use gnomon_records::NewRun;
use std::sync::Arc;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gnomon_core::deps::{AfterEdge, RunAfter, StoredEdge};
use gnomon_core::params::{inherit, ParamSpec, Params};

/// What the graph keeps of a job.
#[derive(Debug, Clone)]
struct Node {
    namespace: String,
    name: String,
    after: Box<[AfterEdge]>,
    declared: Option<Arc<BTreeMap<String, ParamSpec>>>,
}

/// The edges of the held jobs.
#[derive(Default)]
pub struct DepGraph {
    nodes: HashMap<String, Node>,
    /// (namespace, name) → uid of the job held under that name.
    by_name: HashMap<(String, String), String>,
    /// (namespace, upstream name) → the uids of the jobs that run after it.
    dependents: HashMap<(String, String), BTreeSet<String>>,
}

impl DepGraph {
    /// Puts a job's edges in (replacing what it had).
    pub fn set(&mut self, uid: &str, namespace: &str, name: &str, after: &[AfterEdge], declared: Option<Arc<BTreeMap<String, ParamSpec>>>) {
        self.remove(uid);
        for e in after {
            self.dependents.entry((namespace.to_string(), e.job.clone())).or_default().insert(uid.to_string());
        }
        self.by_name.insert((namespace.to_string(), name.to_string()), uid.to_string());
        self.nodes.insert(
            uid.to_string(),
            Node { namespace: namespace.into(), name: name.into(), after: after.to_vec().into_boxed_slice(), declared },
        );
    }

    /// Takes a job out.
    pub fn remove(&mut self, uid: &str) {
        let Some(node) = self.nodes.remove(uid) else { return };
        for e in node.after.iter() {
            let key = (node.namespace.clone(), e.job.clone());
            if let Some(set) = self.dependents.get_mut(&key) {
                set.remove(uid);
                if set.is_empty() {
                    self.dependents.remove(&key);
                }
            }
        }
        let key = (node.namespace, node.name);
        if self.by_name.get(&key).is_some_and(|u| u == uid) {
            self.by_name.remove(&key);
        }
    }

    /// The uid of the job held as `namespace/name`.
    pub fn uid_of(&self, namespace: &str, name: &str) -> Option<&String> {
        self.by_name.get(&(namespace.to_string(), name.to_string()))
    }

    /// The uids of the jobs a job runs after (those held).
    pub fn upstreams_of(&self, uid: &str) -> Vec<String> {
        let Some(node) = self.nodes.get(uid) else { return Vec::new() };
        node.after.iter().filter_map(|e| self.uid_of(&node.namespace, &e.job).cloned()).collect()
    }

    /// Whether any held job runs after another.
    pub fn is_empty(&self) -> bool {
        self.dependents.is_empty()
    }

    /// The dependency runs that the run `made_by` of job `uid` at `at`
    /// makes: one `waiting` run per job downstream of it (the whole
    /// closure, each job once), each recording the run that made it (the
    /// upstream's run on the first path found, breadth first) and its
    /// edges, with its params inherited from that run.
    pub fn closure(&self, uid: &str, at: Millis, made_by: &str, params: Option<&str>, now: Millis) -> Vec<NewRun> {
        let mut out = Vec::new();
        if self.is_empty() {
            return out;
        }
        let Some(root) = self.nodes.get(uid) else { return out };
        let mut seen: BTreeSet<&str> = BTreeSet::from([uid]);
        let parsed = |p: Option<&str>| p.and_then(|t| serde_json::from_str::<Params>(t).ok());
        let mut queue: VecDeque<(&str, &Node, String, Option<Params>)> = VecDeque::from([(uid, root, made_by.to_string(), parsed(params))]);
        while let Some((up_uid, up, made_by, values)) = queue.pop_front() {
            let Some(downs) = self.dependents.get(&(up.namespace.clone(), up.name.clone())) else { continue };
            for down_uid in downs {
                if !seen.insert(down_uid) {
                    continue;
                }
                let Some(down) = self.nodes.get(down_uid) else { continue };
                let edges = down
                    .after
                    .iter()
                    .map(|e| StoredEdge {
                        job: e.job.clone(),
                        uid: self.uid_of(&down.namespace, &e.job).cloned().unwrap_or_default(),
                        on: e.on,
                    })
                    .collect();
                let record = RunAfter { of: made_by.clone(), of_uid: up_uid.to_string(), edges };
                let declared = down.declared.as_deref().cloned().unwrap_or_default();
                let own = inherit(&declared, values.as_ref());
                let run = NewRun {
                    job_uid: down_uid.clone(),
                    namespace: down.namespace.clone(),
                    job: down.name.clone(),
                    scheduled_at: at,
                    fired_at: now,
                    state: RunState::Waiting,
                    reason: None,
                    manual: false,
                    key: None,
                    params: own.as_ref().map(|p| serde_json::to_string(p).unwrap_or_default()),
                    payload: None,
                    upstream: Some(std::sync::Arc::new(record)),
                };
                queue.push_back((down_uid, down, run.id(), own));
                out.push(run);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gnomon_core::deps::On;

    fn graph(jobs: &[(&str, &[&str])]) -> DepGraph {
        let mut g = DepGraph::default();
        for (name, ups) in jobs {
            let after: Vec<AfterEdge> = ups.iter().map(|u| AfterEdge { job: u.to_string(), on: On::Succeeded }).collect();
            g.set(&format!("u-{name}"), "ns", name, &after, None);
        }
        g
    }

    fn made(runs: &[NewRun]) -> Vec<(String, String)> {
        runs.iter().map(|r| (r.job.clone(), r.upstream.as_ref().unwrap().of.clone())).collect()
    }

    #[test]
    fn an_upstream_run_makes_its_whole_closure_once() {
        // load → (clean, stats) → report (a diamond), and audit after report.
        let g =
            graph(&[("load", &[]), ("clean", &["load"]), ("stats", &["load"]), ("report", &["clean", "stats"]), ("audit", &["report"])]);
        let runs = g.closure("u-load", 1000, "u-load-1000", Some(r#"{"day":"mon"}"#), 5);
        let names: Vec<&str> = runs.iter().map(|r| r.job.as_str()).collect();
        assert_eq!(names, ["clean", "stats", "report", "audit"], "each job once, breadth first");
        assert!(runs.iter().all(|r| r.state == RunState::Waiting && r.scheduled_at == 1000));
        assert_eq!(runs[0].id(), gnomon_records::dep_run_id("u-clean", 1000));
        assert_eq!(made(&runs)[2], ("report".to_string(), gnomon_records::dep_run_id("u-clean", 1000)));
        assert_eq!(runs[3].params.as_deref(), Some(r#"{"day":"mon"}"#), "inherited down the chain");
        let report = runs[2].upstream.as_deref().unwrap();
        let uids: Vec<&str> = report.edges.iter().map(|e| e.uid.as_str()).collect();
        assert_eq!(uids, ["u-clean", "u-stats"]);
        assert!(g.closure("u-audit", 1000, "x", None, 5).is_empty(), "a leaf makes nothing");
    }

    #[test]
    fn a_cycle_left_by_racing_writes_is_walked_once() {
        let g = graph(&[("a", &["b"]), ("b", &["a"])]);
        let runs = g.closure("u-a", 7, "u-a-7", None, 0);
        assert_eq!(runs.len(), 1, "b once, and never a again");
    }

    #[test]
    fn removing_a_job_removes_its_edges_and_name() {
        let mut g = graph(&[("load", &[]), ("clean", &["load"])]);
        assert_eq!(g.upstreams_of("u-clean"), ["u-load"]);
        g.remove("u-clean");
        assert!(g.is_empty() && g.closure("u-load", 1, "x", None, 0).is_empty());
        // A name taken over by a new job (deleted and created again) is not
        // dropped with the old one.
        g.set("u-load2", "ns", "load", &[], None);
        g.remove("u-load");
        assert_eq!(g.uid_of("ns", "load").map(String::as_str), Some("u-load2"));
        assert!(g.upstreams_of("u-gone").is_empty());
        // An edge to a job not held records no uid.
        g.set("u-x", "ns", "x", &[AfterEdge { job: "missing".into(), on: On::Any }], None);
        assert!(g.upstreams_of("u-x").is_empty());
    }
}
