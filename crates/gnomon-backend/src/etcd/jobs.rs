//! Job writes and the job change feed: a job and its change-log entry in
//! one transaction, compared on the revision it was read at (and, when the
//! write is checked against the namespace's graph, on the graph key's: see
//! [`super::graph`]), with the job's entries in the edge index
//! ([`super::edges`]).

use std::collections::HashSet;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use gnomon_core::spec::JobSpec;
use gnomon_core::Millis;

use super::graph::backoff;
use super::*;
use crate::graph::{check_delete, check_put};

impl EtcdStore {
    pub(super) async fn write_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError> {
        let ns = spec.namespace().to_string();
        let what = format!("job {ns}/{}", spec.name);
        for round in 0..CAS_ROUNDS {
            backoff(round).await;
            let existing = self.job_by_name(&ns, &spec.name).await?;
            match (&existing, precondition) {
                (Some(_), Precondition::DoesNotExist) => return Err(StoreError::AlreadyExists(what)),
                (None, Precondition::MatchesVersion(_)) => return Err(StoreError::NotFound(what)),
                (Some((j, _, _)), Precondition::MatchesVersion(v)) if j.version != v => {
                    return Err(StoreError::VersionConflict { what, expected: v, actual: j.version })
                }
                _ => {}
            }
            // A job without edges has nothing to check: it may only drop
            // edges, which neither closes a cycle nor loses an upstream.
            let guard = match spec.after.is_empty() {
                true => None,
                false => {
                    let (graph, guard) = self.namespace_graph(&ns).await?;
                    check_put(spec, &graph)?;
                    Some(guard)
                }
            };
            let name_key = self.k(&format!("job_names/{ns}/{}", spec.name));
            let (record, mut compares, mut ops) = match existing {
                Some((mut j, job_rev, name_rev)) => {
                    let before: Vec<String> = j.spec.after.iter().map(|e| e.job.clone()).collect();
                    if j.spec.schedule != spec.schedule {
                        j.previous_schedule = Some(j.spec.schedule.clone());
                        j.schedule_changed_at = Some(now);
                    }
                    j.spec = spec.clone();
                    j.version += 1;
                    j.updated_at = now;
                    let key = self.k(&format!("jobs/{}", j.uid));
                    let compares = vec![
                        Compare::mod_revision(key.clone(), CompareOp::Equal, job_rev),
                        Compare::mod_revision(name_key, CompareOp::Equal, name_rev),
                    ];
                    let mut ops = vec![TxnOp::put(key, json(&ejob(&j)), None)];
                    ops.extend(self.edge_ops(&j, &before));
                    (j, compares, ops)
                }
                None => {
                    let j = JobRecord {
                        uid: format!("{:016x}", rand::random::<u64>()),
                        namespace: ns.clone(),
                        name: spec.name.clone(),
                        spec: spec.clone(),
                        version: 1,
                        paused: false,
                        created_at: now,
                        updated_at: now,
                        last_scheduled_at: None,
                        paused_at: None,
                        resumed_at: None,
                        schedule_changed_at: None,
                        previous_schedule: None,
                        change_seq: 0,
                    };
                    let compares = vec![Compare::version(name_key.clone(), CompareOp::Equal, 0)];
                    let mut ops = vec![
                        TxnOp::put(self.k(&format!("jobs/{}", j.uid)), json(&ejob(&j)), None),
                        TxnOp::put(name_key, j.uid.clone(), None),
                    ];
                    ops.extend(self.edge_ops(&j, &[]));
                    (j, compares, ops)
                }
            };
            if let Some(guard) = guard {
                compares.push(guard.compare());
                ops.extend(guard.bump());
            }
            if self.cas_txn(compares, ops).await? {
                let (j, _, _) = self.job_by_name(&ns, &record.name).await?.ok_or_else(|| StoreError::Backend("job vanished".into()))?;
                return Ok(j);
            }
        }
        Err(StoreError::Unavailable(format!("{what}: too many concurrent writers; try again")))
    }

