//! The run, notification, retention and probe roles of the
//! [`super::store::sql_store!`] instantiation, as a macro expanded inside it
//! (the job, leadership and leader-write roles are in [`super::api`]).

/// Expanded by `sql_store!` in the same module: it relies on its imports
/// and helpers.
macro_rules! sql_api_runs {
    ($store:ident, $db:ty, $row:ty) => {
        #[async_trait]
        impl RunStore for $store {
            async fn request_cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                // Not started: cancelled at once. Live: the leader is asked to stop it.
                let attempts = [
                    (
                        "UPDATE runs SET state = 'cancelled', reason = 'cancelled by request', updated_at = ? WHERE id = ? AND state IN ('pending', 'retrying')",
                        CancelOutcome::Cancelled,
                    ),
                    ("UPDATE runs SET cancel_requested = 1, updated_at = ? WHERE id = ? AND state IN ('assigned', 'running')", CancelOutcome::Requested),
                ];
                for (sql, outcome) in attempts {
                    let n = sqlx::query(&D.q(sql)).bind(now).bind(run_id).execute(&mut *tx).await.map_err(db_err)?.rows_affected();
                    if n == 1 {
                        tx.commit().await.map_err(db_err)?;
                        return Ok(outcome);
                    }
                }
                let exists: Option<i64> = sqlx::query_scalar(&D.q("SELECT attempt FROM runs WHERE id = ?"))
                    .bind(run_id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_err)?;
                match exists {
                    None => Err(StoreError::NotFound(format!("run {run_id}"))),
                    Some(_) => Err(StoreError::Terminal(run_id.to_string())),
                }
            }

            async fn get_run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError> {
                let Some(row) =
                    sqlx::query(&D.q("SELECT * FROM runs WHERE id = ?")).bind(run_id).fetch_optional(&self.pool).await.map_err(db_err)?
                else {
                    return Ok(None);
                };
                let run = run_from_row(&row)?;
                let attempts = sqlx::query(&D.q("SELECT * FROM attempts WHERE run_id = ? ORDER BY attempt"))
                    .bind(run_id)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_err)?;
                Ok(Some(RunDetail { run, attempts: attempts.iter().map(attempt_from_row).collect::<Result<_, _>>()? }))
            }

            async fn list_runs(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError> {
                let limit = limit.clamp(1, 1000);
                let mut qb: QueryBuilder<$db> = QueryBuilder::new("SELECT * FROM runs WHERE 1 = 1");
                if let Some(ns) = &filter.namespace {
                    qb.push(" AND namespace = ").push_bind(ns.clone());
                }
                if let Some(job) = &filter.job {
                    qb.push(" AND job = ").push_bind(job.clone());
                }
                if let Some(state) = filter.state {
                    qb.push(" AND state = ").push_bind(state.as_str());
                }
                if let Some(c) = cursor {
                    qb.push(" AND seq < ").push_bind(c);
                }
                qb.push(" ORDER BY seq DESC LIMIT ").push_bind(i64::from(limit) + 1);
                let rows = qb.build().persistent(false).fetch_all(&self.pool).await.map_err(db_err)?;
                let mut runs: Vec<RunRecord> = rows.iter().map(run_from_row).collect::<Result<_, _>>()?;
                let next_cursor = if runs.len() > limit as usize {
                    runs.truncate(limit as usize);
                    runs.last().map(|r| r.seq)
                } else {
                    None
                };
                Ok(RunPage { runs, next_cursor })
            }

            async fn open_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
                let rows = sqlx::query("SELECT * FROM runs WHERE state IN ('pending', 'assigned', 'running', 'retrying') ORDER BY seq")
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_err)?;
                rows.iter().map(run_from_row).collect()
            }

            async fn live_attempts(&self) -> Result<Vec<LiveAttempt>, StoreError> {
                let rows = sqlx::query(
                    "SELECT r.id AS run_id, a.attempt AS attempt, a.worker AS worker FROM runs r \
                     JOIN attempts a ON a.run_id = r.id AND a.attempt = r.attempt \
                     WHERE r.state IN ('assigned', 'running')",
                )
                .fetch_all(&self.pool)
                .await
                .map_err(db_err)?;
                rows.iter()
                    .map(|r| {
                        Ok(LiveAttempt {
                            run_id: text(r, "run_id")?,
                            attempt: u32::try_from(r.try_get::<i64, _>("attempt").map_err(db_err)?).unwrap_or(0),
                            worker: text(r, "worker")?,
                        })
                    })
                    .collect()
            }

            async fn cancel_requests(&self) -> Result<Vec<RunRecord>, StoreError> {
                let rows = sqlx::query("SELECT * FROM runs WHERE state IN ('assigned', 'running') AND cancel_requested = 1")
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_err)?;
                rows.iter().map(run_from_row).collect()
            }
        }

        #[async_trait]
        impl NotificationStore for $store {
            async fn due_notifications(&self, now: Millis, limit: u32) -> Result<Vec<Notification>, StoreError> {
                let rows = sqlx::query(&D.q("SELECT * FROM notifications WHERE state = 'pending' AND next_at <= ? ORDER BY next_at LIMIT ?"))
                    .bind(now)
                    .bind(i64::from(limit.clamp(1, 1000)))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_err)?;
                rows.iter().map(notification_from_row).collect()
            }

            async fn settle_notification(&self, fence: &Fence, d: &Delivery) -> Result<bool, StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::check_fence(&mut tx, fence).await?;
                let n = sqlx::query(&D.q(
                    "UPDATE notifications SET state = ?, attempts = ?, next_at = ?, last_error = ?, updated_at = ? \
                     WHERE id = ? AND state = 'pending' AND attempts = ?",
                ))
                .bind(d.state.as_str())
                .bind(i64::from(d.attempts))
                .bind(d.next_at)
                .bind(d.error.clone())
                .bind(d.at)
                .bind(&d.id)
                .bind(i64::from(d.attempts_before))
                .execute(&mut *tx)
                .await
                .map_err(db_err)?
                .rows_affected();
                tx.commit().await.map_err(db_err)?;
                Ok(n == 1)
            }

            async fn run_notifications(&self, run_id: &str) -> Result<Vec<Notification>, StoreError> {
                let rows = sqlx::query(&D.q("SELECT * FROM notifications WHERE run_id = ? ORDER BY id"))
                    .bind(run_id)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_err)?;
                rows.iter().map(notification_from_row).collect()
            }
        }

        #[async_trait]
        impl RetentionStore for $store {
            async fn size_bytes(&self) -> Option<u64> {
                let n: Option<i64> = sqlx::query_scalar(D.size_query).fetch_one(&self.pool).await.ok();
                n.and_then(|n| u64::try_from(n).ok())
            }

            async fn prune(&self, fence: &Fence, keep_per_job: usize, before: Millis, max: usize) -> Result<u64, StoreError> {
                // The runs to delete are chosen by reads that walk indexes,
                // outside the write transaction (a terminal run stays
                // terminal, so the choice cannot go stale); the deletion is
                // one short fenced transaction.
                let terminal: Vec<&str> =
                    gnomon_core::run::ALL_RUN_STATES.iter().filter(|s| s.is_terminal()).map(|s| s.as_str()).collect();
                let mut chosen: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
                let limit = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
                // By age: per terminal state, the oldest runs in insertion
                // order (the `(state, seq)` index). Fire times follow
                // insertion (leader time never runs backwards), so the runs
                // fired before `before` are the head of that order: the walk
                // stops at the first younger one.
                for state in &terminal {
                    if chosen.len() >= max {
                        break;
                    }
                    let rows = sqlx::query(&D.q("SELECT id, fired_at FROM runs WHERE state = ? ORDER BY seq LIMIT ?"))
                        .bind(*state)
                        .bind(limit(max - chosen.len()))
                        .fetch_all(&self.pool)
                        .await
                        .map_err(db_err)?;
                    for r in &rows {
                        let fired: i64 = r.try_get("fired_at").map_err(db_err)?;
                        if fired >= before {
                            break;
                        }
                        chosen.insert(text(r, "id")?);
                    }
                }
                // Beyond the newest `keep_per_job` runs of a job (open ones
                // count; only terminal ones go): the jobs over the count,
                // from an index-only scan of `(namespace, job, seq)`, then
                // per job the seq of its newest run past the count.
                if chosen.len() < max {
                    let over = sqlx::query(&D.q("SELECT namespace, job FROM runs GROUP BY namespace, job HAVING COUNT(*) > ?"))
                        .bind(limit(keep_per_job))
                        .fetch_all(&self.pool)
                        .await
                        .map_err(db_err)?;
                    for r in &over {
                        if chosen.len() >= max {
                            break;
                        }
                        let (ns, job) = (text(r, "namespace")?, text(r, "job")?);
                        let cutoff: Option<i64> = sqlx::query_scalar(&D.q(
                            "SELECT seq FROM runs WHERE namespace = ? AND job = ? ORDER BY seq DESC LIMIT 1 OFFSET ?",
                        ))
                        .bind(&ns)
                        .bind(&job)
                        .bind(limit(keep_per_job))
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(db_err)?;
                        let Some(cutoff) = cutoff else { continue };
                        // The state is filtered here, not in SQL, so the
                        // planner walks this job's index and not the states'.
                        let rows = sqlx::query(&D.q(
                            "SELECT id, state FROM runs WHERE namespace = ? AND job = ? AND seq <= ? ORDER BY seq LIMIT ?",
                        ))
                        .bind(&ns)
                        .bind(&job)
                        .bind(cutoff)
                        .bind(limit(max - chosen.len()))
                        .fetch_all(&self.pool)
                        .await
                        .map_err(db_err)?;
                        for r in &rows {
                            if terminal.contains(&text(r, "state")?.as_str()) {
                                chosen.insert(text(r, "id")?);
                            }
                        }
                    }
                }
                if chosen.is_empty() {
                    // Nothing to delete: still refuse a stale term, without
                    // taking the write lock.
                    let current: Option<i64> = sqlx::query_scalar(&D.q("SELECT token FROM leadership WHERE scope = ?"))
                        .bind(&fence.scope)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(db_err)?;
                    return Self::fence_holds(fence, current).map(|()| 0);
                }
                let ids: Vec<String> = chosen.into_iter().take(max).collect();
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::check_fence(&mut tx, fence).await?;
                let mut deleted = 0u64;
                for chunk in ids.chunks(CHUNK) {
                    for table in ["attempts WHERE run_id", "notifications WHERE run_id", "runs WHERE id"] {
                        let mut qb = sqlx::QueryBuilder::<$db>::new(format!("DELETE FROM {table} IN ("));
                        let mut sep = qb.separated(", ");
                        for id in chunk {
                            sep.push_bind(id.as_str());
                        }
                        qb.push(")");
                        if table.starts_with("runs") {
                            // Never an open run, whatever the choice said
                            // (`NOT IN` the open states, so that planners
                            // look the ids up rather than walk a state).
                            qb.push(" AND state NOT IN (");
                            let mut sep = qb.separated(", ");
                            for state in gnomon_core::run::ALL_RUN_STATES.iter().filter(|s| !s.is_terminal()) {
                                sep.push_bind(state.as_str());
                            }
                            qb.push(")");
                        }
                        let done = qb.build().persistent(false).execute(&mut *tx).await.map_err(db_err)?;
                        if table.starts_with("runs") {
                            deleted += done.rows_affected();
                        }
                    }
                }
                tx.commit().await.map_err(db_err)?;
                Ok(deleted)
            }
        }

        #[async_trait]
        impl StoreProbes for $store {
            fn backend(&self) -> &'static str {
                D.name
            }

            async fn server_clock(&self) -> Result<Option<Millis>, StoreError> {
                let Some(q) = D.clock_query else { return Ok(None) };
                sqlx::query_scalar(q).fetch_one(&self.pool).await.map(Some).map_err(db_err)
            }
        }
    };
}

pub(crate) use sql_api_runs;
