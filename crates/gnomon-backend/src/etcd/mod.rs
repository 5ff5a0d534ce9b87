//! etcd as the store (`--store etcd://[user:pass@]h1:2379,h2:2379[/cluster]`).
//!
//! # Key layout
//! Everything lives under `/gnomon/<cluster>/` (`P` below); values are JSON.
//!
//! | key | value |
//! |---|---|
//! | `P/jobs/<uid>` | the job (spec, version, paused, times, `last_scheduled_at`); its `mod_revision` is its change sequence |
//! | `P/job_names/<namespace>/<name>` | the uid of the job of that name |
//! | `P/job_tombstones/<uid>` | empty; written when a job is deleted (the change feed's deletions) |
//! | `P/runs/<run id>` | the run (run id = `<job uid>-<scheduled_at>`, `<job uid>-m<scheduled_at>` if manual) |
//! | `P/open/<run id>` | empty; present while the run is not terminal (leader recovery reads only these) |
//! | `P/idx/seq/<seq, 16 hex>` | run id: every run, in insertion order (pagination) |
//! | `P/idx/job/<job name>/<seq>` | run id: a job's runs, in insertion order |
//! | `P/idx/uid/<job uid>/<seq>` | run id: one job's runs by its uid (retention counts these) |
//! | `P/meta/uid_index` | how far runs written before the uid index have been indexed (`done` when all) |
//! | `P/attempts/<run id>/<attempt, 8 digits>` | one attempt, with its output tail |
//! | `P/counters/run_seq` | the last run sequence number handed out |
//! | `P/epochs/<scope>` | the scope's epoch counter (token source for lock-less electors) |
//! | `P/fence/<scope>` | the scope's current fencing token |
//! | `P/leadership/<scope>` | who holds that token (holder, address, backend, since, election key) |
//! | `P/notify/<run id>/<outcome>/<target>` | a notification (the outbox) |
//! | `P/notify_due/<notification id>` | the due time of a pending notification |
//! | `P/clock/<scope>` | the committed leader time (milliseconds; only ever raised, fenced) |
//! | `P/election/<scope>/…` | etcd's election keys (the etcd elector) |
//!
//! # Invariants
//! - **Fire uniqueness**: a run key is created only under `version == 0`.
//! - **Fencing**: every leader write is one `Txn` whose compares include
//!   `value(P/fence/<scope>) == token` and, when the term came from the etcd
//!   election, `create_revision(<leader key>) == token` — so a deposed
//!   leader's write fails both when a newer term fenced and as soon as its
//!   own election key is gone.
//! - **CAS**: transitions compare each run key's `mod_revision` with the one
//!   read; a conflict is re-read and re-planned, never blindly retried.
//! - A txn holds at most [`MAX_OPS`] operations (etcd's default
//!   `--max-txn-ops` is 128), so a large batch is several txns. A job's runs
//!   and its `last_scheduled_at` advance share a txn whenever they fit in
//!   one; a catch-up too large for one txn advances the job in its last
//!   chunk, and a crash in between leaves runs whose re-fire is `Existed`.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use gnomon_core::spec::JobSpec;
use gnomon_core::{Millis, RunState};
use serde::{Deserialize, Serialize};

use crate::*;

mod clock;
mod election;
mod notify;
mod records;
mod retention;
mod sessions;
mod url;
mod writes;

pub use election::*;

use records::*;
use sessions::{watch_job_writes, EtcdSessions};
pub use url::{parse_url, EtcdUrl};

/// Most operations (and most compares) in one txn.
pub const MAX_OPS: usize = 120;
/// How many times a write is re-read and re-planned after a CAS conflict.
const CAS_ROUNDS: usize = 20;

/// A fenced term as this handle knows it: its token and election key.
type Term = (u64, Option<String>);

/// The etcd store.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    p: String,
    /// scope -> (token, election key) learned from the leadership record.
    terms: std::sync::Arc<std::sync::Mutex<HashMap<String, Term>>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").field("prefix", &self.p).finish()
    }
}

