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
//! | `P/graphs/<namespace>` | empty; put by every job write that may add an edge or remove a job of the namespace (its `mod_revision` guards the dependency checks) |
//! | `P/edges/<namespace>/<upstream>/<downstream>` | the downstream's uid: the edge index (`edges`) |
//! | `P/edge_marks/<namespace>` | empty; put with the graph key by writes that keep the edge index whole |
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
//! | `P/worker_owners/<worker id>` | the credential the id is bound to, and since when (`workers`; never leased, never pruned) |
//!
//! # Invariants
//! - **Fire uniqueness**: a run key is created only under `version == 0`.
//! - **Worker bindings**: a worker id's owner key is put only under
//!   `version == 0`, by a txn that reads the key otherwise (`workers`).
//! - **Fencing**: every leader write is one `Txn` whose compares include
//!   `value(P/fence/<scope>) == token` and, when the term came from the etcd
//!   election, `create_revision(<leader key>) == token` — so a deposed
//!   leader's write fails both when a newer term fenced and as soon as its
//!   own election key is gone.
//! - **Dependencies**: a job put with edges and a delete compare the
//!   namespace's graph key at the revision read before the namespace's
//!   jobs were checked, and put it (see `graph`): no two of them commit
//!   against the same read.
//! - **CAS**: transitions compare each run key's `mod_revision` with the one
//!   read; a conflict is re-read and re-planned, never blindly retried.
//! - A txn holds at most [`MAX_OPS`] operations (etcd's default
//!   `--max-txn-ops` is 128) and about a MiB of keys and
//!   values (etcd refuses a request past `--max-request-bytes`, 1.5 MiB by
//!   default, and would refuse it again on every retry), so a large batch
//!   is several txns; a transition chunk whose records, once read, are too
//!   large is split in two by run. A job's runs
//!   and its `last_scheduled_at` advance share a txn whenever they fit in
//!   one; a catch-up too large for one txn advances the job in its last
//!   chunk, and a crash in between leaves runs whose re-fire is `Existed`.
//! - **Retries** (`retry`): a read is repeated at most 5 times, 100 → 800 ms
//!   apart, after errors a later try may not repeat; a write only when the
//!   client could not connect (the request never left), 5 tries, 50 → 400
//!   ms apart. Any other write error goes back to the caller, which
//!   re-reads to learn the outcome.
//! - **Watches** (`watching`: the job feed's signal, worker session
//!   deletions, the election's leader key) resume after a broken stream from
//!   the last event revision + 1 (or a progress notification's revision +
//!   1), ask for progress notifications so an idle watch stays current, and
//!   answer a compacted start revision with a full read of the current state,
//!   watching from the revision after it.

use std::collections::HashMap;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, GetOptions, KvClient, Txn, TxnOp, TxnOpResponse};
use gnomon_core::spec::JobSpec;
use gnomon_core::Millis;
use serde::{Deserialize, Serialize};

use crate::*;

mod backfills;
mod clock;
mod edges;
mod election;
mod graph;
mod jobs;
mod leadership;
mod notify;
mod records;
mod retention;
mod retry;
mod runs;
mod sessions;
#[cfg(test)]
mod test_cluster;
mod url;
#[cfg(test)]
mod watch_tests;
mod watching;
mod workers;
mod writes;

pub use election::*;

use records::*;
use retry::{retry_read, send_write};
use sessions::{watch_job_writes, EtcdSessions};
pub use url::{parse_url, EtcdUrl};

/// Most operations (and most compares) in one txn.
pub const MAX_OPS: usize = 120;
/// The largest answer read from etcd.
const MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;
/// How many times a write is re-read and re-planned after a CAS conflict.
const CAS_ROUNDS: usize = 20;

/// A fenced term as this handle knows it: its token and election key.
type Term = (u64, Option<String>);

/// The etcd store.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    /// Reads and writes, with room for answers as large as a prefix of
    /// the largest records gets (the client's default refuses past 4 MiB).
    kv: KvClient,
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

