//! The leader's fenced writes on the etcd store: fires (run keys created
//! only under `version == 0`) and transition batches (CAS on each run key's
//! `mod_revision`), packed into txns of at most [`MAX_OPS`] operations and
//! [`MAX_TXN_BYTES`] bytes.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use gnomon_core::{AttemptState, Millis};

use super::records::*;
use super::*;
use crate::chunks::{new_run_bytes, transition_bytes};

/// The most bytes of keys and values one txn carries: etcd refuses a
/// request larger than its `--max-request-bytes` (1.5 MiB by default), and
/// a refused write would be refused again on every retry.
pub(super) const MAX_TXN_BYTES: usize = 1024 * 1024;

impl EtcdStore {
    /// Writes a fire: a job's runs and its advance share a txn when they fit.
    pub(super) async fn fire_runs(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
        let ids: Vec<String> = runs.iter().map(|r| r.id()).collect();
        let mut outcome: HashMap<String, FireOutcome> = HashMap::new();
        // Group by job: a job's runs and its advance go in one txn when they fit.
        let mut by_job: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        let mut seen = HashSet::new();
        for (i, r) in runs.iter().enumerate() {
            if seen.insert(ids[i].clone()) {
                by_job.entry(r.job_uid.as_str()).or_default().push(i);
            } else {
                outcome.insert(ids[i].clone(), FireOutcome::Existed);
            }
        }
        let mut latest: HashMap<&str, Millis> = HashMap::new();
        for a in advances {
            let e = latest.entry(a.job_uid.as_str()).or_insert(a.last_scheduled_at);
            *e = (*e).max(a.last_scheduled_at);
        }
        for uid in latest.keys() {
            by_job.entry(uid).or_default();
        }
        // Units of work: (job uid, run indexes, carries the advance).
        const OPS_PER_RUN: usize = 5;
        let per_txn = (MAX_OPS - 4) / OPS_PER_RUN;
        let mut units: Vec<(&str, Vec<usize>, bool)> = Vec::new();
        for (uid, idx) in &by_job {
            if idx.is_empty() {
                units.push((uid, Vec::new(), true));
                continue;
            }
            let chunks = crate::chunks::by_size(idx, per_txn, MAX_TXN_BYTES, |&i| new_run_bytes(&runs[i]));
            let n = chunks.len();
            for (i, c) in chunks.into_iter().enumerate() {
                units.push((uid, c.to_vec(), i + 1 == n));
            }
        }
        // Pack units into txns.
        let mut batches: Vec<Vec<(&str, Vec<usize>, bool)>> = Vec::new();
        let mut cur: Vec<(&str, Vec<usize>, bool)> = Vec::new();
        let (mut cur_runs, mut cur_bytes) = (0, 0);
        for u in units {
            let cost = u.1.len() + usize::from(u.2);
            let bytes: usize = u.1.iter().map(|&i| new_run_bytes(&runs[i])).sum::<usize>() + 1024;
            if (cur_runs + cost > per_txn || cur_bytes + bytes > MAX_TXN_BYTES) && !cur.is_empty() {
                batches.push(std::mem::take(&mut cur));
                (cur_runs, cur_bytes) = (0, 0);
            }
            cur_runs += cost;
            cur_bytes += bytes;
            cur.push(u);
        }
        if !cur.is_empty() {
            batches.push(cur);
        }
        if batches.is_empty() {
            // Nothing to write still answers whether this term may write.
            self.check_fenced(fence).await?;
        }
        for batch in batches {
            self.fire_batch(fence, runs, &ids, &batch, &latest, &mut outcome).await?;
        }
        Ok(ids.iter().map(|id| outcome.get(id).copied().unwrap_or(FireOutcome::Existed)).collect())
    }

