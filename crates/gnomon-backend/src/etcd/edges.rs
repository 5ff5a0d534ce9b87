//! The edge index on etcd: which jobs run after a job, read as a prefix.
//!
//! `P/edges/<namespace>/<upstream>/<downstream>` holds the downstream's
//! uid. A job write puts its current edges and deletes the ones it drops,
//! in the txn of the job itself; a delete removes the job's own edges.
//! Names never hold a `/`, so a prefix is exactly one upstream.
//!
//! # Knowing the index is whole
//! Every write that may add an edge or remove a job puts the namespace's
//! graph key (see [`super::graph`]). A write that keeps the index also
//! puts `P/edge_marks/<namespace>` in that txn, so the two keys share a
//! `mod_revision` — but only when they already did at its read: a write
//! never vouches for an index it did not find whole. Every other writer
//! of the graph key (a binary from before the index, a check whose
//! index was not whole) leaves the mark behind. So a read that finds both
//! keys at one revision knows every edge-adding write since the last
//! rebuild kept the index. A read that does not answers from the
//! namespace's jobs, as before the index, and rebuilds it.
//!
//! An entry may outlive its edge (a write from before the index dropped
//! it, a delete raced a rebuild): answers are checked against the stored
//! downstream's edges, so a stale entry costs a read, never a wrong
//! answer.

use std::collections::BTreeSet;

use etcd_client::{GetOptions, Txn, TxnOp};

use super::*;

impl EtcdStore {
    pub(super) fn edge_key(&self, namespace: &str, upstream: &str, downstream: &str) -> String {
        self.k(&format!("edges/{namespace}/{upstream}/{downstream}"))
    }

    pub(super) fn edge_mark_key(&self, namespace: &str) -> String {
        self.k(&format!("edge_marks/{namespace}"))
    }

    /// The index ops of a job write: the edges of `after` put (to the
    /// job's uid), the ones of `before` it no longer has deleted.
    pub(super) fn edge_ops(&self, job: &JobRecord, before: &[String]) -> Vec<TxnOp> {
        let after: BTreeSet<&str> = job.spec.after.iter().map(|e| e.job.as_str()).collect();
        let mut ops: Vec<TxnOp> = before
            .iter()
            .filter(|up| !after.contains(up.as_str()))
            .map(|up| TxnOp::delete(self.edge_key(&job.namespace, up, &job.name), None))
            .collect();
        ops.extend(after.iter().map(|up| TxnOp::put(self.edge_key(&job.namespace, up, &job.name), job.uid.clone(), None)));
        ops
    }

    /// The jobs of `namespace` that run after `name`, by name.
    pub(super) async fn indexed_dependents(&self, namespace: &str, name: &str) -> Result<Vec<JobRecord>, StoreError> {
        let ops = vec![
            TxnOp::get(self.k(&format!("graphs/{namespace}")), None),
            TxnOp::get(self.edge_mark_key(namespace), None),
            TxnOp::get(self.k(&format!("edges/{namespace}/{name}/")), Some(GetOptions::new().with_prefix())),
        ];
        let resp = retry_read(|| {
            let mut c = self.kv.clone();
            let ops = ops.clone();
            async move { c.txn(Txn::new().and_then(ops)).await }
        })
        .await?;
        let mut ranges = gets(&resp).into_iter();
        let graph_rev = ranges.next().unwrap_or_default().first().map_or(0, |kv| kv.mod_revision());
        let mark_rev = ranges.next().unwrap_or_default().first().map_or(0, |kv| kv.mod_revision());
        let mut jobs = if graph_rev == mark_rev {
            let uids = ranges
                .next()
                .unwrap_or_default()
                .iter()
                .map(|kv| kv.value_str().map(str::to_string).map_err(|e| corrupt("edge index", e)))
                .collect::<Result<Vec<String>, StoreError>>()?;
            self.by_uids(&uids).await?
        } else {
            // Not whole: answer from the jobs, and make it whole for the
            // next read.
            self.rebuild_edges(namespace).await?
        };
        jobs.retain(|j| j.namespace == namespace && j.spec.after.iter().any(|e| e.job == name));
        jobs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(jobs)
    }

    /// Rewrites the namespace's index from its jobs and answers the jobs
    /// it read. Every txn compares the graph key as read before the jobs;
    /// the last puts the graph key and the mark together. A rebuild that
    /// loses a race to an edge-adding write, or whose write fails, leaves
    /// the mark behind for a later read to try again.
    pub(super) async fn rebuild_edges(&self, namespace: &str) -> Result<Vec<JobRecord>, StoreError> {
        let guard = self.graph_guard(namespace).await?;
        let names = self.get(self.k(&format!("job_names/{namespace}/")), Some(GetOptions::new().with_prefix())).await?;
        let uids = names
            .kvs()
            .iter()
            .map(|kv| kv.value_str().map(str::to_string).map_err(|e| corrupt("job name index", e)))
            .collect::<Result<Vec<String>, StoreError>>()?;
        let mut jobs = self.by_uids(&uids).await?;
        jobs.retain(|j| j.namespace == namespace);
        // The entries to keep are put, the others deleted one by one (etcd
        // refuses a txn whose ranges overlap, so no prefix delete).
        let mut ops: Vec<TxnOp> = Vec::new();
        for j in &jobs {
            ops.extend(self.edge_ops(j, &[]));
        }
        let wanted: std::collections::HashSet<String> =
            jobs.iter().flat_map(|j| j.spec.after.iter().map(|e| self.edge_key(namespace, &e.job, &j.name))).collect();
        let present = self.get(self.k(&format!("edges/{namespace}/")), Some(GetOptions::new().with_prefix().with_keys_only())).await?;
        for kv in present.kvs() {
            let key = kv.key_str().map_err(|e| corrupt("edge index key", e))?;
            if !wanted.contains(key) {
                ops.push(TxnOp::delete(key.to_string(), None));
            }
        }
        let mut chunks: Vec<Vec<TxnOp>> = ops.chunks(MAX_OPS - 4).map(<[TxnOp]>::to_vec).collect();
        if let Some(last) = chunks.last_mut() {
            last.extend(guard.vouch());
        }
        for chunk in chunks {
            match self.txn(Txn::new().when(vec![guard.compare()]).and_then(chunk)).await {
                Ok(r) if r.succeeded() => {}
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(namespace, error = %e, "edge index rebuild not written; a later read tries again");
                    break;
                }
            }
        }
        Ok(jobs)
    }
}
