//! [`JobStore`] on SQL: job writes serialise on the `job_change_seq` counter
//! row, which also makes the change feed gap-free.
//!
//! The same lock makes the dependency checks exact: a job write takes the
//! counter row first (`bump_change_seq`), so it holds it before it reads
//! the namespace's jobs and until it commits. Every write that changes a
//! job's edges or removes a job takes it too, so none commits between the
//! read and the write, and each sees every one committed before it:
//! - PostgreSQL (READ COMMITTED): each statement reads the newest committed
//!   rows, and the read comes after the lock was granted;
//! - InnoDB (REPEATABLE READ): the transaction's snapshot is taken at its
//!   first plain read, `change_seq`, after the lock was granted (a plain
//!   `BEGIN` takes none), so the namespace's rows are read without locking
//!   them (a locking read would hold up the leader's advances of them);
//! - SQLite: `BEGIN IMMEDIATE` holds the database's write lock.
//!
//! No gap or predicate lock is needed for a job inserted meanwhile: it
//! cannot be, whatever its namespace. A lock wait that times out or a
//! deadlock is [`StoreError::Unavailable`]: the write is rolled back whole.

use async_trait::async_trait;
use gnomon_core::spec::JobSpec;
use gnomon_core::Millis;

use super::backend::{to_i64, to_u64, Backend, SqlStore};
use super::decode::{job_from_row, EdgesRow, HeadRow};
use super::driver::{Decodes, SqlRow, Tx};
use super::errors::is_unique_violation;
use super::CHUNK;
use crate::graph::{check_delete, check_put, StoredEdges};
use crate::{JobChanges, JobHead, JobHeads, JobRecord, JobStore, Precondition, StoreError};
use gnomon_core::deps::Graph;

fn new_uid() -> String {
    super::CHOSEN_UID.try_with(|u| u.clone()).unwrap_or_else(|_| format!("{:016x}", rand::random::<u64>()))
}

impl<B: Backend> SqlStore<B> {
    /// The job's row as it is now in the transaction; it must exist.
    async fn job_after_write(tx: &mut Tx<'_, B::Db>, namespace: &str, name: &str) -> Result<JobRecord, StoreError> {
        Self::job_by_name(tx, namespace, name).await?.ok_or_else(|| StoreError::Backend("job vanished".into()))
    }

    /// Begins a job write that reads the namespace: the counter row is
    /// taken before anything is read, and its next value returned. On
    /// InnoDB this order is what makes the reads fresh: a plain read before
    /// the lock would fix the snapshot before the writer ahead commits.
    async fn begin_job_write(w: &mut B::Writer) -> Result<(Tx<'_, B::Db>, i64), StoreError> {
        let mut tx = Self::begin_write(w).await?;
        let seq = Self::bump_change_seq(&mut tx).await?;
        Ok((tx, seq))
    }

    /// The namespace's dependency graph (each job's upstreams) as the
    /// transaction sees it; in a transaction of [`Self::begin_job_write`].
    /// Only specs that may have edges (their JSON names `after`) are sent
    /// and parsed: the read holds the job writers' lock.
    async fn namespace_graph(tx: &mut Tx<'_, B::Db>, namespace: &str) -> Result<Graph, StoreError> {
        let q = Self::q("SELECT name, CASE WHEN spec LIKE ? THEN spec END AS edges FROM jobs WHERE namespace = ?");
        let rows = tx.fetch_all(q.bind("%\"after\"%").bind(namespace)).await?;
        let edges = |text: Option<String>| text.map(|t| StoredEdges::parse(t.as_bytes()).map(StoredEdges::upstreams)).transpose();
        rows.iter()
            .map(|r| {
                let row: EdgesRow = r.decode()?;
                Ok((row.name.0, edges(row.edges.map(|t| t.0))?.unwrap_or_default()))
            })
            .collect()
    }