    pub(super) async fn pause_job(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError> {
        for _ in 0..CAS_ROUNDS {
            let Some((mut j, rev, _)) = self.job_by_name(namespace, name).await? else {
                return Err(StoreError::NotFound(format!("job {namespace}/{name}")));
            };
            if j.paused != paused {
                if paused {
                    j.paused_at = Some(now);
                } else {
                    if let Some(last) = crate::settled_on_resume(&j, now) {
                        j.last_scheduled_at = Some(j.last_scheduled_at.map_or(last, |l| l.max(last)));
                    }
                    j.resumed_at = Some(now);
                }
            }
            j.paused = paused;
            j.version += 1;
            j.updated_at = now;
            let key = self.k(&format!("jobs/{}", j.uid));
            if self
                .cas_txn(vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)], vec![TxnOp::put(key, json(&ejob(&j)), None)])
                .await?
            {
                let (j, _, _) = self.job_by_name(namespace, name).await?.ok_or_else(|| StoreError::Backend("job vanished".into()))?;
                return Ok(j);
            }
        }
        Err(StoreError::Unavailable("too many concurrent writers; try again".into()))
    }

    pub(super) async fn remove_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError> {
        let what = format!("job {namespace}/{name}");
        for round in 0..CAS_ROUNDS {
            backoff(round).await;
            let (j, rev, name_rev) = match (self.job_by_name(namespace, name).await?, precondition) {
                (None, _) => return Err(StoreError::NotFound(what)),
                (Some((j, _, _)), Precondition::MatchesVersion(v)) if j.version != v => {
                    return Err(StoreError::VersionConflict { what, expected: v, actual: j.version })
                }
                (Some(_), Precondition::DoesNotExist) => return Err(StoreError::AlreadyExists(what)),
                (Some(found), _) => found,
            };
            let (graph, guard) = self.namespace_graph(namespace).await?;
            check_delete(namespace, name, &graph)?;
            let key = self.k(&format!("jobs/{}", j.uid));
            let name_key = self.k(&format!("job_names/{namespace}/{name}"));
            let mut ops = vec![
                TxnOp::delete(key.clone(), None),
                TxnOp::delete(name_key.clone(), None),
                TxnOp::put(self.k(&format!("job_tombstones/{}", j.uid)), "", None),
            ];
            ops.extend(j.spec.after.iter().map(|e| TxnOp::delete(self.edge_key(namespace, &e.job, name), None)));
            ops.extend(guard.bump());
            let ok = self
                .cas_txn(
                    vec![
                        Compare::mod_revision(key, CompareOp::Equal, rev),
                        Compare::mod_revision(name_key, CompareOp::Equal, name_rev),
                        guard.compare(),
                    ],
                    ops,
                )
                .await?;
            if ok {
                return Ok(());
            }
        }
        Err(StoreError::Unavailable("too many concurrent writers; try again".into()))
    }

    pub(super) async fn changes_since(&self, since: u64) -> Result<JobChanges, StoreError> {
        // One read txn: both ranges at the same revision, so nothing at or
        // below the returned seq can appear later.
        let min = i64::try_from(since).unwrap_or(i64::MAX).saturating_add(1);
        let ops = vec![
            TxnOp::get(self.k("jobs/"), Some(GetOptions::new().with_prefix().with_min_mod_revision(min))),
            TxnOp::get(self.k("job_tombstones/"), Some(GetOptions::new().with_prefix().with_min_mod_revision(min))),
        ];
        let resp = retry_read(|| {
            let mut c = self.kv.clone();
            let ops = ops.clone();
            async move { c.txn(Txn::new().and_then(ops)).await }
        })
        .await?;
        let mut ranges = gets(&resp).into_iter();
        let jobs = ranges.next().unwrap_or_default();
        let tombs = ranges.next().unwrap_or_default();
        let mut seq = since;
        let mut upserted = Vec::new();
        for kv in &jobs {
            seq = seq.max(u64::try_from(kv.mod_revision()).unwrap_or(0));
            upserted.push(job_record(kv)?);
        }
        upserted.sort_by_key(|j| j.change_seq);
        let live: HashSet<&str> = upserted.iter().map(|j| j.uid.as_str()).collect();
        let mut deleted = Vec::new();
        let mut tombs: Vec<&etcd_client::KeyValue> = tombs.iter().collect();
        tombs.sort_by_key(|kv| kv.mod_revision());
        for kv in tombs {
            seq = seq.max(u64::try_from(kv.mod_revision()).unwrap_or(0));
            let key = kv.key_str().map_err(|e| corrupt("tombstone", e))?;
            let uid = key.rsplit('/').next().unwrap_or_default().to_string();
            if !live.contains(uid.as_str()) {
                deleted.push(uid);
            }
        }
        Ok(JobChanges { upserted, deleted, seq })
    }

    pub(super) async fn heads(&self) -> Result<JobHeads, StoreError> {
        /// A job's value, read without building its spec.
        #[derive(Deserialize)]
        struct EHead {
            uid: String,
            version: u64,
            last_scheduled_at: Option<Millis>,
        }
        let resp = self.get(self.k("jobs/"), Some(GetOptions::new().with_prefix())).await?;
        // Everything up to the read's revision is in it.
        let seq = resp.header().map_or(0, |h| u64::try_from(h.revision()).unwrap_or(0));
        let heads = resp
            .kvs()
            .iter()
            .map(|kv| {
                let h: EHead = parse("job", kv.value())?;
                Ok(JobHead { uid: h.uid, version: h.version, last_scheduled_at: h.last_scheduled_at })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(JobHeads { heads, seq })
    }

    pub(super) async fn by_uids(&self, uids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
        let keys: Vec<String> = uids.iter().map(|u| self.k(&format!("jobs/{u}"))).collect();
        self.get_many(&keys).await?.into_iter().flatten().map(|kv| job_record(&kv)).collect()
    }
}