    /// Applies transitions in txns of at most [`MAX_OPS`] operations.
    pub(super) async fn transition_all(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
        Transition::check_lifecycle(transitions)?;
        let mut applied = vec![false; transitions.len()];
        // Chunks never split one run's transitions.
        // A txn's cost: per run, a put and maybe a delete (2 ops) and one
        // compare; per attempt change, a put and a compare; per
        // notification, two puts.
        let mut chunks: Vec<Vec<usize>> = Vec::new();
        let mut cur: Vec<usize> = Vec::new();
        let mut cur_ids: HashSet<&str> = HashSet::new();
        let (mut cost, mut bytes) = (0, 0);
        for (i, t) in transitions.iter().enumerate() {
            let add = if cur_ids.contains(t.run_id.as_str()) { 0 } else { 2 } + usize::from(t.attempt.is_some()) + 2 * t.notify.len();
            let add_bytes = transition_bytes(t);
            let over = cost + add > MAX_OPS - 4 || bytes + add_bytes > MAX_TXN_BYTES;
            if over && !cur.is_empty() && !cur_ids.contains(t.run_id.as_str()) {
                chunks.push(std::mem::take(&mut cur));
                cur_ids.clear();
                (cost, bytes) = (0, 0);
            }
            cost += add;
            bytes += add_bytes;
            cur_ids.insert(t.run_id.as_str());
            cur.push(i);
        }
        if !cur.is_empty() {
            chunks.push(cur);
        }
        if chunks.is_empty() {
            self.check_fenced(fence).await?;
        }
        // A chunk whose records (read in the chunk's round: a run's params
        // and payload) make it too large is split in two, by run.
        let mut queue: VecDeque<Vec<usize>> = chunks.into();
        while let Some(chunk) = queue.pop_front() {
            if self.transition_chunk(fence, transitions, &chunk, &mut applied).await? == Chunk::TooLarge {
                let (first, second) = split_by_run(transitions, &chunk);
                queue.push_front(second);
                queue.push_front(first);
            }
        }
        Ok(applied)
    }