fn unavailable(e: etcd_client::Error) -> StoreError {
    StoreError::Unavailable(format!("etcd: {e}"))
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

fn parse<T: for<'de> Deserialize<'de>>(what: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(what, e))
}

fn gets(resp: &etcd_client::TxnResponse) -> Vec<Vec<etcd_client::KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(mut g) => Some(g.take_kvs()),
            _ => None,
        })
        .collect()
}

/// The client could not connect to the member it chose: the request never
/// left this process.
fn never_sent(e: &etcd_client::Error) -> bool {
    // gRPC status 14 is UNAVAILABLE; the message is the connector's.
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() as i32 == 14 && s.message().contains("tcp connect error"))
}

/// Keeps calling an idempotent read until it answers: 100 ms → 1 s
/// backoff, 5 tries on errors; a read that gets no answer
/// within 3 s is not retried. Writes are never retried blindly: their
/// outcome is re-checked by re-reading (see the CAS loops).
async fn retry_read<T, F, Fut>(mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let mut delay = std::time::Duration::from_millis(100);
    let mut last = None;
    for _ in 0..5 {
        match tokio::time::timeout(std::time::Duration::from_secs(3), f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => last = Some(unavailable(e)),
            // Silence, not an error: a partition. Retrying would only make
            // the caller (an API request, a leader turn) wait longer.
            Err(_) => return Err(StoreError::Unavailable("etcd: no answer within 3s".into())),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(std::time::Duration::from_secs(1));
    }
    Err(last.unwrap_or_else(|| StoreError::Unavailable("etcd".into())))
}

impl EtcdStore {
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let u = parse_url(url)?;
        let client = crate::etcd::connect_target(&u.target, std::time::Duration::from_secs(5)).await.map_err(|e| match e {
            ElectionError::Unavailable(m) => StoreError::Unavailable(m),
            ElectionError::Refused(m) => StoreError::Backend(m),
            ElectionError::Store(s) => s,
        })?;
        Ok(Self { client, p: format!("/gnomon/{}", u.cluster), terms: Default::default() })
    }

    fn k(&self, rest: &str) -> String {
        format!("{}/{rest}", self.p)
    }

    fn c(&self) -> Client {
        self.client.clone()
    }

    /// One write. It is repeated only when the client could not even
    /// connect to the member it picked (a member that is down: the request
    /// was never sent, so repeating it cannot apply it twice); any other
    /// error leaves its outcome unknown and goes back to the caller.
    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, StoreError> {
        let mut delay = std::time::Duration::from_millis(50);
        for attempt in 0.. {
            let mut c = self.c();
            let result = tokio::time::timeout(std::time::Duration::from_secs(10), c.txn(txn.clone()))
                .await
                .map_err(|_| StoreError::Unavailable("etcd: txn timed out (its outcome is re-checked by the caller)".into()))?;
            match result {
                Ok(r) => return Ok(r),
                Err(e) if attempt < 4 && never_sent(&e) => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => return Err(unavailable(e)),
            }
        }
        unreachable!("the loop returns")
    }

    async fn get(&self, key: String, opts: Option<GetOptions>) -> Result<etcd_client::GetResponse, StoreError> {
        retry_read(|| {
            let mut c = self.c();
            let (key, opts) = (key.clone(), opts.clone());
            async move { c.get(key, opts).await }
        })
        .await
    }

    /// Reads many keys in read-only txns (≤ MAX_OPS gets each).
    async fn get_many(&self, keys: &[String]) -> Result<Vec<Option<etcd_client::KeyValue>>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(MAX_OPS) {
            let ops: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
            let resp = retry_read(|| {
                let mut c = self.c();
                let ops = ops.clone();
                async move { c.txn(Txn::new().and_then(ops)).await }
            })
            .await?;
            for kvs in gets(&resp) {
                out.push(kvs.into_iter().next());
            }
        }
        Ok(out)
    }

    /// The compares that prove `fence` is the scope's current term.
    async fn fence_compares(&self, fence: &Fence) -> Result<Vec<Compare>, StoreError> {
        let known = self.terms.lock().unwrap_or_else(|p| p.into_inner()).get(&fence.scope).cloned();
        let leader_key = match known {
            Some((t, key)) if t == fence.token => key,
            _ => {
                let resp = self.get(self.k(&format!("leadership/{}", fence.scope)), None).await?;
                let rec: Option<ELeadership> = resp.kvs().first().map(|kv| parse("leadership", kv.value())).transpose()?;
                let key = rec.filter(|r| r.token == fence.token).and_then(|r| r.leader_key);
                self.terms.lock().unwrap_or_else(|p| p.into_inner()).insert(fence.scope.clone(), (fence.token, key.clone()));
                key
            }
        };
        let mut c = vec![Compare::value(self.k(&format!("fence/{}", fence.scope)), CompareOp::Equal, fence.token.to_string())];
        if let Some(k) = leader_key {
            c.push(Compare::create_revision(k, CompareOp::Equal, i64::try_from(fence.token).unwrap_or(i64::MAX)));
        }
        Ok(c)
    }

    /// After a failed leader txn: fenced out, or a CAS conflict to re-plan?
    async fn check_fenced(&self, fence: &Fence) -> Result<(), StoreError> {
        let compares = self.fence_compares(fence).await?;
        // The range op matters: etcd serves a txn whose ops are all
        // serializable reads from the local member, and a compare-only txn
        // counts as one, so it could miss a deletion another member has
        // committed. A linearizable get makes the whole txn linearizable.
        let probe = TxnOp::get(self.k(&format!("fence/{}", fence.scope)), None);
        let resp = self.txn(Txn::new().when(compares).and_then(vec![probe])).await?;
        if resp.succeeded() {
            return Ok(());
        }
        let cur = self.get(self.k(&format!("fence/{}", fence.scope)), None).await?;
        let current = cur.kvs().first().and_then(|kv| kv.value_str().ok()?.parse::<u64>().ok()).unwrap_or(0);
        count_fencing_rejection();
        Err(StoreError::Fenced { scope: fence.scope.clone(), token: fence.token, current })
    }

    async fn job_by_name(&self, namespace: &str, name: &str) -> Result<Option<(JobRecord, i64, i64)>, StoreError> {
        let idx = self.get(self.k(&format!("job_names/{namespace}/{name}")), None).await?;
        let Some(kv) = idx.kvs().first() else { return Ok(None) };
        let uid = kv.value_str().map_err(|e| corrupt("job name index", e))?.to_string();
        let name_rev = kv.mod_revision();
        let job = self.get(self.k(&format!("jobs/{uid}")), None).await?;
        match job.kvs().first() {
            Some(kv) => Ok(Some((job_record(kv)?, kv.mod_revision(), name_rev))),
            None => Ok(None),
        }
    }

    async fn next_seq(&self) -> Result<(i64, i64), StoreError> {
        let resp = self.get(self.k("counters/run_seq"), None).await?;
        Ok(match resp.kvs().first() {
            Some(kv) => (kv.value_str().ok().and_then(|v| v.parse().ok()).unwrap_or(0), kv.mod_revision()),
            None => (0, 0),
        })
    }

    async fn read_runs(&self, ids: &[String]) -> Result<HashMap<String, (ERun, i64)>, StoreError> {
        let keys: Vec<String> = ids.iter().map(|id| self.k(&format!("runs/{id}"))).collect();
        let mut out = HashMap::new();
        for (id, kv) in ids.iter().zip(self.get_many(&keys).await?) {
            if let Some(kv) = kv {
                out.insert(id.clone(), (parse::<ERun>("run", kv.value())?, kv.mod_revision()));
            }
        }
        Ok(out)
    }

    async fn runs_by_ids(&self, ids: &[String]) -> Result<Vec<RunRecord>, StoreError> {
        let keys: Vec<String> = ids.iter().map(|id| self.k(&format!("runs/{id}"))).collect();
        let mut out = Vec::new();
        for kv in self.get_many(&keys).await?.into_iter().flatten() {
            out.push(parse::<ERun>("run", kv.value())?.into());
        }
        Ok(out)
    }

    /// One conditional write: `ops` apply if every compare holds; says whether they did.
    async fn cas_txn(&self, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<bool, StoreError> {
        Ok(self.txn(Txn::new().when(compares).and_then(ops)).await?.succeeded())
    }
}

