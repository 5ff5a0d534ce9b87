//! The leader's fenced writes (fire, transitions, attempt rows) of the
//! [`super::store::sql_store!`] instantiation, as a macro expanded inside it.

/// Expanded by `sql_store!` in the same module: it relies on its imports and
/// helpers (`Tx`, `D`, the row decoders).
macro_rules! sql_writes {
    ($store:ident, $db:ty) => {
        impl $store {
            async fn fire_tx(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::check_fence(&mut tx, fence).await?;
                let (outcomes, _) = Self::fire_in(&mut tx, runs, advances, &[]).await?;
                tx.commit().await.map_err(db_err)?;
                Ok(outcomes)
            }

            /// One fenced transaction: the fire, then the transitions (which
            /// may move the runs it just created).
            async fn fire_and_transition_tx(
                &self,
                fence: &Fence,
                runs: &[NewRun],
                advances: &[JobAdvance],
                transitions: &[Transition],
            ) -> Result<(Vec<FireOutcome>, Vec<bool>), StoreError> {
                Transition::check_lifecycle(transitions)?;
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::check_fence(&mut tx, fence).await?;
                let (outcomes, folded) = Self::fire_in(&mut tx, runs, advances, transitions).await?;
                if !folded.iter().any(|f| *f) {
                    let applied = Self::transition_in(&mut tx, transitions).await?;
                    tx.commit().await.map_err(db_err)?;
                    return Ok((outcomes, applied));
                }
                // The folded transitions moved their runs as they were
                // inserted; their attempt changes follow, then the rest.
                let attempts: Vec<(&str, &AttemptChange, Millis)> = transitions
                    .iter()
                    .zip(&folded)
                    .filter(|(_, f)| **f)
                    .filter_map(|(t, _)| t.attempt.as_ref().map(|c| (t.run_id.as_str(), c, t.at)))
                    .collect();
                Self::apply_attempt_changes(&mut tx, &attempts).await?;
                let notes: Vec<&NewNotification> =
                    transitions.iter().zip(&folded).filter(|(_, f)| **f).flat_map(|(t, _)| t.notify.iter()).collect();
                Self::insert_notifications(&mut tx, &notes).await?;
                let rest: Vec<Transition> = transitions.iter().zip(&folded).filter(|(_, f)| !**f).map(|(t, _)| t.clone()).collect();
                let mut rest_applied = Self::transition_in(&mut tx, &rest).await?.into_iter();
                let applied = folded.iter().map(|f| *f || rest_applied.next().unwrap_or(false)).collect();
                tx.commit().await.map_err(db_err)?;
                Ok((outcomes, applied))
            }

            /// Inserts the runs that do not exist yet. A transition of the same
            /// write that moves a run inserted here, from the state it is
            /// inserted in, and is the only one for that run, is folded into
            /// the insert (the row is written once, in its final state): the
            /// CAS holds by construction, since no one else can see the row
            /// before the commit. Returns the fire outcomes and, per
            /// transition, whether it was folded (its attempt change is the
            /// caller's to apply).
            async fn fire_in(
                tx: &mut Tx<'_>,
                runs: &[NewRun],
                advances: &[JobAdvance],
                transitions: &[Transition],
            ) -> Result<(Vec<FireOutcome>, Vec<bool>), StoreError> {
                let tx = &mut **tx;
                let ids: Vec<String> = runs.iter().map(|r| r.id()).collect();
                // Leader writes of the scope are serialised by the fence lock,
                // so this existence check is exact.
                let mut existing: HashSet<String> = HashSet::new();
                for chunk in ids.chunks(CHUNK) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("SELECT id FROM runs WHERE id IN (");
                    let mut sep = qb.separated(", ");
                    for id in chunk {
                        sep.push_bind(id.clone());
                    }
                    qb.push(")").push(D.for_update);
                    for r in qb.build().persistent(false).fetch_all(&mut *tx).await.map_err(db_err)? {
                        existing.insert(text(&r, "id")?);
                    }
                }
                let mut created: HashSet<String> = HashSet::new();
                let fresh: Vec<(&NewRun, &String)> =
                    runs.iter().zip(&ids).filter(|(_, id)| !existing.contains(*id) && created.insert((*id).clone())).collect();
                // Transitions to fold: the only one of its run, looked up for fresh runs.
                let fold = crate::sql::fold_candidates(transitions);
                let mut folded = vec![false; transitions.len()];
                let fresh: Vec<(&NewRun, &String, RunRow)> = fresh
                    .into_iter()
                    .map(|(r, id)| {
                        let mut row = RunRow::inserted(r);
                        // Checked against the row as inserted; a move that
                        // does not apply is left to fail as a CAS.
                        if let Some(i) = fold.get(id.as_str()) {
                            folded[*i] = transitions[*i].apply_to(crate::model::run_cas!(row));
                        }
                        (r, id, row)
                    })
                    .collect();
                for chunk in fresh.chunks(CHUNK) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new(
                        "INSERT INTO runs (id, job_uid, namespace, job, scheduled_at, fired_at, state, attempt, reason, next_attempt_at, manual, cancel_requested, updated_at) ",
                    );
                    qb.push_values(chunk, |mut b, (r, id, row)| {
                        b.push_bind((*id).clone())
                            .push_bind(r.job_uid.clone())
                            .push_bind(r.namespace.clone())
                            .push_bind(r.job.clone())
                            .push_bind(r.scheduled_at)
                            .push_bind(r.fired_at)
                            .push_bind(row.state.as_str())
                            .push_bind(i64::from(row.attempt))
                            .push_bind(row.reason.clone())
                            .push_bind(row.next_attempt_at)
                            .push_bind(i64::from(r.manual))
                            .push_bind(0i64)
                            .push_bind(row.updated_at);
                    });
                    qb.push(D.ignore("id"));
                    let n = qb.build().persistent(false).execute(&mut *tx).await.map_err(db_err)?.rows_affected();
                    if n != chunk.len() as u64 {
                        return Err(StoreError::Backend(format!("fire inserted {n} of {} new runs; rolled back", chunk.len())));
                    }
                }
                // One multi-row UPDATE per chunk of advances.
                let latest = crate::sql::latest_advances(advances);
                for chunk in latest.chunks(D.case_chunk) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("UPDATE jobs SET last_scheduled_at = CASE");
                    for (uid, at) in chunk {
                        qb.push(" WHEN uid = ").push_bind(uid.to_string()).push(" THEN ").push(D.greatest).push("(COALESCE(last_scheduled_at, ");
                        qb.push_bind(*at).push("), ").push_bind(*at).push(")");
                    }
                    qb.push(" ELSE last_scheduled_at END WHERE uid IN (");
                    let mut sep = qb.separated(", ");
                    for (uid, _) in chunk {
                        sep.push_bind(uid.to_string());
                    }
                    qb.push(")");
                    qb.build().persistent(false).execute(&mut *tx).await.map_err(db_err)?;
                }
                Ok((ids.iter().map(|id| if created.contains(id) { FireOutcome::Created } else { FireOutcome::Existed }).collect(), folded))
            }

            async fn transition_tx(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
                Transition::check_lifecycle(transitions)?;
                let mut w = self.writer_conn().await?;
                let mut tx = Self::begin_write(&mut w).await?;
                Self::check_fence(&mut tx, fence).await?;
                let applied = Self::transition_in(&mut tx, transitions).await?;
                tx.commit().await.map_err(db_err)?;
                Ok(applied)
            }

            async fn transition_in(tx: &mut Tx<'_>, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
                if transitions.is_empty() {
                    return Ok(Vec::new());
                }
                let mut ids: Vec<&str> = transitions.iter().map(|t| t.run_id.as_str()).collect();
                ids.sort_unstable();
                ids.dedup();
                let mut locked: HashMap<String, RunRow> = HashMap::new();
                for chunk in ids.chunks(CHUNK) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new(
                        "SELECT id, state, attempt, reason, next_attempt_at, updated_at, cancel_requested FROM runs WHERE id IN (",
                    );
                    let mut sep = qb.separated(", ");
                    for id in chunk {
                        sep.push_bind(id.to_string());
                    }
                    qb.push(") ORDER BY id").push(D.for_update);
                    for r in qb.build().persistent(false).fetch_all(&mut **tx).await.map_err(db_err)? {
                        let state = text(&r, "state")?;
                        locked.insert(
                            text(&r, "id")?,
                            RunRow {
                                state: RunState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("run state {state:?}")))?,
                                attempt: u32::try_from(r.try_get::<i64, _>("attempt").map_err(db_err)?).unwrap_or(0),
                                reason: opt_text(&r, "reason")?,
                                next_attempt_at: r.try_get("next_attempt_at").map_err(db_err)?,
                                updated_at: r.try_get("updated_at").map_err(db_err)?,
                                cancel_requested: r.try_get::<i64, _>("cancel_requested").map_err(db_err)? != 0,
                            },
                        );
                    }
                }
                let plan = plan_transitions(locked, transitions);
                for chunk in plan.finals.chunks(D.case_chunk) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new("UPDATE runs SET ");
                    for (i, column) in ["state", "attempt", "reason", "next_attempt_at", "updated_at", "cancel_requested"].iter().enumerate() {
                        if i > 0 {
                            qb.push(", ");
                        }
                        qb.push(*column).push(" = CASE id");
                        for (id, _, _, row) in chunk {
                            qb.push(" WHEN ").push_bind(id.clone()).push(" THEN ");
                            match *column {
                                "state" => qb.push_bind(row.state.as_str()),
                                "attempt" => qb.push_bind(i64::from(row.attempt)),
                                "reason" => qb.push_bind(row.reason.clone()),
                                "next_attempt_at" => qb.push_bind(row.next_attempt_at),
                                "updated_at" => qb.push_bind(row.updated_at),
                                _ => qb.push_bind(i64::from(row.cancel_requested)),
                            };
                        }
                        qb.push(" ELSE ").push(*column).push(" END");
                    }
                    // The CAS: each row must still be in the state it was locked
                    // in. The plain `id IN` list lets every planner use the index.
                    qb.push(" WHERE id IN (");
                    let mut sep = qb.separated(", ");
                    for (id, _, _, _) in chunk {
                        sep.push_bind(id.clone());
                    }
                    qb.push(") AND (id, state, attempt) IN (");
                    let mut first = true;
                    for (id, state, attempt, _) in chunk {
                        if !first {
                            qb.push(", ");
                        }
                        first = false;
                        qb.push("(").push_bind(id.clone()).push(", ").push_bind(state.as_str()).push(", ").push_bind(i64::from(*attempt)).push(")");
                    }
                    qb.push(")");
                    let n = qb.build().persistent(false).execute(&mut **tx).await.map_err(db_err)?.rows_affected();
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

            /// The notifications of applied transitions, insert-or-ignore.
            async fn insert_notifications(tx: &mut Tx<'_>, notes: &[&NewNotification]) -> Result<(), StoreError> {
                for chunk in notes.chunks(CHUNK / 8) {
                    let mut qb: QueryBuilder<$db> = QueryBuilder::new(
                        "INSERT INTO notifications (id, run_id, namespace, job, outcome, target, state, attempts, next_at, created_at, updated_at) ",
                    );
                    qb.push_values(chunk, |mut b, n| {
                        b.push_bind(n.id.clone())
                            .push_bind(n.run_id.clone())
                            .push_bind(n.namespace.clone())
                            .push_bind(n.job.clone())
                            .push_bind(n.outcome.clone())
                            .push_bind(n.target.clone())
                            .push_bind("pending")
                            .push_bind(0i64)
                            .push_bind(n.created_at)
                            .push_bind(n.created_at)
                            .push_bind(n.created_at);
                    });
                    qb.push(D.ignore("id"));
                    qb.build().persistent(false).execute(&mut **tx).await.map_err(db_err)?;
                }
                Ok(())
            }

        }
    };
}

pub(crate) use sql_writes;
