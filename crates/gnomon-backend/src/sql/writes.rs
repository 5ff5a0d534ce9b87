//! [`LeaderWrites`] on SQL: each write is one fenced transaction. A fire
//! inserts the runs that do not exist yet (checked under the fence lock,
//! so exactly) and advances its jobs; a transition batch locks its runs,
//! applies the compare-and-swap rules in memory ([`super::plan`]) and
//! writes the result with one multi-row `UPDATE` whose matched-row count is
//! checked.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;

use super::attempts::AttemptStep;
use super::backend::{Backend, SqlStore};
use super::decode::run_row;
use super::driver::{SqlRow, Tx};
use super::plan::{fold_candidates, latest_advances, plan_transitions, RunRow};
use super::CHUNK;
use crate::{Fence, FireOutcome, JobAdvance, LeaderWrites, NewNotification, NewRun, StoreError, Transition, TurnBatch, TurnWrite};

impl<B: Backend> SqlStore<B> {
    /// One fenced transaction: the fire, then the transitions (which may
    /// move the runs it just created), then, from `backfills`, the
    /// backfills' progress and the backfills started.
    async fn turn_tx(
        &self,
        fence: &Fence,
        runs: &[NewRun],
        advances: &[JobAdvance],
        transitions: &[Transition],
        backfills: Option<&TurnBatch>,
    ) -> Result<TurnWrite, StoreError> {
        Transition::check_lifecycle(transitions)?;
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        Self::check_fence(&mut tx, fence).await?;
        let (fired, applied) = Self::runs_in(&mut tx, runs, advances, transitions).await?;
        let (mut advanced, mut created) = (Vec::new(), Vec::new());
        if let Some(b) = backfills {
            for p in b.counted_progress(&fired) {
                advanced.push(Self::advance_backfill_in(&mut tx, &p).await?);
            }
            for n in &b.new_backfills {
                created.push(Self::create_backfill_in(&mut tx, n, b.at).await?.is_some());
            }
        }
        tx.commit().await?;
        Ok(TurnWrite { fired, applied: Ok(applied), advanced, created })
    }

    /// The runs part of a turn in the caller's fenced transaction: the
    /// fire, then the transitions.
    async fn runs_in(
        tx: &mut Tx<'_, B::Db>,
        runs: &[NewRun],
        advances: &[JobAdvance],
        transitions: &[Transition],
    ) -> Result<(Vec<FireOutcome>, Vec<bool>), StoreError> {
        let (outcomes, folded) = Self::fire_in(tx, runs, advances, transitions).await?;
        if !folded.iter().any(|f| *f) {
            let applied = Self::transition_in(tx, transitions).await?;
            return Ok((outcomes, applied));
        }
        // The folded transitions moved their runs as they were inserted;
        // their attempt changes follow, then the rest.
        let attempts: Vec<AttemptStep<'_>> = transitions
            .iter()
            .zip(&folded)
            .filter(|(_, f)| **f)
            .filter_map(|(t, _)| t.attempt.as_ref().map(|c| (t.run_id.as_str(), c, t.at)))
            .collect();
        Self::apply_attempt_changes(tx, &attempts).await?;
        let notes: Vec<&NewNotification> =
            transitions.iter().zip(&folded).filter(|(_, f)| **f).flat_map(|(t, _)| t.notify.iter()).collect();
        Self::insert_notifications(tx, &notes).await?;
        let rest: Vec<Transition> = transitions.iter().zip(&folded).filter(|(_, f)| !**f).map(|(t, _)| t.clone()).collect();
        let mut rest_applied = Self::transition_in(tx, &rest).await?.into_iter();
        let applied = folded.iter().map(|f| *f || rest_applied.next().unwrap_or(false)).collect();
        Ok((outcomes, applied))
    }