#[async_trait]
impl Store for EtcdStore {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    async fn put_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError> {
        let ns = spec.namespace().to_string();
        let what = format!("job {ns}/{}", spec.name);
        for _ in 0..CAS_ROUNDS {
            let existing = self.job_by_name(&ns, &spec.name).await?;
            match (&existing, precondition) {
                (Some(_), Precondition::DoesNotExist) => return Err(StoreError::AlreadyExists(what)),
                (None, Precondition::MatchesVersion(_)) => return Err(StoreError::NotFound(what)),
                (Some((j, _, _)), Precondition::MatchesVersion(v)) if j.version != v => {
                    return Err(StoreError::VersionConflict { what, expected: v, actual: j.version })
                }
                _ => {}
            }
            let name_key = self.k(&format!("job_names/{ns}/{}", spec.name));
            let (record, compares, ops) = match existing {
                Some((mut j, job_rev, name_rev)) => {
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
                    let ops = vec![TxnOp::put(key, json(&ejob(&j)), None)];
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
                    let ops = vec![
                        TxnOp::put(self.k(&format!("jobs/{}", j.uid)), json(&ejob(&j)), None),
                        TxnOp::put(name_key, j.uid.clone(), None),
                    ];
                    (j, compares, ops)
                }
            };
            if self.cas_txn(compares, ops).await? {
                let (j, _, _) = self.job_by_name(&ns, &record.name).await?.ok_or_else(|| StoreError::Backend("job vanished".into()))?;
                return Ok(j);
            }
        }
        Err(StoreError::Unavailable(format!("{what}: too many concurrent writers; try again")))
    }