    #[allow(clippy::too_many_arguments)]
    async fn fire_batch(
        &self,
        fence: &Fence,
        runs: &[NewRun],
        ids: &[String],
        batch: &[(&str, Vec<usize>, bool)],
        latest: &HashMap<&str, Millis>,
        outcome: &mut HashMap<String, FireOutcome>,
    ) -> Result<(), StoreError> {
        let mut skip: HashSet<usize> = HashSet::new();
        for _ in 0..CAS_ROUNDS {
            let mut compares = self.fence_compares(fence).await?;
            let (seq0, seq_rev) = self.next_seq().await?;
            let seq_key_name = self.k("counters/run_seq");
            compares.push(if seq_rev == 0 {
                Compare::version(seq_key_name.clone(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(seq_key_name.clone(), CompareOp::Equal, seq_rev)
            });
            let mut ops = Vec::new();
            let mut seq = seq0;
            let mut fresh = Vec::new();
            // The jobs whose advance rides in this txn.
            let adv_uids: Vec<&str> =
                batch.iter().filter(|(uid, _, adv)| *adv && latest.contains_key(uid)).map(|(uid, _, _)| *uid).collect();
            let job_keys: Vec<String> = adv_uids.iter().map(|u| self.k(&format!("jobs/{u}"))).collect();
            let jobs = self.get_many(&job_keys).await?;
            for (uid, kv) in adv_uids.iter().zip(jobs) {
                // A deleted job has nothing to advance.
                let Some(kv) = kv else { continue };
                let mut j: EJob = parse("job", kv.value())?;
                let at = latest[uid];
                j.last_scheduled_at = Some(j.last_scheduled_at.map_or(at, |l| l.max(at)));
                compares.push(Compare::mod_revision(self.k(&format!("jobs/{uid}")), CompareOp::Equal, kv.mod_revision()));
                ops.push(TxnOp::put(self.k(&format!("jobs/{uid}")), json(&j), None));
            }
            for (_, idx, _) in batch {
                for &i in idx {
                    if skip.contains(&i) {
                        continue;
                    }
                    let r = &runs[i];
                    let id = &ids[i];
                    seq += 1;
                    let key = self.k(&format!("runs/{id}"));
                    compares.push(Compare::version(key.clone(), CompareOp::Equal, 0));
                    let run = ERun {
                        id: id.clone(),
                        seq,
                        job_uid: r.job_uid.clone(),
                        job: r.job.clone(),
                        namespace: r.namespace.clone(),
                        scheduled_at: r.scheduled_at,
                        fired_at: r.fired_at,
                        state: r.state,
                        attempt: 0,
                        reason: r.reason.clone(),
                        next_attempt_at: None,
                        manual: r.manual,
                        cancel_requested: false,
                        updated_at: r.fired_at,
                        params: r.params.clone(),
                        payload: r.payload.clone(),
                        upstream: r.upstream.clone(),
                    };
                    ops.push(TxnOp::put(key, json(&run), None));
                    if !r.state.is_terminal() {
                        ops.push(TxnOp::put(self.k(&format!("open/{id}")), "", None));
                    }
                    ops.push(TxnOp::put(self.k(&format!("idx/seq/{}", seq_key(seq))), id.clone(), None));
                    ops.push(TxnOp::put(self.k(&format!("idx/job/{}/{}", r.job, seq_key(seq))), id.clone(), None));
                    ops.push(TxnOp::put(self.uid_index_key(&r.job_uid, seq), id.clone(), None));
                    fresh.push(id.clone());
                }
            }
            if ops.is_empty() {
                return self.check_fenced(fence).await;
            }
            ops.push(TxnOp::put(seq_key_name, seq.to_string(), None));
            if self.txn(Txn::new().when(compares).and_then(ops)).await?.succeeded() {
                for id in fresh {
                    outcome.insert(id, FireOutcome::Created);
                }
                return Ok(());
            }
            // Fenced, or a conflict: runs that exist now, a job or the counter moved.
            self.check_fenced(fence).await?;
            let candidates: Vec<usize> = batch.iter().flat_map(|(_, idx, _)| idx.iter().copied()).filter(|i| !skip.contains(i)).collect();
            let keys: Vec<String> = candidates.iter().map(|&i| self.k(&format!("runs/{}", ids[i]))).collect();
            for (&i, kv) in candidates.iter().zip(self.get_many(&keys).await?) {
                if kv.is_some() {
                    skip.insert(i);
                    outcome.insert(ids[i].clone(), FireOutcome::Existed);
                }
            }
        }
        Err(StoreError::Unavailable("fire: too many concurrent writers; try again".into()))
    }

    async fn transition_chunk(
        &self,
        fence: &Fence,
        all: &[Transition],
        chunk: &[usize],
        applied: &mut [bool],
    ) -> Result<Chunk, StoreError> {
        for _ in 0..CAS_ROUNDS {
            let mut ids: Vec<String> = chunk.iter().map(|&i| all[i].run_id.clone()).collect();
            ids.sort();
            ids.dedup();
            let read = self.read_runs(&ids).await?;
            let mut current: HashMap<String, ERun> = read.iter().map(|(k, (r, _))| (k.clone(), r.clone())).collect();
            // Attempts touched by Start/End: read them too.
            let mut attempt_keys: Vec<(String, u32)> = Vec::new();
            for &i in chunk {
                match &all[i].attempt {
                    Some(AttemptChange::Start { attempt }) | Some(AttemptChange::End { attempt, .. }) => {
                        attempt_keys.push((all[i].run_id.clone(), *attempt));
                    }
                    _ => {}
                }
            }
            attempt_keys.sort();
            attempt_keys.dedup();
            let akeys: Vec<String> = attempt_keys.iter().map(|(r, a)| self.k(&format!("attempts/{r}/{a:08}"))).collect();
            let mut attempts: HashMap<(String, u32), EAttempt> = HashMap::new();
            let mut attempt_revs: HashMap<(String, u32), i64> = HashMap::new();
            for (k, kv) in attempt_keys.iter().zip(self.get_many(&akeys).await?) {
                if let Some(kv) = kv {
                    attempts.insert(k.clone(), parse("attempt", kv.value())?);
                    attempt_revs.insert(k.clone(), kv.mod_revision());
                }
            }
            let mut done = Vec::new();
            let mut touched: HashSet<String> = HashSet::new();
            let mut touched_attempts: HashSet<(String, u32)> = HashSet::new();
            for &i in chunk {
                let t = &all[i];
                let Some(row) = current.get_mut(&t.run_id) else { continue };
                if !t.apply_to(row) {
                    continue;
                }
                match &t.attempt {
                    Some(AttemptChange::Assign { attempt, worker, token }) => {
                        let k = (t.run_id.clone(), *attempt);
                        attempts.insert(
                            k.clone(),
                            EAttempt {
                                attempt: *attempt,
                                worker: worker.clone(),
                                token: *token,
                                state: AttemptState::Assigned,
                                assigned_at: t.at,
                                started_at: None,
                                ended_at: None,
                                exit_code: None,
                                output: String::new(),
                            },
                        );
                        touched_attempts.insert(k);
                    }
                    Some(AttemptChange::Start { attempt }) => {
                        let k = (t.run_id.clone(), *attempt);
                        if let Some(a) = attempts.get_mut(&k) {
                            if a.state == AttemptState::Assigned {
                                a.state = AttemptState::Running;
                                a.started_at = Some(t.at);
                                touched_attempts.insert(k);
                            }
                        }
                    }
                    Some(AttemptChange::End { attempt, state, exit_code, output, started_at }) => {
                        let k = (t.run_id.clone(), *attempt);
                        if let Some(a) = attempts.get_mut(&k) {
                            a.state = *state;
                            a.ended_at = Some(t.at);
                            a.started_at = a.started_at.or(*started_at).or(Some(t.at));
                            a.exit_code = *exit_code;
                            a.output = output.clone();
                            touched_attempts.insert(k);
                        }
                    }
                    None => {}
                }
                touched.insert(t.run_id.clone());
                done.push(i);
            }
            if touched.is_empty() {
                return self.check_fenced(fence).await.map(|()| Chunk::Written);
            }
            let mut compares = self.fence_compares(fence).await?;
            let mut ops = Vec::new();
            let mut size = 0;
            for id in &touched {
                let key = self.k(&format!("runs/{id}"));
                compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, read[id].1));
                let run = &current[id];
                let value = json(run);
                size += key.len() + value.len();
                ops.push(TxnOp::put(key, value, None));
                if run.state.is_terminal() {
                    ops.push(TxnOp::delete(self.k(&format!("open/{id}")), None));
                }
            }
            let mut noted: HashSet<&str> = HashSet::new();
            for &i in &done {
                for n in all[i].notify.iter().filter(|n| noted.insert(n.id.as_str())) {
                    ops.extend(self.notification_ops(n));
                }
            }
            for k in &touched_attempts {
                let key = self.k(&format!("attempts/{}/{:08}", k.0, k.1));
                match attempt_revs.get(k) {
                    Some(rev) => compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, *rev)),
                    None => compares.push(Compare::version(key.clone(), CompareOp::Equal, 0)),
                }
                let value = json(&attempts[k]);
                size += key.len() + value.len();
                ops.push(TxnOp::put(key, value, None));
            }
            size += 1024 * noted.len();
            if size > MAX_TXN_BYTES && touched.len() > 1 {
                return Ok(Chunk::TooLarge);
            }
            if self.txn(Txn::new().when(compares).and_then(ops)).await?.succeeded() {
                for i in done {
                    applied[i] = true;
                }
                return Ok(Chunk::Written);
            }
            self.check_fenced(fence).await?;
            // A run or attempt moved under us (a cancel request): re-read, re-plan.
        }
        Err(StoreError::Unavailable("transition: too many concurrent writers; try again".into()))
    }
}

/// What became of a chunk of transitions.
#[derive(Debug, PartialEq, Eq)]
enum Chunk {
    /// Written (or found to need no write).
    Written,
    /// Not written: its records are larger than [`MAX_TXN_BYTES`].
    TooLarge,
}

/// Splits a chunk into two halves of its runs (a run's transitions stay
/// together and in order).
fn split_by_run(all: &[Transition], chunk: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut runs: Vec<&str> = Vec::new();
    for &i in chunk {
        if !runs.contains(&all[i].run_id.as_str()) {
            runs.push(all[i].run_id.as_str());
        }
    }
    let first: HashSet<&str> = runs[..runs.len() / 2].iter().copied().collect();
    chunk.iter().copied().partition(|&i| first.contains(all[i].run_id.as_str()))
}