    /// [`JobStore::put_job`]; `checked: false` skips the dependency check
    /// (a replicated entry written before the check existed applies as it
    /// did then).
    pub(crate) async fn write_job(
        &self,
        spec: &JobSpec,
        precondition: Precondition,
        now: Millis,
        checked: bool,
    ) -> Result<JobRecord, StoreError> {
        let ns = spec.namespace().to_string();
        let spec_text = serde_json::to_string(spec).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut w = self.db.writer().await?;
        let (mut tx, seq) = Self::begin_job_write(&mut w).await?;
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
        // A job without edges has nothing to check: it may only drop
        // edges, which neither closes a cycle nor loses an upstream.
        if checked && !spec.after.is_empty() {
            check_put(spec, &Self::namespace_graph(&mut tx, &ns).await?)?;
        }
        let had_edges = existing.as_ref().is_some_and(|j| !j.spec.after.is_empty());
        match existing {
            Some(j) if j.spec.schedule != spec.schedule => {
                let previous = serde_json::to_string(&j.spec.schedule).map_err(|e| StoreError::Backend(e.to_string()))?;
                let q = Self::q(
                    "UPDATE jobs SET spec = ?, version = version + 1, updated_at = ?, change_seq = ?, \
                     schedule_changed_at = ?, previous_schedule = ? WHERE uid = ?",
                );
                tx.execute(q.bind(spec_text).bind(now).bind(seq).bind(now).bind(previous).bind(&j.uid)).await?;
            }
            Some(j) => {
                let q = Self::q("UPDATE jobs SET spec = ?, version = version + 1, updated_at = ?, change_seq = ? WHERE uid = ?");
                tx.execute(q.bind(spec_text).bind(now).bind(seq).bind(&j.uid)).await?;
            }
            None => {
                let q = Self::q(
                    "INSERT INTO jobs (uid, namespace, name, spec, version, paused, created_at, updated_at, last_scheduled_at, change_seq) \
                     VALUES (?, ?, ?, ?, 1, 0, ?, ?, NULL, ?)",
                );
                match tx.try_execute(q.bind(new_uid()).bind(&ns).bind(&spec.name).bind(spec_text).bind(now).bind(now).bind(seq)).await {
                    Err(e) if is_unique_violation(&e) => return Err(StoreError::AlreadyExists(what)),
                    other => {
                        other.map_err(super::db_err)?;
                    }
                }
            }
        }
        if had_edges || !spec.after.is_empty() {
            Self::write_edges(&mut tx, &ns, &spec.name, spec.after.iter().map(|e| e.job.as_str())).await?;
        }
        let record = Self::job_after_write(&mut tx, &ns, &spec.name).await?;
        tx.commit().await?;
        Ok(record)
    }

    /// Replaces the `job_edges` rows of job `name` (as the downstream end)
    /// with one per upstream it names, in the job write's transaction.
    async fn write_edges(tx: &mut Tx<'_, B::Db>, ns: &str, name: &str, upstreams: impl Iterator<Item = &str>) -> Result<(), StoreError> {
        tx.execute(Self::q("DELETE FROM job_edges WHERE namespace = ? AND downstream = ?").bind(ns).bind(name)).await?;
        let mut upstreams: Vec<&str> = upstreams.collect();
        upstreams.sort_unstable();
        upstreams.dedup();
        if upstreams.is_empty() {
            return Ok(());
        }
        let mut q = Self::q("INSERT INTO job_edges (namespace, upstream, downstream) VALUES ");
        for (i, up) in upstreams.iter().enumerate() {
            q = q.push(if i > 0 { ", (?, ?, ?)" } else { "(?, ?, ?)" }).bind(ns).bind(*up).bind(name);
        }
        tx.execute(q).await?;
        Ok(())
    }

