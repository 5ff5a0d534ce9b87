//! The SQLite store's leader writes (fires, run transitions and attempt
//! changes, and the two together), on one kept `rusqlite` connection.
//!
//! Why not sqlx for these: sqlx runs a SQLite connection on a thread of its
//! own and hands every statement, every returned row, `BEGIN` and `COMMIT`
//! over to it and back (the last two with an acknowledgement each way). On a
//! leader turn of about a hundred transitions that was half the write's
//! time. Here the whole turn is one call on a blocking thread: `BEGIN
//! IMMEDIATE`, the fencing check, one cached single-row statement per row,
//! `COMMIT` (fsynced: `synchronous=FULL`).
//!
//! The semantics are the shared ones of the SQL stores, written the plain
//! way: each transition is a compare-and-swap `UPDATE` applied in batch
//! order (which [`crate::sql::plan_transitions`] emulates for the other
//! stores), and its attempt change follows only if it applied. A transition
//! that is the only one of a run this write creates is folded into the
//! run's insert (the row is written once, in its final state; no one else
//! can see it before the commit).

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use gnomon_core::Millis;
use rusqlite::{params, Connection, ErrorCode, OptionalExtension, TransactionBehavior};

use crate::model::{AttemptChange, Fence, FireOutcome, JobAdvance, NewRun, Transition};
use crate::sql::{fold_candidates, latest_advances, RunRow};
use crate::StoreError;

/// Opens the writer connection on a database that sqlx has opened and
/// migrated (WAL is a property of the file; the rest is per connection).
pub(crate) fn open(path: &Path, durable: bool) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    conn.busy_timeout(Duration::from_secs(10)).map_err(err)?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(err)?;
    conn.pragma_update(None, "synchronous", if durable { "FULL" } else { "OFF" }).map_err(err)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(err)?;
    // Checkpoints run in the background, never inside a leader commit.
    conn.pragma_update(None, "wal_autocheckpoint", 0).map_err(err)?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

fn err(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Unavailable(format!("sqlite: {e}")),
        _ => StoreError::Backend(format!("sqlite: {e}")),
    }
}

const FENCE: &str = "SELECT token FROM leadership WHERE scope = ?1";
const INSERT_RUN: &str = "INSERT INTO runs (id, job_uid, namespace, job, scheduled_at, fired_at, state, attempt, reason, \
                          next_attempt_at, manual, cancel_requested, updated_at, params, payload, upstream) \
                          VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 0, ?12, ?13, ?14, ?15) ON CONFLICT DO NOTHING";
const ADVANCE_JOB: &str = "UPDATE jobs SET last_scheduled_at = MAX(COALESCE(last_scheduled_at, ?2), ?2) WHERE uid = ?1";
const CAS_RUN: &str = "UPDATE runs SET state = ?4, attempt = ?5, reason = COALESCE(?6, reason), next_attempt_at = ?7, \
                       updated_at = ?8, cancel_requested = CASE WHEN ?9 THEN 0 ELSE cancel_requested END \
                       WHERE id = ?1 AND state = ?2 AND attempt = ?3";
const INSERT_ATTEMPT: &str = "INSERT INTO attempts (run_id, attempt, worker, token, state, assigned_at, output) \
                              VALUES (?1, ?2, ?3, ?4, 'assigned', ?5, '')";
const INSERT_NOTIFICATION: &str = "INSERT INTO notifications (id, run_id, namespace, job, outcome, target, state, attempts, \
                                   next_at, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', 0, ?7, ?7, ?7) \
                                   ON CONFLICT DO NOTHING";
const START_ATTEMPT: &str = "UPDATE attempts SET state = 'running', started_at = ?3 \
                             WHERE run_id = ?1 AND attempt = ?2 AND state = 'assigned'";
const END_ATTEMPT: &str = "UPDATE attempts SET state = ?3, ended_at = ?4, started_at = COALESCE(started_at, ?5, ?4), \
                           exit_code = ?6, output = ?7 \
                           WHERE run_id = ?1 AND attempt = ?2 AND state IN ('assigned', 'running')";

