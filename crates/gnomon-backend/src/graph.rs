//! The dependency checks every store makes inside a job write's own
//! transaction (or compare-and-swap), against the namespace's jobs as that
//! transaction sees them: a job's `after` edges name jobs of its namespace
//! and close no cycle, and a job other jobs run after is not deleted. The
//! rules themselves are [`gnomon_core::deps`]'; what makes them hold under
//! concurrent writers is each store's (see `sql/jobs.rs`, `etcd/graph.rs`).

use gnomon_core::deps::{check_graph, dependents, AfterEdge, Graph};
use gnomon_core::spec::JobSpec;
use serde::Deserialize;

use crate::StoreError;

/// The `after` edges of a stored job spec, read without building the rest
/// of the spec.
#[derive(Deserialize)]
pub(crate) struct StoredEdges {
    #[serde(default)]
    after: Vec<AfterEdge>,
}

impl StoredEdges {
    /// The edges of the spec stored as this JSON text.
    pub(crate) fn parse(spec_json: &[u8]) -> Result<StoredEdges, StoreError> {
        serde_json::from_slice(spec_json).map_err(|e| StoreError::Corrupt(format!("job spec: {e}")))
    }

    /// The upstreams' names, in edge order.
    pub(crate) fn upstreams(self) -> Vec<String> {
        self.after.into_iter().map(|e| e.job).collect()
    }
}

/// Refuses `spec`'s edges when they do not fit `graph`, its namespace's
/// stored jobs (the job's own stored entry, if any, is ignored).
pub(crate) fn check_put(spec: &JobSpec, graph: &Graph) -> Result<(), StoreError> {
    check_graph(&spec.name, &spec.after, graph).map_err(StoreError::Graph)
}

/// Refuses to delete `namespace/name` while other jobs of `graph` run after it.
pub(crate) fn check_delete(namespace: &str, name: &str, graph: &Graph) -> Result<(), StoreError> {
    let names: Vec<String> = dependents(name, graph).into_iter().filter(|n| *n != name).map(str::to_string).collect();
    if names.is_empty() {
        return Ok(());
    }
    Err(StoreError::HasDependents { namespace: namespace.to_string(), name: name.to_string(), dependents: names })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gnomon_core::SpecError;

    fn graph(entries: &[(&str, &[&str])]) -> Graph {
        entries.iter().map(|(j, ups)| (j.to_string(), ups.iter().map(|u| u.to_string()).collect())).collect()
    }

    #[test]
    fn a_delete_is_refused_naming_the_dependents() {
        let g = graph(&[("load", &[]), ("transform", &["load"]), ("audit", &["load", "transform"])]);
        let e = check_delete("ns", "load", &g).unwrap_err();
        assert_eq!(
            e,
            StoreError::HasDependents { namespace: "ns".into(), name: "load".into(), dependents: vec!["audit".into(), "transform".into()] }
        );
        assert_eq!(e.to_string(), "audit, transform run after ns/load: remove it from their `after` first");
        assert!(check_delete("ns", "audit", &g).is_ok());
    }

    #[test]
    fn refusals_survive_serialisation() {
        for e in [
            StoreError::Graph(SpecError::new("dependency_cycle", "after", "the edges make a cycle: a → b → a")),
            StoreError::Graph(SpecError::new("unknown_upstream", "after[1].job", "no job \"x\" in this namespace")),
            StoreError::HasDependents { namespace: "ns".into(), name: "b".into(), dependents: vec!["a".into()] },
        ] {
            let back: StoreError = serde_json::from_slice(&serde_json::to_vec(&e).unwrap()).unwrap();
            assert_eq!(back, e);
            assert!(!e.is_retryable());
        }
        let odd: StoreError = serde_json::from_str(r#"{"Graph":["made_up","after","?"]}"#).unwrap();
        assert!(matches!(odd, StoreError::Graph(SpecError { code: "invalid_after", .. })), "{odd:?}");
    }

    /// Replicated entries written before the checks apply as they did
    /// then (`checked: false`); every other write is checked.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn unchecked_writes_are_only_the_legacy_entries() {
        use crate::{JobStore, Precondition};
        let dir = tempfile::tempdir().unwrap();
        let store = crate::sqlite::SqliteStore::open(&format!("sqlite://{}", dir.path().join("g.db").display())).await.unwrap();
        let mut spec = crate::testing::conformance::job_spec("x");
        spec.after = vec![AfterEdge { job: "up".into(), on: gnomon_core::deps::On::Any }];
        let refused = store.put_job(&spec, Precondition::None, 1).await.unwrap_err();
        assert!(matches!(&refused, StoreError::Graph(e) if e.code == "unknown_upstream"), "{refused:?}");
        store.write_job(&spec, Precondition::None, 1, false).await.expect("a legacy entry applies as written");
        store.put_job(&crate::testing::conformance::job_spec("up"), Precondition::None, 2).await.expect("up");
        assert!(matches!(store.delete_job("default", "up", Precondition::None).await, Err(StoreError::HasDependents { .. })));
        store.remove_job("default", "up", Precondition::None, false).await.expect("a legacy delete applies as written");
    }

    #[test]
    fn stored_edges_read_from_a_whole_spec() {
        let spec = br#"{"name":"r","after":[{"job":"a"},{"job":"b","on":"any"}],"executor":{"handler":{"name":"noop"}}}"#;
        assert_eq!(StoredEdges::parse(spec).unwrap().upstreams(), ["a", "b"]);
        assert!(StoredEdges::parse(br#"{"name":"r"}"#).unwrap().upstreams().is_empty());
        assert!(matches!(StoredEdges::parse(b"nope"), Err(StoreError::Corrupt(_))));
    }
}