    /// [`JobStore::delete_job`]; `checked: false` skips the dependents
    /// check (as [`Self::write_job`]).
    pub(crate) async fn remove_job(
        &self,
        namespace: &str,
        name: &str,
        precondition: Precondition,
        checked: bool,
    ) -> Result<(), StoreError> {
        let mut w = self.db.writer().await?;
        let (mut tx, seq) = Self::begin_job_write(&mut w).await?;
        let what = format!("job {namespace}/{name}");
        let job = match (Self::job_by_name(&mut tx, namespace, name).await?, precondition) {
            (None, _) => return Err(StoreError::NotFound(what)),
            (Some(j), Precondition::MatchesVersion(v)) if j.version != v => {
                return Err(StoreError::VersionConflict { what, expected: v, actual: j.version })
            }
            (Some(_), Precondition::DoesNotExist) => return Err(StoreError::AlreadyExists(what)),
            (Some(j), _) => j,
        };
        if checked {
            check_delete(namespace, name, &Self::namespace_graph(&mut tx, namespace).await?)?;
        }
        tx.execute(Self::q("DELETE FROM jobs WHERE uid = ?").bind(&job.uid)).await?;
        Self::write_edges(&mut tx, namespace, name, std::iter::empty()).await?;
        tx.execute(Self::q("DELETE FROM job_deletions WHERE uid = ?").bind(&job.uid)).await?;
        tx.execute(Self::q("INSERT INTO job_deletions (uid, change_seq) VALUES (?, ?)").bind(&job.uid).bind(seq)).await?;
        tx.commit().await
    }
}

#[async_trait]
impl<B: Backend> JobStore for SqlStore<B> {
    async fn put_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError> {
        self.write_job(spec, precondition, now, true).await
    }

