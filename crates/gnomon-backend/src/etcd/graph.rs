//! The dependency checks of job writes on etcd, atomic with the write.
//!
//! Each namespace has a graph key, `P/graphs/<namespace>`. Every write
//! that may add an edge or remove a job (a job put with edges, a delete)
//! reads the key's `mod_revision` first, then the namespace's jobs, checks
//! its edges (or its dependents) against them, and commits only if the
//! key is still at the revision read, putting it in the same txn. So of
//! two such writes the second to commit either read the key after the
//! first committed, and then read the first's jobs too (everything read
//! comes after the key), or fails its compare and re-reads.
//!
//! The writes that leave the key alone (a put without edges, a pause) may
//! only drop edges or add a job nothing names yet: a check that read the
//! namespace before them still holds after them. A job that did not exist
//! when the check read the namespace is refused as an unknown upstream,
//! which is the answer the write would have had an instant earlier.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use gnomon_core::deps::Graph;

use super::*;
use crate::graph::StoredEdges;

/// What of a stored job the check reads.
#[derive(Deserialize)]
struct JobEdges {
    namespace: String,
    name: String,
    spec: StoredEdges,
}

/// The namespace's graph key at the revision a check read it: the compare
/// and the puts a write checked against that read commits with.
pub(super) struct GraphGuard {
    key: String,
    mod_revision: i64,
    /// The namespace's edge mark (see [`super::edges`]).
    mark: String,
    /// The mark was at the graph key's revision: the edge index was whole.
    whole: bool,
}

impl GraphGuard {
    /// The key is where the check read it (a key never written compares
    /// at revision 0).
    pub(super) fn compare(&self) -> Compare {
        Compare::mod_revision(self.key.clone(), CompareOp::Equal, self.mod_revision)
    }

    /// Moves the key on, so that every other write checked against the
    /// same read fails its compare; and the mark with it when the edge
    /// index was whole (the write keeps it whole).
    pub(super) fn bump(&self) -> Vec<TxnOp> {
        match self.whole {
            true => self.vouch(),
            false => vec![TxnOp::put(self.key.clone(), "", None)],
        }
    }

    /// Moves the key and the mark on together: the edge index is whole
    /// (a rebuild's last txn).
    pub(super) fn vouch(&self) -> Vec<TxnOp> {
        vec![TxnOp::put(self.key.clone(), "", None), TxnOp::put(self.mark.clone(), "", None)]
    }
}

impl EtcdStore {
    /// The ops reading the namespace's graph key and edge mark.
    fn guard_reads(&self, namespace: &str) -> (String, String, Vec<TxnOp>) {
        let key = self.k(&format!("graphs/{namespace}"));
        let mark = self.edge_mark_key(namespace);
        let ops = vec![TxnOp::get(key.clone(), None), TxnOp::get(mark.clone(), None)];
        (key, mark, ops)
    }

    fn guard_from(key: String, mark: String, ranges: &mut impl Iterator<Item = Vec<etcd_client::KeyValue>>) -> GraphGuard {
        let mod_revision = ranges.next().unwrap_or_default().first().map_or(0, |kv| kv.mod_revision());
        let mark_revision = ranges.next().unwrap_or_default().first().map_or(0, |kv| kv.mod_revision());
        GraphGuard { key, mod_revision, mark, whole: mark_revision == mod_revision }
    }

    /// The namespace's graph guard alone.
    pub(super) async fn graph_guard(&self, namespace: &str) -> Result<GraphGuard, StoreError> {
        let (key, mark, ops) = self.guard_reads(namespace);
        let resp = retry_read(|| {
            let mut c = self.kv.clone();
            let ops = ops.clone();
            async move { c.txn(Txn::new().and_then(ops)).await }
        })
        .await?;
        Ok(Self::guard_from(key, mark, &mut gets(&resp).into_iter()))
    }

    /// The namespace's dependency graph (each job's upstreams) as stored,
    /// and the guard of the read.
    pub(super) async fn namespace_graph(&self, namespace: &str) -> Result<(Graph, GraphGuard), StoreError> {
        // The key, the mark and the namespace's names in one read; the jobs after it.
        let (key, mark, mut ops) = self.guard_reads(namespace);
        ops.push(TxnOp::get(self.k(&format!("job_names/{namespace}/")), Some(GetOptions::new().with_prefix())));
        let resp = retry_read(|| {
            let mut c = self.kv.clone();
            let ops = ops.clone();
            async move { c.txn(Txn::new().and_then(ops)).await }
        })
        .await?;
        let mut ranges = gets(&resp).into_iter();
        let guard = Self::guard_from(key, mark, &mut ranges);
        let job_keys = ranges
            .next()
            .unwrap_or_default()
            .iter()
            .map(|kv| Ok(self.k(&format!("jobs/{}", kv.value_str().map_err(|e| corrupt("job name index", e))?))))
            .collect::<Result<Vec<String>, StoreError>>()?;
        let mut graph = Graph::new();
        for kv in self.get_many(&job_keys).await?.into_iter().flatten() {
            let job: JobEdges = parse("job", kv.value())?;
            if job.namespace == namespace {
                graph.insert(job.name, job.spec.upstreams());
            }
        }
        Ok((graph, guard))
    }
}

/// A short random pause before a write's next round, so that writers
/// that keep meeting on one graph key spread out.
pub(super) async fn backoff(round: usize) {
    if round > 0 {
        let most = 5 * u64::try_from(round).unwrap_or(1);
        tokio::time::sleep(std::time::Duration::from_millis(rand::random::<u64>() % most + 1)).await;
    }
}
