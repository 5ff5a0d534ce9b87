//! Run reads (one run, a page, the open runs and live attempts, cancel
//! requests) and the cancel request itself.

use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, TxnOp};
use gnomon_core::{Millis, RunState};

use super::*;

impl EtcdStore {
    pub(super) async fn cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
        for _ in 0..CAS_ROUNDS {
            let runs = self.read_runs(&[run_id.to_string()]).await?;
            let Some((mut run, rev)) = runs.into_iter().next().map(|(_, v)| v) else {
                return Err(StoreError::NotFound(format!("run {run_id}")));
            };
            let key = self.k(&format!("runs/{run_id}"));
            let (outcome, ops) = match run.state {
                RunState::Waiting | RunState::Pending | RunState::Retrying => {
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

    pub(super) async fn run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError> {
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

    pub(super) async fn page(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError> {
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

    pub(super) async fn open_run_records(&self) -> Result<Vec<RunRecord>, StoreError> {
        let r = self.get(self.k("open/"), Some(GetOptions::new().with_prefix().with_keys_only())).await?;
        let ids: Vec<String> =
            r.kvs().iter().filter_map(|kv| kv.key_str().ok().and_then(|k| k.rsplit('/').next()).map(str::to_string)).collect();
        let mut runs = self.runs_by_ids(&ids).await?;
        runs.retain(|r| !r.state.is_terminal());
        runs.sort_by_key(|r| r.seq);
        Ok(runs)
    }

    /// The first entry of the run index at or after seq `from`: its key
    /// and run id.
    async fn seq_entry_from(&self, from: i64) -> Result<Option<(String, String)>, StoreError> {
        let page = self
            .get(
                self.k(&format!("idx/seq/{}", seq_key(from))),
                Some(GetOptions::new().with_range(self.k("idx/seq0")).with_sort(SortTarget::Key, SortOrder::Ascend).with_limit(1)),
            )
            .await?;
        Ok(page.kvs().first().and_then(|kv| Some((kv.key_str().ok()?.to_string(), kv.value_str().ok()?.to_string()))))
    }

    /// The ended keyed runs fired at or after `since`. Fire times follow
    /// the run index's order, so the first run fired at or after `since`
    /// is found by a binary search over seqs (a lookup of one entry each:
    /// etcd reads a whole range to sort it newest first, but not oldest
    /// first), and the index is walked from there oldest first a page at a
    /// time, reading only the keyed runs.
    pub(super) async fn kept_runs(&self, since: Millis) -> Result<Vec<KeptRun>, StoreError> {
        const PAGE: i64 = 500;
        // The smallest seq whose next entry's run was fired at or after
        // `since` lies in lo..=hi (past the last seq handed out there is
        // no entry): about log2(runs) lookups.
        let (last, _) = self.next_seq().await?;
        let (mut lo, mut hi) = (0_i64, last.saturating_add(1));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let recent = match self.seq_entry_from(mid).await? {
                None => true,
                Some((_, id)) => match self.read_runs(std::slice::from_ref(&id)).await?.remove(&id) {
                    Some((run, _)) => run.fired_at >= since,
                    // Deleted since the lookup (retention, in a txn with
                    // its index entry): look at what follows.
                    None => false,
                },
            };
            if recent {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let mut out = Vec::new();
        let mut from = self.k(&format!("idx/seq/{}", seq_key(lo)));
        loop {
            let page = self
                .get(
                    from.clone(),
                    Some(GetOptions::new().with_range(self.k("idx/seq0")).with_sort(SortTarget::Key, SortOrder::Ascend).with_limit(PAGE)),
                )
                .await?;
            let entries: Vec<(String, String)> =
                page.kvs().iter().filter_map(|kv| Some((kv.key_str().ok()?.to_string(), kv.value_str().ok()?.to_string()))).collect();
            let ids: Vec<String> = entries.iter().map(|(_, id)| id.clone()).filter(|id| crate::is_keyed_run_id(id)).collect();
            for (id, (run, _)) in self.read_runs(&ids).await? {
                if run.state.is_terminal() {
                    out.extend(KeptRun::of(&id, &run.namespace, run.fired_at, run.params.as_deref(), run.payload.as_deref(), since));
                }
            }
            match entries.last() {
                Some((key, _)) if entries.len() as i64 == PAGE => from = format!("{key}\0"),
                _ => return Ok(out),
            }
        }
    }

    pub(super) async fn attempts_live(&self) -> Result<Vec<LiveAttempt>, StoreError> {
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
                out.push(LiveAttempt { run_id, attempt, worker: e.worker, assigned_at: e.assigned_at, started_at: e.started_at });
            }
        }
        Ok(out)
    }

    pub(super) async fn cancelling(&self) -> Result<Vec<RunRecord>, StoreError> {
        let mut runs = self.open_runs().await?;
        runs.retain(|r| r.cancel_requested && matches!(r.state, RunState::Assigned | RunState::Running));
        Ok(runs)
    }
}