impl EtcdStore {
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let u = parse_url(url)?;
        let client = crate::etcd::connect_target(&u.target, std::time::Duration::from_secs(5)).await.map_err(|e| match e {
            ElectionError::Unavailable(m) => StoreError::Unavailable(m),
            ElectionError::Refused(m) => StoreError::Backend(m),
            ElectionError::Store(s) => s,
        })?;
        let kv = client.kv_client().max_decoding_message_size(MAX_ANSWER_BYTES);
        Ok(Self { client, kv, p: format!("/gnomon/{}", u.cluster), terms: Default::default() })
    }

    fn k(&self, rest: &str) -> String {
        format!("{}/{rest}", self.p)
    }

    fn c(&self) -> Client {
        self.client.clone()
    }

    /// One write, sent under [`retry::WRITES`]: repeated only when the
    /// client could not even connect to the member it picked (the request
    /// never left, so repeating it cannot apply it twice); any other error
    /// leaves its outcome unknown and goes back to the caller, which
    /// re-reads.
    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, StoreError> {
        send_write(|| {
            let mut c = self.kv.clone();
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    async fn get(&self, key: String, opts: Option<GetOptions>) -> Result<etcd_client::GetResponse, StoreError> {
        retry_read(|| {
            let mut c = self.kv.clone();
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
                let mut c = self.kv.clone();
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
impl JobStore for EtcdStore {
    async fn put_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError> {
        self.write_job(spec, precondition, now).await
    }

    async fn set_job_paused(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError> {
        self.pause_job(namespace, name, paused, now).await
    }

    async fn delete_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError> {
        self.remove_job(namespace, name, precondition).await
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
        self.changes_since(since).await
    }

    async fn job_heads(&self) -> Result<JobHeads, StoreError> {
        self.heads().await
    }

    async fn dependents(&self, namespace: &str, name: &str) -> Result<Vec<JobRecord>, StoreError> {
        self.indexed_dependents(namespace, name).await
    }

    async fn jobs_by_uid(&self, uids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
        self.by_uids(uids).await
    }
}

#[async_trait]
impl LeadershipStore for EtcdStore {
    async fn next_epoch(&self, scope: &str) -> Result<u64, StoreError> {
        self.bump_epoch(scope).await
    }

    async fn fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError> {
        self.take_fence(fence, holder, now).await
    }

    async fn leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError> {
        self.read_leadership(scope).await
    }

    async fn advance_leader_time(&self, fence: &Fence, at: Millis) -> Result<Millis, StoreError> {
        self.advance_clock(fence, at).await
    }
}

#[async_trait]
impl LeaderWrites for EtcdStore {
    async fn fire(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
        self.fire_runs(fence, runs, advances).await
    }

    async fn transition(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
        self.transition_all(fence, transitions).await
    }
}

#[async_trait]
impl RunStore for EtcdStore {
    async fn request_cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
        self.cancel(run_id, now).await
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError> {
        self.run(run_id).await
    }

    async fn list_runs(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError> {
        self.page(filter, limit, cursor).await
    }

    async fn open_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.open_run_records().await
    }

    async fn live_attempts(&self) -> Result<Vec<LiveAttempt>, StoreError> {
        self.attempts_live().await
    }

    async fn kept_keyed_runs(&self, since: Millis) -> Result<Vec<KeptRun>, StoreError> {
        self.kept_runs(since).await
    }

    async fn cancel_requests(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.cancelling().await
    }
}

#[async_trait]
impl NotificationStore for EtcdStore {
    async fn due_notifications(&self, now: Millis, limit: u32) -> Result<Vec<Notification>, StoreError> {
        self.due(now, limit).await
    }

    async fn settle_notification(&self, fence: &Fence, delivery: &Delivery) -> Result<bool, StoreError> {
        self.settle(fence, delivery).await
    }

    async fn run_notifications(&self, run_id: &str) -> Result<Vec<Notification>, StoreError> {
        self.of_run(run_id).await
    }
}

#[async_trait]
impl RetentionStore for EtcdStore {
    async fn prune(
        &self,
        fence: &Fence,
        keep_per_job: usize,
        before: Millis,
        keep_keyed_after: Millis,
        max: usize,
    ) -> Result<u64, StoreError> {
        self.prune_runs(fence, keep_per_job, before, keep_keyed_after, max).await
    }

    async fn size_bytes(&self) -> Option<u64> {
        let mut c = self.c();
        let status = tokio::time::timeout(std::time::Duration::from_secs(3), c.status()).await.ok()?.ok()?;
        u64::try_from(status.db_size()).ok()
    }
}

#[async_trait]
impl StoreProbes for EtcdStore {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    fn session_leases(&self) -> Option<std::sync::Arc<dyn SessionLeases>> {
        Some(std::sync::Arc::new(EtcdSessions { store: self.clone() }))
    }

    fn job_change_signal(&self) -> Option<tokio::sync::mpsc::Receiver<()>> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let store = self.clone();
        tokio::spawn(async move { watch_job_writes(store, tx, Default::default()).await });
        Some(rx)
    }
}