    async fn set_job_paused(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError> {
        for _ in 0..CAS_ROUNDS {
            let Some((mut j, rev, _)) = self.job_by_name(namespace, name).await? else {
                return Err(StoreError::NotFound(format!("job {namespace}/{name}")));
            };
            if j.paused != paused {
                if paused {
                    j.paused_at = Some(now);
                } else {
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

    async fn delete_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError> {
        let what = format!("job {namespace}/{name}");
        for _ in 0..CAS_ROUNDS {
            let (j, rev, name_rev) = match (self.job_by_name(namespace, name).await?, precondition) {
                (None, _) => return Err(StoreError::NotFound(what)),
                (Some((j, _, _)), Precondition::MatchesVersion(v)) if j.version != v => {
                    return Err(StoreError::VersionConflict { what, expected: v, actual: j.version })
                }
                (Some(_), Precondition::DoesNotExist) => return Err(StoreError::AlreadyExists(what)),
                (Some(found), _) => found,
            };
            let key = self.k(&format!("jobs/{}", j.uid));
            let name_key = self.k(&format!("job_names/{namespace}/{name}"));
            let ok = self
                .cas_txn(
                    vec![
                        Compare::mod_revision(key.clone(), CompareOp::Equal, rev),
                        Compare::mod_revision(name_key.clone(), CompareOp::Equal, name_rev),
                    ],
                    vec![
                        TxnOp::delete(key, None),
                        TxnOp::delete(name_key, None),
                        TxnOp::put(self.k(&format!("job_tombstones/{}", j.uid)), "", None),
                    ],
                )
                .await?;
            if ok {
                return Ok(());
            }
        }
        Err(StoreError::Unavailable("too many concurrent writers; try again".into()))
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
        Ok(self.job_by_name(namespace, name).await?.map(|(j, _, _)| j))
    }

    async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>, StoreError> {
        let resp = self.get(self.k("jobs/"), Some(GetOptions::new().with_prefix())).await?;
        let mut jobs: Vec<JobRecord> = resp.kvs().iter().map(job_record).collect::<Result<_, _>>()?;
        jobs.retain(|j| namespace.is_none_or(|ns| j.namespace == ns));
        jobs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ok(jobs)
    }

    async fn job_changes(&self, since: u64) -> Result<JobChanges, StoreError> {
        // One read txn: both ranges at the same revision, so nothing at or
        // below the returned seq can appear later.
        let min = i64::try_from(since).unwrap_or(i64::MAX).saturating_add(1);
        let ops = vec![
            TxnOp::get(self.k("jobs/"), Some(GetOptions::new().with_prefix().with_min_mod_revision(min))),
            TxnOp::get(self.k("job_tombstones/"), Some(GetOptions::new().with_prefix().with_min_mod_revision(min))),
        ];
        let resp = retry_read(|| {
            let mut c = self.c();
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

    async fn job_heads(&self) -> Result<JobHeads, StoreError> {
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

    async fn jobs_by_uid(&self, uids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
        let keys: Vec<String> = uids.iter().map(|u| self.k(&format!("jobs/{u}"))).collect();
        self.get_many(&keys).await?.into_iter().flatten().map(|kv| job_record(&kv)).collect()
    }

    async fn next_epoch(&self, scope: &str) -> Result<u64, StoreError> {
        let key = self.k(&format!("epochs/{scope}"));
        for _ in 0..CAS_ROUNDS {
            let (epoch, rev) = {
                let r = self.get(key.clone(), None).await?;
                match r.kvs().first() {
                    Some(kv) => (kv.value_str().ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0), kv.mod_revision()),
                    None => (0, 0),
                }
            };
            let fenced = self.leadership(scope).await?.map(|l| l.token).unwrap_or(0);
            let next = epoch.max(fenced) + 1;
            let cmp = if rev == 0 {
                Compare::version(key.clone(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(key.clone(), CompareOp::Equal, rev)
            };
            if self.cas_txn(vec![cmp], vec![TxnOp::put(key.clone(), next.to_string(), None)]).await? {
                return Ok(next);
            }
        }
        Err(StoreError::Unavailable("epoch: too many concurrent writers".into()))
    }

    async fn fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError> {
        let fkey = self.k(&format!("fence/{}", fence.scope));
        // The election key whose create revision is this token, if the
        // term came from the etcd election of this cluster.
        let election = self.get(self.k(&format!("election/{}/", fence.scope)), Some(GetOptions::new().with_prefix())).await?;
        let leader_key = election
            .kvs()
            .iter()
            .find(|kv| u64::try_from(kv.create_revision()).ok() == Some(fence.token))
            .and_then(|kv| kv.key_str().ok().map(str::to_string));
        for _ in 0..CAS_ROUNDS {
            let r = self.get(fkey.clone(), None).await?;
            let (current, rev) = match r.kvs().first() {
                Some(kv) => (kv.value_str().ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0), kv.mod_revision()),
                None => (0, 0),
            };
            if fence.token <= current {
                return Err(StoreError::StaleToken { scope: fence.scope.clone(), token: fence.token, current });
            }
            let mut compares = vec![if rev == 0 {
                Compare::version(fkey.clone(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(fkey.clone(), CompareOp::Equal, rev)
            }];
            if let Some(k) = &leader_key {
                compares.push(Compare::create_revision(k.clone(), CompareOp::Equal, i64::try_from(fence.token).unwrap_or(i64::MAX)));
            }
            let rec = ELeadership {
                token: fence.token,
                holder: holder.holder.clone(),
                address: holder.address.clone(),
                backend: holder.backend.clone(),
                since: now,
                leader_key: leader_key.clone(),
            };
            let ops = vec![
                TxnOp::put(fkey.clone(), fence.token.to_string(), None),
                TxnOp::put(self.k(&format!("leadership/{}", fence.scope)), json(&rec), None),
            ];
            if self.cas_txn(compares, ops).await? {
                self.terms.lock().unwrap_or_else(|p| p.into_inner()).insert(fence.scope.clone(), (fence.token, leader_key));
                return Ok(());
            }
        }
        Err(StoreError::Unavailable("fence: too many concurrent writers".into()))
    }

    async fn leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError> {
        let r = self.get(self.k(&format!("leadership/{scope}")), None).await?;
        let Some(kv) = r.kvs().first() else { return Ok(None) };
        let l: ELeadership = parse("leadership", kv.value())?;
        Ok(Some(LeadershipRecord {
            scope: scope.into(),
            token: l.token,
            holder: l.holder,
            address: l.address,
            backend: l.backend,
            since: l.since,
            leader_time: self.read_leader_time(scope).await?.0,
        }))
    }

    async fn advance_leader_time(&self, fence: &Fence, at: Millis) -> Result<Millis, StoreError> {
        self.advance_clock(fence, at).await
    }

    async fn fire(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
        self.fire_runs(fence, runs, advances).await
    }

    async fn transition(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
        self.transition_all(fence, transitions).await
    }

    async fn request_cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
        for _ in 0..CAS_ROUNDS {
            let runs = self.read_runs(&[run_id.to_string()]).await?;
            let Some((mut run, rev)) = runs.into_iter().next().map(|(_, v)| v) else {
                return Err(StoreError::NotFound(format!("run {run_id}")));
            };
            let key = self.k(&format!("runs/{run_id}"));
            let (outcome, ops) = match run.state {
                RunState::Pending | RunState::Retrying => {
                    run.state = RunState::Cancelled;
                    run.reason = Some("cancelled by request".into());
                    run.updated_at = now;
                    (
                        CancelOutcome::Cancelled,
                        vec![TxnOp::put(key.clone(), json(&run), None), TxnOp::delete(self.k(&format!("open/{run_id}")), None)],
                    )
                }
                RunState::Assigned | RunState::Running => {
                    run.cancel_requested = true;
                    run.updated_at = now;
                    (CancelOutcome::Requested, vec![TxnOp::put(key.clone(), json(&run), None)])
                }
                _ => return Err(StoreError::Terminal(run_id.to_string())),
            };
            if self.cas_txn(vec![Compare::mod_revision(key, CompareOp::Equal, rev)], ops).await? {
                return Ok(outcome);
            }
        }
        Err(StoreError::Unavailable("cancel: too many concurrent writers".into()))
    }

    async fn due_notifications(&self, now: Millis, limit: u32) -> Result<Vec<Notification>, StoreError> {
        self.due(now, limit).await
    }

    async fn settle_notification(&self, fence: &Fence, delivery: &Delivery) -> Result<bool, StoreError> {
        self.settle(fence, delivery).await
    }

    async fn run_notifications(&self, run_id: &str) -> Result<Vec<Notification>, StoreError> {
        self.of_run(run_id).await
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError> {
        let r = self.get(self.k(&format!("runs/{run_id}")), None).await?;
        let Some(kv) = r.kvs().first() else { return Ok(None) };
        let run: RunRecord = parse::<ERun>("run", kv.value())?.into();
        let a = self.get(self.k(&format!("attempts/{run_id}/")), Some(GetOptions::new().with_prefix())).await?;
        let mut attempts: Vec<AttemptRecord> = Vec::new();
        for kv in a.kvs() {
            let e: EAttempt = parse("attempt", kv.value())?;
            attempts.push(AttemptRecord {
                attempt: e.attempt,
                worker: e.worker,
                token: e.token,
                state: e.state,
                assigned_at: e.assigned_at,
                started_at: e.started_at,
                ended_at: e.ended_at,
                exit_code: e.exit_code,
                output: e.output,
            });
        }
        attempts.sort_by_key(|a| a.attempt);
        Ok(Some(RunDetail { run, attempts }))
    }

    async fn list_runs(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError> {
        let limit = limit.clamp(1, 1000) as usize;
        let base = match &filter.job {
            Some(job) => self.k(&format!("idx/job/{job}/")),
            None => self.k("idx/seq/"),
        };
        let mut runs: Vec<RunRecord> = Vec::new();
        let mut upper = match cursor {
            Some(c) => format!("{base}{}", seq_key(c)),
            None => format!("{base}g"), // past every hex digit
        };
        loop {
            // The next page of the index, newest first, below `upper`.
            let resp = self
                .get(
                    base.clone(),
                    Some(
                        GetOptions::new()
                            .with_range(upper.clone())
                            .with_sort(SortTarget::Key, SortOrder::Descend)
                            .with_limit((limit + 1) as i64),
                    ),
                )
                .await?;
            let kvs = resp.kvs();
            if kvs.is_empty() {
                break;
            }
            let ids: Vec<String> = kvs.iter().filter_map(|kv| kv.value_str().ok().map(str::to_string)).collect();
            for r in self.runs_by_ids(&ids).await? {
                if filter.namespace.as_ref().is_some_and(|ns| *ns != r.namespace) || filter.state.is_some_and(|s| s != r.state) {
                    continue;
                }
                runs.push(r);
            }
            runs.sort_by_key(|r| std::cmp::Reverse(r.seq));
            if runs.len() > limit || !resp.more() {
                break;
            }
            upper = kvs.last().and_then(|kv| kv.key_str().ok()).unwrap_or_default().to_string();
        }
        let next_cursor = if runs.len() > limit {
            runs.truncate(limit);
            runs.last().map(|r| r.seq)
        } else {
            None
        };
        Ok(RunPage { runs, next_cursor })
    }

    async fn open_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        let r = self.get(self.k("open/"), Some(GetOptions::new().with_prefix().with_keys_only())).await?;
        let ids: Vec<String> =
            r.kvs().iter().filter_map(|kv| kv.key_str().ok().and_then(|k| k.rsplit('/').next()).map(str::to_string)).collect();
        let mut runs = self.runs_by_ids(&ids).await?;
        runs.retain(|r| !r.state.is_terminal());
        runs.sort_by_key(|r| r.seq);
        Ok(runs)
    }

    async fn live_attempts(&self) -> Result<Vec<LiveAttempt>, StoreError> {
        // The live runs' current attempts, read in batches (not a get per run).
        let live: Vec<(String, u32)> = self
            .open_runs()
            .await?
            .into_iter()
            .filter(|r| matches!(r.state, RunState::Assigned | RunState::Running))
            .map(|r| (r.id, r.attempt))
            .collect();
        let keys: Vec<String> = live.iter().map(|(id, a)| self.k(&format!("attempts/{id}/{a:08}"))).collect();
        let mut out = Vec::with_capacity(live.len());
        for ((run_id, attempt), kv) in live.into_iter().zip(self.get_many(&keys).await?) {
            if let Some(kv) = kv {
                let e: EAttempt = parse("attempt", kv.value())?;
                out.push(LiveAttempt { run_id, attempt, worker: e.worker });
            }
        }
        Ok(out)
    }

    async fn cancel_requests(&self) -> Result<Vec<RunRecord>, StoreError> {
        let mut runs = self.open_runs().await?;
        runs.retain(|r| r.cancel_requested && matches!(r.state, RunState::Assigned | RunState::Running));
        Ok(runs)
    }

    async fn prune(&self, fence: &Fence, keep_per_job: usize, before: Millis, max: usize) -> Result<u64, StoreError> {
        self.prune_runs(fence, keep_per_job, before, max).await
    }

    fn session_leases(&self) -> Option<std::sync::Arc<dyn SessionLeases>> {
        Some(std::sync::Arc::new(EtcdSessions { store: self.clone() }))
    }

    fn job_change_signal(&self) -> Option<tokio::sync::mpsc::Receiver<()>> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let store = self.clone();
        tokio::spawn(async move { watch_job_writes(store, tx).await });
        Some(rx)
    }

    async fn size_bytes(&self) -> Option<u64> {
        let mut c = self.c();
        let status = tokio::time::timeout(std::time::Duration::from_secs(3), c.status()).await.ok()?.ok()?;
        u64::try_from(status.db_size()).ok()
    }
}
