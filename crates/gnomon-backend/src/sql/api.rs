//! The job, leadership and leader-write roles of the [`super::store::sql_store!`]
//! instantiation, as a macro expanded inside it (the other roles are in
//! [`super::api_runs`]).

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
    };
}

pub(crate) use sql_api;
