//! [`RunStore`] on SQL: run reads, and cancel requests (the one run write
//! that is not the leader's).

use async_trait::async_trait;
use gnomon_core::Millis;

use super::backend::{Backend, SqlStore};
use super::decode::{attempt_from_row, run_from_row, KeptRow, LiveAttemptRow};
use super::driver::Decodes;
use crate::{CancelOutcome, KeptRun, LiveAttempt, RunDetail, RunFilter, RunPage, RunRecord, RunStore, StoreError};

#[async_trait]
impl<B: Backend> RunStore for SqlStore<B> {
    async fn request_cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        // Not started: cancelled at once. Live: the leader is asked to stop it.
        let attempts = [
            (
                "UPDATE runs SET state = 'cancelled', reason = 'cancelled by request', updated_at = ? \
                 WHERE id = ? AND state IN ('waiting', 'pending', 'retrying')",
                CancelOutcome::Cancelled,
            ),
            (
                "UPDATE runs SET cancel_requested = 1, updated_at = ? WHERE id = ? AND state IN ('assigned', 'running')",
                CancelOutcome::Requested,
            ),
        ];
        for (sql, outcome) in attempts {
            if tx.execute(Self::q(sql).bind(now).bind(run_id)).await? == 1 {
                tx.commit().await?;
                return Ok(outcome);
            }
        }
        match tx.fetch_optional(Self::q("SELECT attempt FROM runs WHERE id = ?").bind(run_id)).await? {
            None => Err(StoreError::NotFound(format!("run {run_id}"))),
            Some(_) => Err(StoreError::Terminal(run_id.to_string())),
        }
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError> {
        let Some(row) = self.read_optional(Self::q("SELECT * FROM runs WHERE id = ?").bind(run_id)).await? else {
            return Ok(None);
        };
        let run = run_from_row(&row)?;
        let attempts = self.read_all(Self::q("SELECT * FROM attempts WHERE run_id = ? ORDER BY attempt").bind(run_id)).await?;
        Ok(Some(RunDetail { run, attempts: attempts.iter().map(attempt_from_row).collect::<Result<_, _>>()? }))
    }

    async fn list_runs(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError> {
        let limit = limit.clamp(1, 1000);
        let mut q = Self::q("SELECT * FROM runs WHERE 1 = 1");
        if let Some(ns) = &filter.namespace {
            q = q.push(" AND namespace = ?").bind(ns);
        }
        if let Some(job) = &filter.job {
            q = q.push(" AND job = ?").bind(job);
        }
        if let Some(state) = filter.state {
            q = q.push(" AND state = ?").bind(state.as_str());
        }
        if let Some(c) = cursor {
            q = q.push(" AND seq < ?").bind(c);
        }
        let q = q.push(" ORDER BY seq DESC LIMIT ?").bind(i64::from(limit) + 1).once();
        let mut runs: Vec<RunRecord> = self.read_all(q).await?.iter().map(run_from_row).collect::<Result<_, _>>()?;
        let next_cursor = if runs.len() > limit as usize {
            runs.truncate(limit as usize);
            runs.last().map(|r| r.seq)
        } else {
            None
        };
        Ok(RunPage { runs, next_cursor })
    }

    async fn open_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        let q = Self::q("SELECT * FROM runs WHERE state IN ('waiting', 'pending', 'assigned', 'running', 'retrying') ORDER BY seq");
        self.read_all(q).await?.iter().map(run_from_row).collect()
    }

    async fn live_attempts(&self) -> Result<Vec<LiveAttempt>, StoreError> {
        let q = Self::q(
            "SELECT r.id AS run_id, a.attempt AS attempt, a.worker AS worker, a.assigned_at AS assigned_at, \
             a.started_at AS started_at FROM runs r \
             JOIN attempts a ON a.run_id = r.id AND a.attempt = r.attempt \
             WHERE r.state IN ('assigned', 'running')",
        );
        self.read_all(q).await?.iter().map(|r| Ok(Decodes::<LiveAttemptRow>::decode(r)?.into())).collect()
    }

    async fn kept_keyed_runs(&self, since: Millis) -> Result<Vec<KeptRun>, StoreError> {
        // Newest first by seq (the primary key), a page at a time; a keyed
        // run's params and payload only (the others are not read).
        const PAGE: i64 = 500;
        let mut out = Vec::new();
        let mut cursor: Option<i64> = None;
        loop {
            let mut q = Self::q(
                "SELECT seq, id, namespace, state, fired_at, \
                 CASE WHEN id LIKE '%-k%' THEN params END AS params, \
                 CASE WHEN id LIKE '%-k%' THEN payload END AS payload FROM runs",
            );
            if let Some(c) = cursor {
                q = q.push(" WHERE seq < ?").bind(c);
            }
            let rows = self.read_all(q.push(" ORDER BY seq DESC LIMIT ?").bind(PAGE).once()).await?;
            for r in &rows {
                let row: KeptRow = r.decode()?;
                if row.fired_at() < since {
                    return Ok(out);
                }
                out.extend(row.kept(since)?);
                cursor = Some(row.seq);
            }
            if rows.len() < PAGE as usize {
                return Ok(out);
            }
        }
    }

    async fn cancel_requests(&self) -> Result<Vec<RunRecord>, StoreError> {
        let q = Self::q("SELECT * FROM runs WHERE state IN ('assigned', 'running') AND cancel_requested = 1");
        self.read_all(q).await?.iter().map(run_from_row).collect()
    }
}
