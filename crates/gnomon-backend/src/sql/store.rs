//! The [`sql_store!`] macro: one `Store` implementation per sqlx driver. This
//! part holds the imports, the row decoders, migrations and the transaction
//! helpers; the leader writes are in [`super::writes`], the `Store` methods
//! in [`super::api`].

/// Instantiates the `Store` implementation for one sqlx driver. The macro
/// keeps a single copy of the logic while every query stays monomorphic
/// (generic sqlx code over `Database` needs unwieldy higher-ranked bounds).
macro_rules! sql_store {
    ($store:ident, $db:ty, $row:ty, $dialect:expr) => {
        use std::collections::{HashMap, HashSet};

        use async_trait::async_trait;
        use gnomon_core::spec::JobSpec;
        use gnomon_core::{AttemptState, Millis, RunState};
        use sqlx::{QueryBuilder, Row, Transaction};

        use crate::sql::{db_err, is_unique_violation, plan_transitions, NativeWrites, RunRow, CHUNK, END_CHUNK};
        use crate::*;

        const D: &crate::sql::Dialect = &$dialect;

        fn to_u64(v: i64) -> u64 {
            u64::try_from(v).unwrap_or(0)
        }
        fn to_i64(v: u64) -> i64 {
            i64::try_from(v).unwrap_or(i64::MAX)
        }
        fn new_uid() -> String {
            $crate::sql::CHOSEN_UID.try_with(|u| u.clone()).unwrap_or_else(|_| format!("{:016x}", rand::random::<u64>()))
        }

        /// A text column. MySQL reports columns with a `_bin` collation (used
        /// so names compare case-sensitively, as on the other backends) as
        /// binary, so those are read as bytes and checked as UTF-8.
        fn text(r: &$row, column: &str) -> Result<String, StoreError> {
            match r.try_get::<String, _>(column) {
                Ok(s) => Ok(s),
                Err(_) => {
                    let bytes: Vec<u8> = r.try_get(column).map_err(db_err)?;
                    String::from_utf8(bytes).map_err(|e| StoreError::Corrupt(format!("column {column}: {e}")))
                }
            }
        }

        fn opt_text(r: &$row, column: &str) -> Result<Option<String>, StoreError> {
            match r.try_get::<Option<String>, _>(column) {
                Ok(s) => Ok(s),
                Err(_) => {
                    let bytes: Option<Vec<u8>> = r.try_get(column).map_err(db_err)?;
                    bytes.map(|b| String::from_utf8(b).map_err(|e| StoreError::Corrupt(format!("column {column}: {e}")))).transpose()
                }
            }
        }

        fn job_from_row(r: &$row) -> Result<JobRecord, StoreError> {
            let spec_text = text(r, "spec")?;
            let spec: JobSpec = serde_json::from_str(&spec_text).map_err(|e| StoreError::Corrupt(format!("job spec: {e}")))?;
            Ok(JobRecord {
                uid: text(r, "uid")?,
                namespace: text(r, "namespace")?,
                name: text(r, "name")?,
                spec,
                version: to_u64(r.try_get("version").map_err(db_err)?),
                paused: r.try_get::<i64, _>("paused").map_err(db_err)? != 0,
                created_at: r.try_get("created_at").map_err(db_err)?,
                updated_at: r.try_get("updated_at").map_err(db_err)?,
                last_scheduled_at: r.try_get("last_scheduled_at").map_err(db_err)?,
                paused_at: r.try_get("paused_at").map_err(db_err)?,
                resumed_at: r.try_get("resumed_at").map_err(db_err)?,
                schedule_changed_at: r.try_get("schedule_changed_at").map_err(db_err)?,
                previous_schedule: opt_text(r, "previous_schedule")?
                    .map(|t| serde_json::from_str(&t))
                    .transpose()
                    .map_err(|e| StoreError::Corrupt(format!("job previous_schedule: {e}")))?,
                change_seq: to_u64(r.try_get("change_seq").map_err(db_err)?),
            })
        }

        fn run_from_row(r: &$row) -> Result<RunRecord, StoreError> {
            let state = text(r, "state")?;
            Ok(RunRecord {
                id: text(r, "id")?,
                seq: r.try_get("seq").map_err(db_err)?,
                job_uid: text(r, "job_uid")?,
                job: text(r, "job")?,
                namespace: text(r, "namespace")?,
                scheduled_at: r.try_get("scheduled_at").map_err(db_err)?,
                fired_at: r.try_get("fired_at").map_err(db_err)?,
                state: RunState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("run state {state:?}")))?,
                attempt: u32::try_from(r.try_get::<i64, _>("attempt").map_err(db_err)?).unwrap_or(0),
                reason: opt_text(r, "reason")?,
                next_attempt_at: r.try_get("next_attempt_at").map_err(db_err)?,
                manual: r.try_get::<i64, _>("manual").map_err(db_err)? != 0,
                cancel_requested: r.try_get::<i64, _>("cancel_requested").map_err(db_err)? != 0,
                updated_at: r.try_get("updated_at").map_err(db_err)?,
            })
        }

        fn notification_from_row(r: &$row) -> Result<Notification, StoreError> {
            let state = text(r, "state")?;
            Ok(Notification {
                id: text(r, "id")?,
                run_id: text(r, "run_id")?,
                namespace: text(r, "namespace")?,
                job: text(r, "job")?,
                outcome: text(r, "outcome")?,
                target: text(r, "target")?,
                state: NotificationState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("notification state {state:?}")))?,
                attempts: u32::try_from(r.try_get::<i64, _>("attempts").map_err(db_err)?).unwrap_or(0),
                next_at: r.try_get("next_at").map_err(db_err)?,
                last_error: opt_text(r, "last_error")?,
                created_at: r.try_get("created_at").map_err(db_err)?,
                updated_at: r.try_get("updated_at").map_err(db_err)?,
            })
        }

        fn attempt_from_row(r: &$row) -> Result<AttemptRecord, StoreError> {
            let state = text(r, "state")?;
            Ok(AttemptRecord {
                attempt: u32::try_from(r.try_get::<i64, _>("attempt").map_err(db_err)?).unwrap_or(0),
                worker: text(r, "worker")?,
                token: to_u64(r.try_get("token").map_err(db_err)?),
                state: AttemptState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("attempt state {state:?}")))?,
                assigned_at: r.try_get("assigned_at").map_err(db_err)?,
                started_at: r.try_get("started_at").map_err(db_err)?,
                ended_at: r.try_get("ended_at").map_err(db_err)?,
                exit_code: r.try_get::<Option<i64>, _>("exit_code").map_err(db_err)?.and_then(|c| i32::try_from(c).ok()),
                output: text(r, "output")?,
            })
        }

        type Tx<'c> = Transaction<'c, $db>;

        impl $store {
            /// Applies the dialect's migrations under a database-wide lock, so
            /// several servers starting at once migrate exactly once.
            pub async fn migrate(&self) -> Result<i64, StoreError> {
                let mut conn = self.pool.acquire().await.map_err(db_err)?;
                sqlx::raw_sql(D.migrate_lock).execute(&mut *conn).await.map_err(db_err)?;
                let result = async {
                    sqlx::query("CREATE TABLE IF NOT EXISTS gnomon_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)")
                        .execute(&mut *conn)
                        .await
                        .map_err(db_err)?;
                    let current: Option<i64> =
                        sqlx::query_scalar("SELECT MAX(version) FROM gnomon_migrations").fetch_one(&mut *conn).await.map_err(db_err)?;
                    let applied = current.unwrap_or(0);
                    let mut version = applied;
                    for m in D.migrations.iter().filter(|m| m.version > applied) {
                        for stmt in m.statements {
                            sqlx::raw_sql(stmt)
                                .execute(&mut *conn)
                                .await
                                .map_err(|e| StoreError::Backend(format!("migration {} of the {} store failed: {e}", m.version, D.name)))?;
                        }
                        sqlx::query(&D.q("INSERT INTO gnomon_migrations (version, applied_at) VALUES (?, ?)"))
                            .bind(m.version)
                            .bind(chrono_now_ms())
                            .execute(&mut *conn)
                            .await
                            .map_err(db_err)?;
                        version = m.version;
                    }
                    Ok::<i64, StoreError>(version)
                }
                .await;
                let _ = sqlx::raw_sql(D.migrate_unlock).execute(&mut *conn).await;
                result
            }

            /// Exercises every kind of statement gnomon issues, in a
            /// transaction that is rolled back, so a missing privilege is
            /// reported at start rather than at the first fire.
            pub async fn probe(&self) -> Result<(), StoreError> {
                let mut tx = self.pool.begin().await.map_err(db_err)?;
                let steps: [&str; 5] = [
                    "SELECT value FROM counters WHERE name = 'job_change_seq' FOR UPDATE",
                    "UPDATE counters SET value = value WHERE name = 'job_change_seq'",
                    "INSERT INTO job_deletions (uid, change_seq) VALUES ('gnomon-probe', 0)",
                    "DELETE FROM job_deletions WHERE uid = 'gnomon-probe'",
                    "SELECT id FROM runs WHERE id = 'gnomon-probe' FOR UPDATE",
                ];
                for step in steps {
                    if let Err(e) = sqlx::query(&D.q(step)).execute(&mut *tx).await {
                        return Err(StoreError::Backend(format!("the {} user cannot run `{step}` (missing privilege?): {e}", D.name)));
                    }
                }
                tx.rollback().await.map_err(db_err)
            }

            /// Begins a write transaction on the store's writer connection
            /// (see `writer_conn`).
            async fn begin_write<'c>(conn: &'c mut <$db as sqlx::Database>::Connection) -> Result<Tx<'c>, StoreError> {
                match D.begin {
                    Some(begin) => sqlx::Connection::begin_with(conn, begin).await.map_err(db_err),
                    None => sqlx::Connection::begin(conn).await.map_err(db_err),
                }
            }

            /// The fencing check: locks the scope's leadership row until the
            /// caller's transaction ends.
            async fn check_fence(tx: &mut Tx<'_>, fence: &Fence) -> Result<(), StoreError> {
                let current: Option<i64> = sqlx::query_scalar(&D.q("SELECT token FROM leadership WHERE scope = ? FOR UPDATE"))
                    .bind(&fence.scope)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_err)?;
                Self::fence_holds(fence, current)
            }

            /// Whether the scope's recorded token (`current`, as read) is the
            /// fence's; counts and reports the rejection when not.
            fn fence_holds(fence: &Fence, current: Option<i64>) -> Result<(), StoreError> {
                let current = current.map(to_u64).unwrap_or(0);
                if current != fence.token {
                    crate::count_fencing_rejection();
                    return Err(StoreError::Fenced { scope: fence.scope.clone(), token: fence.token, current });
                }
                Ok(())
            }

            async fn bump_change_seq(tx: &mut Tx<'_>) -> Result<i64, StoreError> {
                sqlx::query("UPDATE counters SET value = value + 1 WHERE name = 'job_change_seq'")
                    .execute(&mut **tx)
                    .await
                    .map_err(db_err)?;
                sqlx::query_scalar("SELECT value FROM counters WHERE name = 'job_change_seq'").fetch_one(&mut **tx).await.map_err(db_err)
            }

            async fn job_by_name(tx: &mut Tx<'_>, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
                sqlx::query(&D.q("SELECT * FROM jobs WHERE namespace = ? AND name = ? FOR UPDATE"))
                    .bind(namespace)
                    .bind(name)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_err)?
                    .map(|r| job_from_row(&r))
                    .transpose()
            }

            /// Inserts the scope's row of `table` if it is missing.
            async fn ensure_scope_row(tx: &mut Tx<'_>, table: &str, scope: &str) -> Result<(), StoreError> {
                let sql = match table {
                    "epochs" => format!("INSERT INTO epochs (scope, epoch) VALUES (?, 0){}", D.ignore("scope")),
                    _ => format!(
                        "INSERT INTO leadership (scope, token, holder, address, backend, since) VALUES (?, 0, '', '', '', 0){}",
                        D.ignore("scope")
                    ),
                };
                sqlx::query(&D.q(&sql)).bind(scope).execute(&mut **tx).await.map_err(db_err)?;
                Ok(())
            }

            async fn apply_attempt_changes(tx: &mut Tx<'_>, changes: &[(&str, &AttemptChange, Millis)]) -> Result<(), StoreError> {
                let assigns: Vec<_> = changes.iter().filter(|(_, c, _)| matches!(c, AttemptChange::Assign { .. })).collect();
                for chunk in assigns.chunks(CHUNK) {
                    let mut qb: QueryBuilder<$db> =
                        QueryBuilder::new("INSERT INTO attempts (run_id, attempt, worker, token, state, assigned_at, output) ");
                    qb.push_values(chunk, |mut b, (run_id, change, at)| {
                        if let AttemptChange::Assign { attempt, worker, token } = change {
                            b.push_bind(run_id.to_string())
                                .push_bind(i64::from(*attempt))
                                .push_bind(worker.clone())
                                .push_bind(to_i64(*token))
                                .push_bind("assigned")
                                .push_bind(*at)
                                .push_bind("");
                        }
                    });
                    qb.build().persistent(false).execute(&mut **tx).await.map_err(db_err)?;
                }
                let starts: Vec<_> = changes.iter().filter(|(_, c, _)| matches!(c, AttemptChange::Start { .. })).collect();
                let ends: Vec<_> = changes.iter().filter(|(_, c, _)| matches!(c, AttemptChange::End { .. })).collect();
                for chunk in starts.chunks(D.case_chunk) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("UPDATE attempts SET state = 'running', started_at = CASE");
                    for (run_id, change, at) in chunk {
                        if let AttemptChange::Start { attempt } = change {
                            qb.push(" WHEN run_id = ").push_bind(run_id.to_string());
                            qb.push(" AND attempt = ").push_bind(i64::from(*attempt));
                            qb.push(" THEN ").push_bind(*at);
                        }
                    }
                    qb.push(" ELSE started_at END WHERE state = 'assigned' AND ");
                    push_attempt_keys(&mut qb, chunk.iter().map(|(r, c, _)| attempt_key(r, c)).collect());
                    qb.build().persistent(false).execute(&mut **tx).await.map_err(db_err)?;
                }
                for chunk in ends.chunks(END_CHUNK.min(D.case_chunk)) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("UPDATE attempts SET ");
                    // One CASE per column, keyed by (run_id, attempt).
                    for (i, column) in ["state", "ended_at", "started_at", "exit_code", "output"].iter().enumerate() {
                        if i > 0 {
                            qb.push(", ");
                        }
                        qb.push(*column).push(" = CASE");
                        for (run_id, change, at) in chunk.iter() {
                            if let AttemptChange::End { attempt, state, exit_code, output, started_at } = change {
                                qb.push(" WHEN run_id = ").push_bind(run_id.to_string());
                                qb.push(" AND attempt = ").push_bind(i64::from(*attempt));
                                qb.push(" THEN ");
                                match *column {
                                    "state" => qb.push_bind(state.as_str()),
                                    "ended_at" => qb.push_bind(*at),
                                    "started_at" => {
                                        qb.push("COALESCE(started_at, ").push_bind(*started_at).push(", ").push_bind(*at).push(")")
                                    }
                                    "exit_code" => qb.push_bind(exit_code.map(i64::from)),
                                    _ => qb.push_bind(output.clone()),
                                };
                            }
                        }
                        qb.push(" ELSE ").push(*column).push(" END");
                    }
                    qb.push(" WHERE state IN ('assigned', 'running') AND ");
                    push_attempt_keys(&mut qb, chunk.iter().map(|(r, c, _)| attempt_key(r, c)).collect());
                    qb.build().persistent(false).execute(&mut **tx).await.map_err(db_err)?;
                }
                Ok(())
            }
        }

        fn attempt_key(run_id: &str, change: &AttemptChange) -> (String, i64) {
            let attempt = match change {
                AttemptChange::Assign { attempt, .. } | AttemptChange::Start { attempt } | AttemptChange::End { attempt, .. } => *attempt,
            };
            (run_id.to_string(), i64::from(attempt))
        }

        /// Pushes `run_id IN (…) AND (run_id, attempt) IN ((k1, a1), …)`; the
        /// plain list lets every planner use the primary key.
        fn push_attempt_keys(qb: &mut QueryBuilder<'_, $db>, keys: Vec<(String, i64)>) {
            qb.push("run_id IN (");
            let mut sep = qb.separated(", ");
            for (run_id, _) in &keys {
                sep.push_bind(run_id.clone());
            }
            qb.push(") AND (run_id, attempt) IN (");
            let mut first = true;
            for (run_id, attempt) in keys {
                if !first {
                    qb.push(", ");
                }
                first = false;
                qb.push("(").push_bind(run_id).push(", ").push_bind(attempt).push(")");
            }
            qb.push(")");
        }

        fn chrono_now_ms() -> i64 {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
        }
        $crate::sql::writes::sql_writes!($store, $db);
        $crate::sql::api::sql_api!($store, $db, $row);
        $crate::sql::api_runs::sql_api_runs!($store, $db, $row);
    };
}

pub(crate) use sql_store;
