//! [`RetentionStore`] and [`StoreProbes`] on SQL: pruning terminal runs
//! (chosen by index walks outside the write, deleted in one short fenced
//! transaction), the database's size and its server's clock.

use std::collections::BTreeSet;

use async_trait::async_trait;
use gnomon_core::run::ALL_RUN_STATES;
use gnomon_core::Millis;

use super::backend::{Backend, SqlStore};
use super::driver::SqlRow;
use super::CHUNK;
use crate::{Fence, RetentionStore, StoreError, StoreProbes};

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl<B: Backend> SqlStore<B> {
    /// Terminal runs fired before `before`, oldest first, at most `max`
    /// in all with those already `chosen`.
    async fn choose_by_age(
        &self,
        terminal: &[&str],
        before: Millis,
        keep_keyed_after: Millis,
        max: usize,
        chosen: &mut BTreeSet<String>,
    ) -> Result<(), StoreError> {
        // Per terminal state, the oldest runs in insertion order (the
        // `(state, seq)` index). Fire times follow insertion (leader time
        // never runs backwards), so the runs fired before `before` are the
        // head of that order: the walk stops at the first younger one.
        for state in terminal {
            if chosen.len() >= max {
                break;
            }
            let q =
                Self::q("SELECT id, fired_at FROM runs WHERE state = ? ORDER BY seq LIMIT ?").bind(*state).bind(limit(max - chosen.len()));
            for r in &self.read_all(q).await? {
                let fired_at = r.int("fired_at")?;
                if fired_at >= before {
                    break;
                }
                let id = r.text("id")?;
                if !(crate::is_keyed_run_id(&id) && fired_at >= keep_keyed_after) {
                    chosen.insert(id);
                }
            }
        }
        Ok(())
    }

    /// Terminal runs beyond the newest `keep_per_job` of their job (open
    /// ones count; only terminal ones go).
    async fn choose_by_count(
        &self,
        terminal: &[&str],
        keep_per_job: usize,
        keep_keyed_after: Millis,
        max: usize,
        chosen: &mut BTreeSet<String>,
    ) -> Result<(), StoreError> {
        // The jobs over the count, from an index-only scan of
        // `(namespace, job, seq)`, then per job the seq of its newest run
        // past the count.
        let over = Self::q("SELECT namespace, job FROM runs GROUP BY namespace, job HAVING COUNT(*) > ?").bind(limit(keep_per_job));
        for r in &self.read_all(over).await? {
            if chosen.len() >= max {
                break;
            }
            let (ns, job) = (r.text("namespace")?, r.text("job")?);
            let cutoff = Self::q("SELECT seq FROM runs WHERE namespace = ? AND job = ? ORDER BY seq DESC LIMIT 1 OFFSET ?")
                .bind(&ns)
                .bind(&job)
                .bind(limit(keep_per_job));
            let Some(cutoff) = self.read_optional(cutoff).await? else { continue };
            // The state is filtered here, not in SQL, so the planner walks
            // this job's index and not the states'.
            let q = Self::q("SELECT id, state, fired_at FROM runs WHERE namespace = ? AND job = ? AND seq <= ? ORDER BY seq LIMIT ?")
                .bind(&ns)
                .bind(&job)
                .bind(cutoff.int("seq")?)
                .bind(limit(max - chosen.len()));
            for r in &self.read_all(q).await? {
                let id = r.text("id")?;
                let held = crate::is_keyed_run_id(&id) && r.int("fired_at")? >= keep_keyed_after;
                if terminal.contains(&r.text("state")?.as_str()) && !held {
                    chosen.insert(id);
                }
            }
        }
        Ok(())
    }
}

#[async_trait]
impl<B: Backend> RetentionStore for SqlStore<B> {
    async fn size_bytes(&self) -> Option<u64> {
        let row = self.read_optional(Self::q(B::DIALECT.size_query)).await.ok()??;
        row.first_opt_int().ok()?.and_then(|n| u64::try_from(n).ok())
    }

    async fn prune(
        &self,
        fence: &Fence,
        keep_per_job: usize,
        before: Millis,
        keep_keyed_after: Millis,
        max: usize,
    ) -> Result<u64, StoreError> {
        // The runs to delete are chosen by reads outside the write
        // transaction (a terminal run stays terminal, so the choice cannot
        // go stale); the deletion is one short fenced transaction.
        let terminal: Vec<&str> = ALL_RUN_STATES.iter().filter(|s| s.is_terminal()).map(|s| s.as_str()).collect();
        let mut chosen = BTreeSet::new();
        self.choose_by_age(&terminal, before, keep_keyed_after, max, &mut chosen).await?;
        if chosen.len() < max {
            self.choose_by_count(&terminal, keep_per_job, keep_keyed_after, max, &mut chosen).await?;
        }
        if chosen.is_empty() {
            // Nothing to delete: still refuse a stale term, without taking
            // the write lock.
            let current = self.read_optional(Self::q("SELECT token FROM leadership WHERE scope = ?").bind(&fence.scope)).await?;
            return Self::fence_holds(fence, current.map(|r| r.int("token")).transpose()?).map(|()| 0);
        }
        let ids: Vec<String> = chosen.into_iter().take(max).collect();
        let open: Vec<&str> = ALL_RUN_STATES.iter().filter(|s| !s.is_terminal()).map(|s| s.as_str()).collect();
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        Self::check_fence(&mut tx, fence).await?;
        let mut deleted = 0u64;
        for chunk in ids.chunks(CHUNK) {
            tx.execute(Self::q("DELETE FROM attempts WHERE run_id IN (").push_list(chunk).push(")").once()).await?;
            tx.execute(Self::q("DELETE FROM notifications WHERE run_id IN (").push_list(chunk).push(")").once()).await?;
            // Never an open run, whatever the choice said (`NOT IN` the open
            // states, so that planners look the ids up rather than walk a
            // state).
            let runs = Self::q("DELETE FROM runs WHERE id IN (")
                .push_list(chunk)
                .push(") AND state NOT IN (")
                .push_list(open.iter().copied())
                .push(")");
            deleted += tx.execute(runs.once()).await?;
        }
        tx.commit().await?;
        Ok(deleted)
    }
}

#[async_trait]
impl<B: Backend> StoreProbes for SqlStore<B> {
    fn backend(&self) -> &'static str {
        B::DIALECT.name
    }

    async fn server_clock(&self) -> Result<Option<Millis>, StoreError> {
        let Some(q) = B::DIALECT.clock_query else { return Ok(None) };
        self.read_optional(Self::q(q)).await?.map(|r| r.first_opt_int()).transpose().map(Option::flatten)
    }
}
