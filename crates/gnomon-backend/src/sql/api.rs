//! The `Store` trait methods of the [`super::store::sql_store!`]
//! instantiation, as a macro expanded inside it.

/// Expanded by `sql_store!` in the same module: it relies on its imports,
/// helpers and the leader writes of [`super::writes`].
macro_rules! sql_api {
    ($store:ident, $db:ty, $row:ty) => {
        #[async_trait]
        impl JobStore for $store {
            async fn put_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError> {
                let ns = spec.namespace().to_string();
                let spec_text = serde_json::to_string(spec).map_err(|e| StoreError::Backend(e.to_string()))?;
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                let seq = Self::bump_change_seq(&mut tx).await?;
                let existing = Self::job_by_name(&mut tx, &ns, &spec.name).await?;
                let what = format!("job {ns}/{}", spec.name);
                match (&existing, precondition) {
                    (Some(_), Precondition::DoesNotExist) => return Err(StoreError::AlreadyExists(what)),
                    (None, Precondition::MatchesVersion(_)) => return Err(StoreError::NotFound(what)),
                    (Some(j), Precondition::MatchesVersion(v)) if j.version != v => {
                        return Err(StoreError::VersionConflict { what, expected: v, actual: j.version })
                    }
                    _ => {}
                }
                match existing {
                    Some(j) if j.spec.schedule != spec.schedule => {
                        let previous = serde_json::to_string(&j.spec.schedule).map_err(|e| StoreError::Backend(e.to_string()))?;
                        sqlx::query(&D.q(
                            "UPDATE jobs SET spec = ?, version = version + 1, updated_at = ?, change_seq = ?, \
                             schedule_changed_at = ?, previous_schedule = ? WHERE uid = ?",
                        ))
                        .bind(&spec_text)
                        .bind(now)
                        .bind(seq)
                        .bind(now)
                        .bind(previous)
                        .bind(&j.uid)
                        .execute(&mut *tx)
                        .await
                        .map_err(db_err)?;
                    }
                    Some(j) => {
                        sqlx::query(&D.q("UPDATE jobs SET spec = ?, version = version + 1, updated_at = ?, change_seq = ? WHERE uid = ?"))
                            .bind(&spec_text)
                            .bind(now)
                            .bind(seq)
                            .bind(&j.uid)
                            .execute(&mut *tx)
                            .await
                            .map_err(db_err)?;
                    }
                    None => {
                        let inserted = sqlx::query(&D.q(
                            "INSERT INTO jobs (uid, namespace, name, spec, version, paused, created_at, updated_at, last_scheduled_at, change_seq) VALUES (?, ?, ?, ?, 1, 0, ?, ?, NULL, ?)",
                        ))
                        .bind(new_uid())
                        .bind(&ns)
                        .bind(&spec.name)
                        .bind(&spec_text)
                        .bind(now)
                        .bind(now)
                        .bind(seq)
                        .execute(&mut *tx)
                        .await;
                        match inserted {
                            Err(e) if is_unique_violation(&e) => return Err(StoreError::AlreadyExists(what)),
                            other => {
                                other.map_err(db_err)?;
                            }
                        }
                    }
                }
                let record =
                    Self::job_by_name(&mut tx, &ns, &spec.name).await?.ok_or_else(|| StoreError::Backend("job vanished".into()))?;
                tx.commit().await.map_err(db_err)?;
                Ok(record)
            }

            async fn set_job_paused(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                let seq = Self::bump_change_seq(&mut tx).await?;
                // The pause or resume time is recorded only when `paused`
                // changes (assigned before `paused`: MySQL evaluates an
                // UPDATE's assignments left to right).
                let sql = if paused {
                    "UPDATE jobs SET paused_at = CASE WHEN paused = 0 THEN ? ELSE paused_at END, paused = 1, \
                     version = version + 1, updated_at = ?, change_seq = ? WHERE namespace = ? AND name = ?"
                } else {
                    "UPDATE jobs SET resumed_at = CASE WHEN paused = 1 THEN ? ELSE resumed_at END, paused = 0, \
                     version = version + 1, updated_at = ?, change_seq = ? WHERE namespace = ? AND name = ?"
                };
                let changed = sqlx::query(&D.q(sql))
                .bind(now)
                .bind(now)
                .bind(seq)
                .bind(namespace)
                .bind(name)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?
                .rows_affected();
                if changed == 0 {
                    return Err(StoreError::NotFound(format!("job {namespace}/{name}")));
                }
                let record =
                    Self::job_by_name(&mut tx, namespace, name).await?.ok_or_else(|| StoreError::Backend("job vanished".into()))?;
                tx.commit().await.map_err(db_err)?;
                Ok(record)
            }

            async fn delete_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                let seq = Self::bump_change_seq(&mut tx).await?;
                let what = format!("job {namespace}/{name}");
                let job = match (Self::job_by_name(&mut tx, namespace, name).await?, precondition) {
                    (None, _) => return Err(StoreError::NotFound(what)),
                    (Some(j), Precondition::MatchesVersion(v)) if j.version != v => {
                        return Err(StoreError::VersionConflict { what, expected: v, actual: j.version })
                    }
                    (Some(_), Precondition::DoesNotExist) => return Err(StoreError::AlreadyExists(what)),
                    (Some(j), _) => j,
                };
                sqlx::query(&D.q("DELETE FROM jobs WHERE uid = ?")).bind(&job.uid).execute(&mut *tx).await.map_err(db_err)?;
                sqlx::query(&D.q("DELETE FROM job_deletions WHERE uid = ?")).bind(&job.uid).execute(&mut *tx).await.map_err(db_err)?;
                sqlx::query(&D.q("INSERT INTO job_deletions (uid, change_seq) VALUES (?, ?)"))
                    .bind(&job.uid)
                    .bind(seq)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
                tx.commit().await.map_err(db_err)
            }

            async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
                sqlx::query(&D.q("SELECT * FROM jobs WHERE namespace = ? AND name = ?"))
                    .bind(namespace)
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db_err)?
                    .map(|r| job_from_row(&r))
                    .transpose()
            }

            async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>, StoreError> {
                let rows = match namespace {
                    Some(ns) => {
                        sqlx::query(&D.q("SELECT * FROM jobs WHERE namespace = ? ORDER BY namespace, name")).bind(ns).fetch_all(&self.pool).await
                    }
                    None => sqlx::query("SELECT * FROM jobs ORDER BY namespace, name").fetch_all(&self.pool).await,
                }
                .map_err(db_err)?;
                rows.iter().map(job_from_row).collect()
            }

            async fn job_changes(&self, since: u64) -> Result<JobChanges, StoreError> {
                // The counter is read first: every row whose change_seq is at
                // most that value has committed (writers hold the counter row
                // until they commit), so nothing up to `seq` can appear later.
                let mut tx = self.pool.begin().await.map_err(db_err)?;
                let seq: i64 = sqlx::query_scalar("SELECT value FROM counters WHERE name = 'job_change_seq'")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_err)?;
                let rows = sqlx::query(&D.q("SELECT * FROM jobs WHERE change_seq > ? AND change_seq <= ? ORDER BY change_seq"))
                    .bind(to_i64(since))
                    .bind(seq)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(db_err)?;
                let deleted = sqlx::query(&D.q("SELECT uid FROM job_deletions WHERE change_seq > ? AND change_seq <= ? ORDER BY change_seq"))
                    .bind(to_i64(since))
                    .bind(seq)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(db_err)?
                    .iter()
                    .map(|r| text(r, "uid"))
                    .collect::<Result<Vec<String>, _>>()?;
                tx.commit().await.map_err(db_err)?;
                Ok(JobChanges { upserted: rows.iter().map(job_from_row).collect::<Result<_, _>>()?, deleted, seq: to_u64(seq) })
            }

            async fn job_heads(&self) -> Result<JobHeads, StoreError> {
                // As in `job_changes`: the counter first, then the rows.
                let mut tx = self.pool.begin().await.map_err(db_err)?;
                let seq: i64 = sqlx::query_scalar("SELECT value FROM counters WHERE name = 'job_change_seq'")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_err)?;
                if let Some(sql) = D.heads_json {
                    // One row holding them all: far cheaper for drivers
                    // that pay per row (SQLite's).
                    let all: Option<String> = sqlx::query_scalar(sql).fetch_one(&mut *tx).await.map_err(db_err)?;
                    tx.commit().await.map_err(db_err)?;
                    let rows: Vec<(String, u64, Option<Millis>)> = match all {
                        Some(all) => serde_json::from_str(&all).map_err(|e| StoreError::Corrupt(format!("job heads: {e}")))?,
                        None => Vec::new(),
                    };
                    let heads = rows.into_iter().map(|(uid, version, last_scheduled_at)| JobHead { uid, version, last_scheduled_at }).collect();
                    return Ok(JobHeads { heads, seq: to_u64(seq) });
                }
                let rows = sqlx::query("SELECT uid, version, last_scheduled_at FROM jobs").fetch_all(&mut *tx).await.map_err(db_err)?;
                tx.commit().await.map_err(db_err)?;
                let heads = rows
                    .iter()
                    .map(|r| {
                        Ok(JobHead {
                            uid: text(r, "uid")?,
                            version: to_u64(r.try_get("version").map_err(db_err)?),
                            last_scheduled_at: r.try_get("last_scheduled_at").map_err(db_err)?,
                        })
                    })
                    .collect::<Result<_, StoreError>>()?;
                Ok(JobHeads { heads, seq: to_u64(seq) })
            }

            async fn jobs_by_uid(&self, uids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
                let mut out = Vec::with_capacity(uids.len());
                for chunk in uids.chunks(CHUNK) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("SELECT * FROM jobs WHERE uid IN (");
                    let mut sep = qb.separated(", ");
                    for uid in chunk {
                        sep.push_bind(uid.as_str());
                    }
                    qb.push(")");
                    for r in qb.build().persistent(false).fetch_all(&self.pool).await.map_err(db_err)? {
                        out.push(job_from_row(&r)?);
                    }
                }
                Ok(out)
            }
        }

        #[async_trait]
        impl LeadershipStore for $store {
            async fn next_epoch(&self, scope: &str) -> Result<u64, StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::ensure_scope_row(&mut tx, "epochs", scope).await?;
                let epoch: i64 = sqlx::query_scalar(&D.q("SELECT epoch FROM epochs WHERE scope = ? FOR UPDATE"))
                    .bind(scope)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_err)?;
                // Never below the fenced token, so a new term outranks every earlier one.
                let token: Option<i64> = sqlx::query_scalar(&D.q("SELECT token FROM leadership WHERE scope = ?"))
                    .bind(scope)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_err)?;
                let next = epoch.max(token.unwrap_or(0)) + 1;
                sqlx::query(&D.q("UPDATE epochs SET epoch = ? WHERE scope = ?")).bind(next).bind(scope).execute(&mut *tx).await.map_err(db_err)?;
                tx.commit().await.map_err(db_err)?;
                Ok(to_u64(next))
            }

            async fn fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::ensure_scope_row(&mut tx, "leadership", &fence.scope).await?;
                let current: i64 = sqlx::query_scalar(&D.q("SELECT token FROM leadership WHERE scope = ? FOR UPDATE"))
                    .bind(&fence.scope)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_err)?;
                let current = to_u64(current);
                if fence.token <= current {
                    return Err(StoreError::StaleToken { scope: fence.scope.clone(), token: fence.token, current });
                }
                sqlx::query(&D.q("UPDATE leadership SET token = ?, holder = ?, address = ?, backend = ?, since = ? WHERE scope = ?"))
                    .bind(to_i64(fence.token))
                    .bind(&holder.holder)
                    .bind(&holder.address)
                    .bind(&holder.backend)
                    .bind(now)
                    .bind(&fence.scope)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
                tx.commit().await.map_err(db_err)
            }

            async fn leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError> {
                let row = sqlx::query(&D.q("SELECT * FROM leadership WHERE scope = ? AND token > 0"))
                    .bind(scope)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db_err)?;
                row.map(|r| {
                    Ok(LeadershipRecord {
                        scope: text(&r, "scope")?,
                        token: to_u64(r.try_get("token").map_err(db_err)?),
                        holder: text(&r, "holder")?,
                        address: text(&r, "address")?,
                        backend: text(&r, "backend")?,
                        since: r.try_get("since").map_err(db_err)?,
                        leader_time: r.try_get("leader_time").map_err(db_err)?,
                    })
                })
                .transpose()
            }

            async fn advance_leader_time(&self, fence: &Fence, at: Millis) -> Result<Millis, StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::check_fence(&mut tx, fence).await?;
                sqlx::query(&D.q(&format!("UPDATE leadership SET leader_time = {}(leader_time, ?) WHERE scope = ?", D.greatest)))
                    .bind(at)
                    .bind(&fence.scope)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
                let committed: i64 = sqlx::query_scalar(&D.q("SELECT leader_time FROM leadership WHERE scope = ?"))
                    .bind(&fence.scope)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_err)?;
                tx.commit().await.map_err(db_err)?;
                Ok(committed)
            }
        }

        #[async_trait]
        impl LeaderWrites for $store {
            async fn fire(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
                if let Some(r) = self.native_turn_write(fence, runs, advances, &[]).await {
                    return r.map(|(fired, _)| fired);
                }
                // Never repeated here on a lost connection: it may have been
                // lost during the commit, so the outcome is unknown, and only
                // the caller (the leader, by reloading from the store) can
                // tell what landed.
                self.fire_tx(fence, runs, advances).await
            }

            async fn transition(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
                if let Some(r) = self.native_turn_write(fence, &[], &[], transitions).await {
                    return r.map(|(_, applied)| applied);
                }
                self.transition_tx(fence, transitions).await
            }

            async fn fire_and_transition(
                &self,
                fence: &Fence,
                runs: &[NewRun],
                advances: &[JobAdvance],
                transitions: &[Transition],
            ) -> Result<TurnWrite, StoreError> {
                if let Some(r) = self.native_turn_write(fence, runs, advances, transitions).await {
                    let (fired, applied) = r?;
                    return Ok(TurnWrite { fired, applied: Ok(applied) });
                }
                let (fired, applied) = self.fire_and_transition_tx(fence, runs, advances, transitions).await?;
                Ok(TurnWrite { fired, applied: Ok(applied) })
            }
        }

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

pub(crate) use sql_api;