    /// Inserts the runs that do not exist yet. A transition of the same
    /// write that moves a run inserted here, from the state it is inserted
    /// in, and is the only one for that run, is folded into the insert (the
    /// row is written once, in its final state): the CAS holds by
    /// construction, since no one else can see the row before the commit.
    /// Returns the fire outcomes and, per transition, whether it was folded
    /// (its attempt change is the caller's to apply).
    async fn fire_in(
        tx: &mut Tx<'_, B::Db>,
        runs: &[NewRun],
        advances: &[JobAdvance],
        transitions: &[Transition],
    ) -> Result<(Vec<FireOutcome>, Vec<bool>), StoreError> {
        let ids: Vec<String> = runs.iter().map(|r| r.id()).collect();
        // Leader writes of the scope are serialised by the fence lock, so
        // this existence check is exact.
        let mut existing: HashSet<String> = HashSet::new();
        for chunk in ids.chunks(CHUNK) {
            let q = Self::q("SELECT id FROM runs WHERE id IN (").push_list(chunk).push(")").for_update().once();
            for r in tx.fetch_all(q).await? {
                existing.insert(r.text("id")?);
            }
        }
        let mut created: HashSet<String> = HashSet::new();
        let fresh: Vec<(&NewRun, &String)> =
            runs.iter().zip(&ids).filter(|(_, id)| !existing.contains(*id) && created.insert((*id).clone())).collect();
        // Transitions to fold: the only one of its run, looked up for fresh runs.
        let fold = fold_candidates(transitions);
        let mut folded = vec![false; transitions.len()];
        // Each run's upstream record as it is stored (JSON text).
        let fresh: Vec<(&NewRun, &String, RunRow, Option<String>)> = fresh
            .into_iter()
            .map(|(r, id)| {
                let mut row = RunRow::inserted(r);
                // Checked against the row as inserted; a move that does not
                // apply is left to fail as a CAS.
                if let Some(i) = fold.get(id.as_str()) {
                    folded[*i] = transitions[*i].apply_to(&mut row);
                }
                (r, id, row, r.upstream.as_deref().map(gnomon_core::deps::RunAfter::to_json))
            })
            .collect();
        let size = |(r, _, _, upstream): &(&NewRun, &String, RunRow, Option<String>)| {
            512 + r.params.as_deref().map_or(0, str::len)
                + r.payload.as_deref().map_or(0, str::len)
                + upstream.as_deref().map_or(0, str::len)
        };
        for chunk in crate::chunks::by_size(&fresh, CHUNK, super::MAX_STATEMENT_BYTES, size) {
            let mut q = Self::q(
                "INSERT INTO runs (id, job_uid, namespace, job, scheduled_at, fired_at, state, attempt, reason, next_attempt_at, manual, \
                 cancel_requested, updated_at, params, payload, upstream) VALUES ",
            );
            for (i, (r, id, row, upstream)) in chunk.iter().enumerate() {
                q = q
                    .push(if i > 0 {
                        ", (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?)"
                    } else {
                        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?)"
                    })
                    .bind(*id)
                    .bind(&r.job_uid)
                    .bind(&r.namespace)
                    .bind(&r.job)
                    .bind(r.scheduled_at)
                    .bind(r.fired_at)
                    .bind(row.state.as_str())
                    .bind(row.attempt)
                    .bind(row.reason.clone())
                    .bind(row.next_attempt_at)
                    .bind(r.manual)
                    .bind(row.updated_at)
                    .bind(r.params.clone())
                    .bind(r.payload.clone())
                    .bind(upstream.clone());
            }
            let n = tx.execute(q.or_ignore("id").once()).await?;
            if n != chunk.len() as u64 {
                return Err(StoreError::Backend(format!("fire inserted {n} of {} new runs; rolled back", chunk.len())));
            }
        }
        // One multi-row UPDATE per chunk of advances.
        let latest = latest_advances(advances);
        for chunk in latest.chunks(B::DIALECT.case_chunk) {
            let mut q = Self::q("UPDATE jobs SET last_scheduled_at = CASE");
            for (uid, at) in chunk {
                q = q
                    .push(" WHEN uid = ? THEN ")
                    .bind(*uid)
                    .push(B::DIALECT.greatest)
                    .push("(COALESCE(last_scheduled_at, ?), ?)")
                    .bind(*at)
                    .bind(*at);
            }
            q = q.push(" ELSE last_scheduled_at END WHERE uid IN (").push_list(chunk.iter().map(|(uid, _)| *uid)).push(")");
            tx.execute(q.once()).await?;
        }
        Ok((ids.iter().map(|id| if created.contains(id) { FireOutcome::Created } else { FireOutcome::Existed }).collect(), folded))
    }

    /// Applies a transition batch in the caller's transaction: per
    /// transition, whether it applied.
    async fn transition_in(tx: &mut Tx<'_, B::Db>, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
        if transitions.is_empty() {
            return Ok(Vec::new());
        }
        let mut ids: Vec<&str> = transitions.iter().map(|t| t.run_id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut locked: HashMap<String, RunRow> = HashMap::new();
        for chunk in ids.chunks(CHUNK) {
            let q = Self::q("SELECT id, state, attempt, reason, next_attempt_at, updated_at, cancel_requested FROM runs WHERE id IN (")
                .push_list(chunk.iter().copied())
                .push(") ORDER BY id")
                .for_update()
                .once();
            for r in tx.fetch_all(q).await? {
                let (id, row) = run_row(&r)?;
                locked.insert(id, row);
            }
        }
        let plan = plan_transitions(locked, transitions);
        for chunk in plan.finals.chunks(B::DIALECT.case_chunk) {
            let mut q = Self::q("UPDATE runs SET ");
            for (i, column) in ["state", "attempt", "reason", "next_attempt_at", "updated_at", "cancel_requested"].iter().enumerate() {
                q = q.push(if i > 0 { ", " } else { "" }).push(column).push(" = CASE id");
                for (id, _, _, row) in chunk {
                    q = q.push(" WHEN ? THEN ").bind(id);
                    q = match *column {
                        "state" => q.push_bind(row.state.as_str()),
                        "attempt" => q.push_bind(row.attempt),
                        "reason" => q.push_bind(row.reason.clone()),
                        "next_attempt_at" => q.push_bind(row.next_attempt_at),
                        "updated_at" => q.push_bind(row.updated_at),
                        _ => q.push_bind(row.cancel_requested),
                    };
                }
                q = q.push(" ELSE ").push(column).push(" END");
            }
            // The CAS: each row must still be in the state it was locked in.
            // The plain `id IN` list lets every planner use the index.
            q = q.push(" WHERE id IN (").push_list(chunk.iter().map(|(id, ..)| id)).push(") AND (id, state, attempt) IN (");
            for (i, (id, state, attempt, _)) in chunk.iter().enumerate() {
                q = q.push(if i > 0 { ", (?, ?, ?)" } else { "(?, ?, ?)" }).bind(id).bind(state.as_str()).bind(*attempt);
            }
            let n = tx.execute(q.push(")").once()).await?;
            if n != chunk.len() as u64 {
                return Err(StoreError::Backend(format!("transition matched {n} of {} locked runs; rolled back", chunk.len())));
            }
        }
        Self::apply_attempt_changes(tx, &plan.attempts).await?;
        let notes: Vec<&NewNotification> =
            transitions.iter().zip(&plan.applied).filter(|(_, ok)| **ok).flat_map(|(t, _)| t.notify.iter()).collect();
        Self::insert_notifications(tx, &notes).await?;
        Ok(plan.applied)
    }
}

