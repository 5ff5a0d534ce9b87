//! The rows a leader write adds beside its runs: attempt rows (assigned,
//! started, ended) and the notifications of applied transitions, written
//! in multi-row statements inside the caller's fenced transaction.

use gnomon_core::Millis;

use super::backend::{to_i64, Backend, SqlStore};
use super::driver::Tx;
use super::query::Query;
use super::{CHUNK, END_CHUNK};
use crate::{AttemptChange, NewNotification, StoreError};

/// One attempt change of an applied transition: its run, the change, and
/// when it happened.
pub(crate) type AttemptStep<'a> = (&'a str, &'a AttemptChange, Millis);

fn attempt_of(change: &AttemptChange) -> i64 {
    match change {
        AttemptChange::Assign { attempt, .. } | AttemptChange::Start { attempt } | AttemptChange::End { attempt, .. } => {
            i64::from(*attempt)
        }
    }
}

/// Appends `run_id IN (…) AND (run_id, attempt) IN ((k1, a1), …)`; the
/// plain list lets every planner use the primary key.
fn push_attempt_keys(q: Query, chunk: &[&AttemptStep<'_>]) -> Query {
    let q = q.push("run_id IN (").push_list(chunk.iter().map(|(run_id, _, _)| *run_id)).push(") AND (run_id, attempt) IN (");
    let mut q = q;
    for (i, (run_id, change, _)) in chunk.iter().enumerate() {
        q = q.push(if i > 0 { ", (" } else { "(" }).push_bind(*run_id).push(", ").push_bind(attempt_of(change)).push(")");
    }
    q.push(")")
}

impl<B: Backend> SqlStore<B> {
    /// Applies attempt changes: inserts for assignments, then one `CASE`
    /// update per chunk of starts and of ends (each a compare-and-swap on
    /// the attempt's state).
    pub(crate) async fn apply_attempt_changes(tx: &mut Tx<'_, B::Db>, changes: &[AttemptStep<'_>]) -> Result<(), StoreError> {
        let assigns: Vec<_> = changes.iter().filter(|(_, c, _)| matches!(c, AttemptChange::Assign { .. })).collect();
        for chunk in assigns.chunks(CHUNK) {
            let mut q = Self::q("INSERT INTO attempts (run_id, attempt, worker, token, state, assigned_at, output) VALUES ");
            for (i, (run_id, change, at)) in chunk.iter().enumerate() {
                if let AttemptChange::Assign { attempt, worker, token } = change {
                    q = q
                        .push(if i > 0 { ", (?, ?, ?, ?, 'assigned', ?, '')" } else { "(?, ?, ?, ?, 'assigned', ?, '')" })
                        .bind(*run_id)
                        .bind(*attempt)
                        .bind(worker)
                        .bind(to_i64(*token))
                        .bind(*at);
                }
            }
            tx.execute(q.once()).await?;
        }
        let starts: Vec<_> = changes.iter().filter(|(_, c, _)| matches!(c, AttemptChange::Start { .. })).collect();
        for chunk in starts.chunks(B::DIALECT.case_chunk) {
            let mut q = Self::q("UPDATE attempts SET state = 'running', started_at = CASE");
            for (run_id, change, at) in chunk {
                q = q.push(" WHEN run_id = ? AND attempt = ? THEN ?").bind(*run_id).bind(attempt_of(change)).bind(*at);
            }
            q = push_attempt_keys(q.push(" ELSE started_at END WHERE state = 'assigned' AND "), chunk);
            tx.execute(q.once()).await?;
        }
        let ends: Vec<_> = changes.iter().filter(|(_, c, _)| matches!(c, AttemptChange::End { .. })).collect();
        for chunk in ends.chunks(END_CHUNK.min(B::DIALECT.case_chunk)) {
            let mut q = Self::q("UPDATE attempts SET ");
            // One CASE per column, keyed by (run_id, attempt).
            for (i, column) in ["state", "ended_at", "started_at", "exit_code", "output"].iter().enumerate() {
                q = q.push(if i > 0 { ", " } else { "" }).push(column).push(" = CASE");
                for (run_id, change, at) in chunk {
                    let AttemptChange::End { attempt, state, exit_code, output, started_at } = change else { continue };
                    q = q.push(" WHEN run_id = ? AND attempt = ? THEN ").bind(*run_id).bind(*attempt);
                    q = match *column {
                        "state" => q.push_bind(state.as_str()),
                        "ended_at" => q.push_bind(*at),
                        "started_at" => q.push("COALESCE(started_at, ?, ?)").bind(*started_at).bind(*at),
                        "exit_code" => q.push_bind(exit_code.map(i64::from)),
                        _ => q.push_bind(output),
                    };
                }
                q = q.push(" ELSE ").push(column).push(" END");
            }
            q = push_attempt_keys(q.push(" WHERE state IN ('assigned', 'running') AND "), chunk);
            tx.execute(q.once()).await?;
        }
        Ok(())
    }

    /// The notifications of applied transitions, insert-or-ignore.
    pub(crate) async fn insert_notifications(tx: &mut Tx<'_, B::Db>, notes: &[&NewNotification]) -> Result<(), StoreError> {
        for chunk in notes.chunks(CHUNK / 8) {
            let mut q = Self::q(
                "INSERT INTO notifications (id, run_id, namespace, job, outcome, target, state, attempts, next_at, created_at, updated_at) VALUES ",
            );
            for (i, n) in chunk.iter().enumerate() {
                q = q
                    .push(if i > 0 { ", (?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?)" } else { "(?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?)" })
                    .bind(&n.id)
                    .bind(&n.run_id)
                    .bind(&n.namespace)
                    .bind(&n.job)
                    .bind(&n.outcome)
                    .bind(&n.target)
                    .bind(n.created_at)
                    .bind(n.created_at)
                    .bind(n.created_at);
            }
            tx.execute(q.or_ignore("id").once()).await?;
        }
        Ok(())
    }
}