    async fn set_job_paused(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError> {
        let mut w = self.db.writer().await?;
        let mut tx = Self::begin_write(&mut w).await?;
        // A resume may settle the timeline at once (`settled_on_resume`).
        let settle = match paused {
            true => None,
            false => Self::job_by_name(&mut tx, namespace, name).await?.and_then(|j| crate::settled_on_resume(&j, now)),
        };
        let seq = Self::bump_change_seq(&mut tx).await?;
        // The pause or resume time is recorded only when `paused` changes
        // (assigned before `paused`: MySQL evaluates an UPDATE's
        // assignments left to right).
        let q = if paused {
            Self::q(
                "UPDATE jobs SET paused_at = CASE WHEN paused = 0 THEN ? ELSE paused_at END, paused = 1, \
                 version = version + 1, updated_at = ?, change_seq = ? WHERE namespace = ? AND name = ?",
            )
        } else if let Some(last) = settle {
            Self::q("UPDATE jobs SET last_scheduled_at = ")
                .push(B::DIALECT.greatest)
                .push(
                    "(COALESCE(last_scheduled_at, ?), ?), resumed_at = CASE WHEN paused = 1 THEN ? ELSE resumed_at END, paused = 0, \
                     version = version + 1, updated_at = ?, change_seq = ? WHERE namespace = ? AND name = ?",
                )
                .bind(last)
                .bind(last)
        } else {
            Self::q(
                "UPDATE jobs SET resumed_at = CASE WHEN paused = 1 THEN ? ELSE resumed_at END, paused = 0, \
                 version = version + 1, updated_at = ?, change_seq = ? WHERE namespace = ? AND name = ?",
            )
        };
        let changed = tx.execute(q.bind(now).bind(now).bind(seq).bind(namespace).bind(name)).await?;
        if changed == 0 {
            return Err(StoreError::NotFound(format!("job {namespace}/{name}")));
        }
        let record = Self::job_after_write(&mut tx, namespace, name).await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn delete_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError> {
        self.remove_job(namespace, name, precondition, true).await
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
        let row = self.read_optional(Self::q("SELECT * FROM jobs WHERE namespace = ? AND name = ?").bind(namespace).bind(name)).await?;
        row.map(|r| job_from_row(&r)).transpose()
    }

    async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>, StoreError> {
        let q = match namespace {
            Some(ns) => Self::q("SELECT * FROM jobs WHERE namespace = ? ORDER BY namespace, name").bind(ns),
            None => Self::q("SELECT * FROM jobs ORDER BY namespace, name"),
        };
        self.read_all(q).await?.iter().map(job_from_row).collect()
    }

    async fn dependents(&self, namespace: &str, name: &str) -> Result<Vec<JobRecord>, StoreError> {
        let q = Self::q(
            "SELECT j.* FROM job_edges e JOIN jobs j ON j.namespace = e.namespace AND j.name = e.downstream \
             WHERE e.namespace = ? AND e.upstream = ? ORDER BY j.name",
        );
        self.read_all(q.bind(namespace).bind(name)).await?.iter().map(job_from_row).collect()
    }

    async fn job_changes(&self, since: u64) -> Result<JobChanges, StoreError> {
        // The counter is read first: every row whose change_seq is at most
        // that value has committed (writers hold the counter row until they
        // commit), so nothing up to `seq` can appear later.
        let mut conn = self.db.pool().acquire().await.map_err(super::db_err)?;
        let mut tx = Tx::<B::Db>::begin(&mut conn, None).await?;
        let seq = Self::change_seq(&mut tx).await?;
        let rows = tx
            .fetch_all(
                Self::q("SELECT * FROM jobs WHERE change_seq > ? AND change_seq <= ? ORDER BY change_seq").bind(to_i64(since)).bind(seq),
            )
            .await?;
        let deleted = tx
            .fetch_all(
                Self::q("SELECT uid FROM job_deletions WHERE change_seq > ? AND change_seq <= ? ORDER BY change_seq")
                    .bind(to_i64(since))
                    .bind(seq),
            )
            .await?
            .iter()
            .map(|r| r.text("uid"))
            .collect::<Result<Vec<String>, _>>()?;
        tx.commit().await?;
        Ok(JobChanges { upserted: rows.iter().map(job_from_row).collect::<Result<_, _>>()?, deleted, seq: to_u64(seq) })
    }

    async fn job_heads(&self) -> Result<JobHeads, StoreError> {
        // As in `job_changes`: the counter first, then the rows.
        let mut conn = self.db.pool().acquire().await.map_err(super::db_err)?;
        let mut tx = Tx::<B::Db>::begin(&mut conn, None).await?;
        let seq = Self::change_seq(&mut tx).await?;
        if let Some(sql) = B::DIALECT.heads_json {
            // One row holding them all: far cheaper for drivers that pay
            // per row (SQLite's).
            let all = tx.fetch_one(Self::q(sql)).await?.first_opt_text()?;
            tx.commit().await?;
            let rows: Vec<(String, u64, Option<Millis>)> = match all {
                Some(all) => serde_json::from_str(&all).map_err(|e| StoreError::Corrupt(format!("job heads: {e}")))?,
                None => Vec::new(),
            };
            let heads = rows.into_iter().map(|(uid, version, last_scheduled_at)| JobHead { uid, version, last_scheduled_at }).collect();
            return Ok(JobHeads { heads, seq: to_u64(seq) });
        }
        let rows = tx.fetch_all(Self::q("SELECT uid, version, last_scheduled_at FROM jobs")).await?;
        tx.commit().await?;
        let heads = rows.iter().map(|r| Ok(Decodes::<HeadRow>::decode(r)?.into())).collect::<Result<_, StoreError>>()?;
        Ok(JobHeads { heads, seq: to_u64(seq) })
    }

    async fn jobs_by_uid(&self, uids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
        let mut out = Vec::with_capacity(uids.len());
        for chunk in uids.chunks(CHUNK) {
            let q = Self::q("SELECT * FROM jobs WHERE uid IN (").push_list(chunk).push(")").once();
            for r in self.read_all(q).await? {
                out.push(job_from_row(&r)?);
            }
        }
        Ok(out)
    }
}