#[async_trait]
impl<B: Backend> LeaderWrites for SqlStore<B> {
    // Never repeated here on a lost connection: it may have been lost during
    // the commit, so the outcome is unknown, and only the caller (the
    // leader, by reloading from the store) can tell what landed.
    async fn fire(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
        if let Some(r) = self.db.native_turn_write(fence, runs, advances, &[]).await {
            return r.map(|(fired, _)| fired);
        }
        self.turn_tx(fence, runs, advances, &[], None).await.map(|w| w.fired)
    }

    async fn transition(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
        if let Some(r) = self.db.native_turn_write(fence, &[], &[], transitions).await {
            return r.map(|(_, applied)| applied);
        }
        self.turn_tx(fence, &[], &[], transitions, None).await?.applied
    }

    /// One transaction, one commit. A turn with backfill work takes the
    /// shared path (the native SQLite write carries runs only).
    async fn write_turn(&self, fence: &Fence, batch: &TurnBatch) -> Result<TurnWrite, StoreError> {
        if batch.is_runs_only() {
            if let Some(r) = self.db.native_turn_write(fence, &batch.runs, &batch.advances, &batch.transitions).await {
                let (fired, applied) = r?;
                return Ok(TurnWrite { fired, applied: Ok(applied), advanced: Vec::new(), created: Vec::new() });
            }
        }
        self.turn_tx(fence, &batch.runs, &batch.advances, &batch.transitions, Some(batch)).await
    }
}