/// One fenced transaction: the runs created if absent (outcome per run),
/// the job advances, then the transitions in order (applied or not, per
/// transition). The caller has checked the batch's lifecycle.
pub(crate) fn turn_write(
    conn: &mut Connection,
    fence: &Fence,
    runs: &[NewRun],
    advances: &[JobAdvance],
    transitions: &[Transition],
) -> Result<(Vec<FireOutcome>, Vec<bool>), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(err)?;
    let current: Option<i64> = tx.prepare_cached(FENCE).map_err(err)?.query_row([&fence.scope], |r| r.get(0)).optional().map_err(err)?;
    let current = current.map(|v| u64::try_from(v).unwrap_or(0)).unwrap_or(0);
    if current != fence.token {
        crate::count_fencing_rejection();
        return Err(StoreError::Fenced { scope: fence.scope.clone(), token: fence.token, current });
    }

    // Transitions that may fold into an insert: the only one of their run.
    let fold = fold_candidates(transitions);
    let mut folded = vec![false; transitions.len()];
    let ids: Vec<String> = runs.iter().map(NewRun::id).collect();
    let mut created: HashSet<&str> = HashSet::new();
    if !runs.is_empty() {
        let mut insert = tx.prepare_cached(INSERT_RUN).map_err(err)?;
        let mut seen: HashSet<&str> = HashSet::new();
        for (r, id) in runs.iter().zip(&ids) {
            if !seen.insert(id.as_str()) {
                continue; // twice in one batch: the first one counts
            }
            let mut row = RunRow::inserted(r);
            // Checked against the row as inserted; a move that does not
            // apply is left to fail as a CAS below.
            let fold_i = fold.get(id.as_str()).copied().filter(|i| transitions[*i].apply_to(&mut row));
            let n = insert
                .execute(params![
                    id,
                    r.job_uid,
                    r.namespace,
                    r.job,
                    r.scheduled_at,
                    r.fired_at,
                    row.state.as_str(),
                    i64::from(row.attempt),
                    row.reason,
                    row.next_attempt_at,
                    i64::from(r.manual),
                    row.updated_at,
                    r.params,
                    r.payload,
                    r.upstream.as_deref().map(gnomon_core::deps::RunAfter::to_json),
                ])
                .map_err(err)?;
            if n == 1 {
                created.insert(id.as_str());
                if let Some(i) = fold_i {
                    folded[i] = true;
                }
            }
        }
    }
    if !advances.is_empty() {
        let mut advance = tx.prepare_cached(ADVANCE_JOB).map_err(err)?;
        for (uid, at) in latest_advances(advances) {
            advance.execute(params![uid, at]).map_err(err)?;
        }
    }

    let mut applied = Vec::with_capacity(transitions.len());
    if !transitions.is_empty() {
        let mut cas = tx.prepare_cached(CAS_RUN).map_err(err)?;
        for (t, was_folded) in transitions.iter().zip(&folded) {
            let ok = *was_folded
                || cas
                    .execute(params![
                        t.run_id,
                        t.from.as_str(),
                        i64::from(t.from_attempt),
                        t.to.as_str(),
                        i64::from(t.to_attempt),
                        t.reason,
                        t.next_attempt_at,
                        t.at,
                        t.to.is_terminal(),
                    ])
                    .map_err(err)?
                    == 1;
            if ok {
                if let Some(change) = &t.attempt {
                    apply_attempt_change(&tx, &t.run_id, change, t.at)?;
                }
                for n in &t.notify {
                    tx.prepare_cached(INSERT_NOTIFICATION)
                        .map_err(err)?
                        .execute(params![n.id, n.run_id, n.namespace, n.job, n.outcome, n.target, n.created_at])
                        .map_err(err)?;
                }
            }
            applied.push(ok);
        }
    }
    tx.commit().map_err(err)?;
    let outcomes = ids.iter().map(|id| if created.contains(id.as_str()) { FireOutcome::Created } else { FireOutcome::Existed }).collect();
    Ok((outcomes, applied))
}

fn apply_attempt_change(tx: &Connection, run_id: &str, change: &AttemptChange, at: Millis) -> Result<(), StoreError> {
    match change {
        AttemptChange::Assign { attempt, worker, token } => {
            let token = i64::try_from(*token).unwrap_or(i64::MAX);
            tx.prepare_cached(INSERT_ATTEMPT).map_err(err)?.execute(params![run_id, i64::from(*attempt), worker, token, at])
        }
        AttemptChange::Start { attempt } => {
            tx.prepare_cached(START_ATTEMPT).map_err(err)?.execute(params![run_id, i64::from(*attempt), at])
        }
        AttemptChange::End { attempt, state, exit_code, output, started_at } => tx
            .prepare_cached(END_ATTEMPT)
            .map_err(err)?
            .execute(params![run_id, i64::from(*attempt), state.as_str(), at, started_at, exit_code, output]),
    }
    .map_err(err)?;
    Ok(())
}
