//! The embedded SQLite store (sqlx, WAL, `synchronous=FULL`).
//!
//! Every write transaction starts with `BEGIN IMMEDIATE`, so it holds
//! SQLite's single write lock from its first statement: the fencing check
//! and the writes that follow cannot interleave with another writer, in this
//! process or another one sharing the file.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use gnomon_core::spec::JobSpec;
use gnomon_core::{AttemptState, Millis, RunState};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool, Transaction};

use crate::migrate::Migration;
use crate::*;

const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    statements: &[
        "CREATE TABLE jobs (
            uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL,
            version INTEGER NOT NULL, paused INTEGER NOT NULL DEFAULT 0,
            created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
            last_scheduled_at INTEGER, change_seq INTEGER NOT NULL,
            UNIQUE (namespace, name))",
        "CREATE INDEX jobs_change_seq ON jobs (change_seq)",
        "CREATE TABLE job_deletions (uid TEXT PRIMARY KEY, change_seq INTEGER NOT NULL)",
        "CREATE INDEX job_deletions_seq ON job_deletions (change_seq)",
        "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        "INSERT INTO counters (name, value) VALUES ('job_change_seq', 0)",
        "CREATE TABLE runs (
            seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
            job_uid TEXT NOT NULL, namespace TEXT NOT NULL, job TEXT NOT NULL,
            scheduled_at INTEGER NOT NULL, fired_at INTEGER NOT NULL,
            state TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, reason TEXT,
            next_attempt_at INTEGER, manual INTEGER NOT NULL DEFAULT 0,
            cancel_requested INTEGER NOT NULL DEFAULT 0, updated_at INTEGER NOT NULL,
            UNIQUE (job_uid, scheduled_at))",
        "CREATE INDEX runs_open ON runs (state) WHERE state IN ('pending', 'assigned', 'running', 'retrying')",
        "CREATE INDEX runs_by_job ON runs (namespace, job, seq)",
        "CREATE INDEX runs_by_state ON runs (state, seq)",
        "CREATE TABLE attempts (
            run_id TEXT NOT NULL, attempt INTEGER NOT NULL, worker TEXT NOT NULL, token INTEGER NOT NULL,
            state TEXT NOT NULL, assigned_at INTEGER NOT NULL, started_at INTEGER, ended_at INTEGER,
            exit_code INTEGER, output TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (run_id, attempt))",
        "CREATE TABLE leadership (
            scope TEXT PRIMARY KEY, token INTEGER NOT NULL, holder TEXT NOT NULL,
            address TEXT NOT NULL, backend TEXT NOT NULL, since INTEGER NOT NULL)",
        "CREATE TABLE epochs (scope TEXT PRIMARY KEY, epoch INTEGER NOT NULL)",
    ],
}];

/// Rows per multi-row INSERT (well under SQLite's bound-parameter limit).
const INSERT_CHUNK: usize = 500;

#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

fn db_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => StoreError::Unavailable(e.to_string()),
        sqlx::Error::Database(d) if d.message().contains("locked") || d.message().contains("busy") => {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Backend(e.to_string()),
    }
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}
fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `sqlite://PATH` and applies
    /// migrations. `sqlite::memory:` is accepted for tests.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::InvalidUrl(format!("{url}: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .map_err(|e| StoreError::Unavailable(format!("cannot open {url}: {e}")))?;
        let store = Self { pool };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS gnomon_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)")
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        let current: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM gnomon_migrations").fetch_one(&mut *tx).await.map_err(db_err)?;
        for m in MIGRATIONS.iter().filter(|m| m.version > current.unwrap_or(0)) {
            for stmt in m.statements {
                sqlx::query(stmt).execute(&mut *tx).await.map_err(db_err)?;
            }
            sqlx::query("INSERT INTO gnomon_migrations (version, applied_at) VALUES (?, strftime('%s','now'))")
                .bind(m.version)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)
    }

    async fn write_tx(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db_err)
    }

    /// The fencing check, inside the caller's write transaction.
    async fn check_fence(tx: &mut Transaction<'static, Sqlite>, fence: &Fence) -> Result<(), StoreError> {
        let current: Option<i64> = sqlx::query_scalar("SELECT token FROM leadership WHERE scope = ?")
            .bind(&fence.scope)
            .fetch_optional(&mut **tx)
            .await
            .map_err(db_err)?;
        let current = current.map(to_u64).unwrap_or(0);
        if current != fence.token {
            crate::count_fencing_rejection();
            return Err(StoreError::Fenced { scope: fence.scope.clone(), token: fence.token, current });
        }
        Ok(())
    }

    async fn bump_change_seq(tx: &mut Transaction<'static, Sqlite>) -> Result<i64, StoreError> {
        sqlx::query_scalar("UPDATE counters SET value = value + 1 WHERE name = 'job_change_seq' RETURNING value")
            .fetch_one(&mut **tx)
            .await
            .map_err(db_err)
    }

    async fn job_by_name(tx: &mut Transaction<'static, Sqlite>, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
        sqlx::query("SELECT * FROM jobs WHERE namespace = ? AND name = ?")
            .bind(namespace)
            .bind(name)
            .fetch_optional(&mut **tx)
            .await
            .map_err(db_err)?
            .map(|r| job_from_row(&r))
            .transpose()
    }
}

fn job_from_row(r: &SqliteRow) -> Result<JobRecord, StoreError> {
    let spec_text: String = r.get("spec");
    let spec: JobSpec = serde_json::from_str(&spec_text).map_err(|e| StoreError::Corrupt(format!("job spec: {e}")))?;
    Ok(JobRecord {
        uid: r.get("uid"),
        namespace: r.get("namespace"),
        name: r.get("name"),
        spec,
        version: to_u64(r.get("version")),
        paused: r.get::<i64, _>("paused") != 0,
        created_at: r.get("created_at"),
        updated_at: r.get("updated_at"),
        last_scheduled_at: r.get("last_scheduled_at"),
        change_seq: to_u64(r.get("change_seq")),
    })
}

fn run_from_row(r: &SqliteRow) -> Result<RunRecord, StoreError> {
    let state: String = r.get("state");
    Ok(RunRecord {
        id: r.get("id"),
        seq: r.get("seq"),
        job_uid: r.get("job_uid"),
        job: r.get("job"),
        namespace: r.get("namespace"),
        scheduled_at: r.get("scheduled_at"),
        fired_at: r.get("fired_at"),
        state: RunState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("run state {state:?}")))?,
        attempt: u32::try_from(r.get::<i64, _>("attempt")).unwrap_or(0),
        reason: r.get("reason"),
        next_attempt_at: r.get("next_attempt_at"),
        manual: r.get::<i64, _>("manual") != 0,
        cancel_requested: r.get::<i64, _>("cancel_requested") != 0,
        updated_at: r.get("updated_at"),
    })
}

fn attempt_from_row(r: &SqliteRow) -> Result<AttemptRecord, StoreError> {
    let state: String = r.get("state");
    Ok(AttemptRecord {
        attempt: u32::try_from(r.get::<i64, _>("attempt")).unwrap_or(0),
        worker: r.get("worker"),
        token: to_u64(r.get("token")),
        state: AttemptState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("attempt state {state:?}")))?,
        assigned_at: r.get("assigned_at"),
        started_at: r.get("started_at"),
        ended_at: r.get("ended_at"),
        exit_code: r.get::<Option<i64>, _>("exit_code").and_then(|c| i32::try_from(c).ok()),
        output: r.get("output"),
    })
}

fn new_uid() -> String {
    format!("{:016x}", rand::random::<u64>())
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn put_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError> {
        let ns = spec.namespace().to_string();
        let spec_text = serde_json::to_string(spec).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut tx = self.write_tx().await?;
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
        let seq = Self::bump_change_seq(&mut tx).await?;
        match existing {
            Some(j) => {
                sqlx::query("UPDATE jobs SET spec = ?, version = version + 1, updated_at = ?, change_seq = ? WHERE uid = ?")
                    .bind(&spec_text)
                    .bind(now)
                    .bind(seq)
                    .bind(&j.uid)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
            }
            None => {
                sqlx::query("INSERT INTO jobs (uid, namespace, name, spec, version, paused, created_at, updated_at, last_scheduled_at, change_seq) VALUES (?, ?, ?, ?, 1, 0, ?, ?, NULL, ?)")
                    .bind(new_uid())
                    .bind(&ns)
                    .bind(&spec.name)
                    .bind(&spec_text)
                    .bind(now)
                    .bind(now)
                    .bind(seq)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
            }
        }
        let record = Self::job_by_name(&mut tx, &ns, &spec.name).await?.ok_or_else(|| StoreError::Backend("job vanished".into()))?;
        tx.commit().await.map_err(db_err)?;
        Ok(record)
    }

    async fn set_job_paused(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError> {
        let mut tx = self.write_tx().await?;
        let seq = Self::bump_change_seq(&mut tx).await?;
        let changed = sqlx::query(
            "UPDATE jobs SET paused = ?, version = version + 1, updated_at = ?, change_seq = ? WHERE namespace = ? AND name = ?",
        )
        .bind(i64::from(paused))
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
        let record = Self::job_by_name(&mut tx, namespace, name).await?.ok_or_else(|| StoreError::Backend("job vanished".into()))?;
        tx.commit().await.map_err(db_err)?;
        Ok(record)
    }

    async fn delete_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        let what = format!("job {namespace}/{name}");
        let existing = Self::job_by_name(&mut tx, namespace, name).await?;
        let job = match (existing, precondition) {
            (None, _) => return Err(StoreError::NotFound(what)),
            (Some(j), Precondition::MatchesVersion(v)) if j.version != v => {
                return Err(StoreError::VersionConflict { what, expected: v, actual: j.version })
            }
            (Some(_), Precondition::DoesNotExist) => return Err(StoreError::AlreadyExists(what)),
            (Some(j), _) => j,
        };
        let seq = Self::bump_change_seq(&mut tx).await?;
        sqlx::query("DELETE FROM jobs WHERE uid = ?").bind(&job.uid).execute(&mut *tx).await.map_err(db_err)?;
        sqlx::query("INSERT OR REPLACE INTO job_deletions (uid, change_seq) VALUES (?, ?)")
            .bind(&job.uid)
            .bind(seq)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        tx.commit().await.map_err(db_err)
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
        sqlx::query("SELECT * FROM jobs WHERE namespace = ? AND name = ?")
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
            Some(ns) => sqlx::query("SELECT * FROM jobs WHERE namespace = ? ORDER BY namespace, name").bind(ns).fetch_all(&self.pool).await,
            None => sqlx::query("SELECT * FROM jobs ORDER BY namespace, name").fetch_all(&self.pool).await,
        }
        .map_err(db_err)?;
        rows.iter().map(job_from_row).collect()
    }

    async fn job_changes(&self, since: u64) -> Result<JobChanges, StoreError> {
        // One read transaction so the snapshot is consistent with `seq`.
        let mut tx = self.pool.begin().await.map_err(db_err)?;
        let seq: i64 =
            sqlx::query_scalar("SELECT value FROM counters WHERE name = 'job_change_seq'").fetch_one(&mut *tx).await.map_err(db_err)?;
        let rows = sqlx::query("SELECT * FROM jobs WHERE change_seq > ? ORDER BY change_seq")
            .bind(to_i64(since))
            .fetch_all(&mut *tx)
            .await
            .map_err(db_err)?;
        let deleted: Vec<String> = sqlx::query_scalar("SELECT uid FROM job_deletions WHERE change_seq > ? ORDER BY change_seq")
            .bind(to_i64(since))
            .fetch_all(&mut *tx)
            .await
            .map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(JobChanges { upserted: rows.iter().map(job_from_row).collect::<Result<_, _>>()?, deleted, seq: to_u64(seq) })
    }

    async fn next_epoch(&self, scope: &str) -> Result<u64, StoreError> {
        let mut tx = self.write_tx().await?;
        // The epoch never falls below the scope's fenced token, so a new term
        // always outranks every earlier one.
        let epoch: i64 = sqlx::query_scalar(
            "INSERT INTO epochs (scope, epoch) VALUES (?1, COALESCE((SELECT token FROM leadership WHERE scope = ?1), 0) + 1)
             ON CONFLICT (scope) DO UPDATE SET epoch = MAX(epoch, COALESCE((SELECT token FROM leadership WHERE scope = ?1), 0)) + 1
             RETURNING epoch",
        )
        .bind(scope)
        .fetch_one(&mut *tx)
        .await
        .map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(to_u64(epoch))
    }

    async fn fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        let current: Option<i64> = sqlx::query_scalar("SELECT token FROM leadership WHERE scope = ?")
            .bind(&fence.scope)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_err)?;
        let current = current.map(to_u64).unwrap_or(0);
        if fence.token <= current {
            return Err(StoreError::StaleToken { scope: fence.scope.clone(), token: fence.token, current });
        }
        sqlx::query(
            "INSERT INTO leadership (scope, token, holder, address, backend, since) VALUES (?, ?, ?, ?, ?, ?)
             ON CONFLICT (scope) DO UPDATE SET token = excluded.token, holder = excluded.holder, address = excluded.address, backend = excluded.backend, since = excluded.since",
        )
        .bind(&fence.scope)
        .bind(to_i64(fence.token))
        .bind(&holder.holder)
        .bind(&holder.address)
        .bind(&holder.backend)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        tx.commit().await.map_err(db_err)
    }

    async fn leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError> {
        let row = sqlx::query("SELECT * FROM leadership WHERE scope = ?").bind(scope).fetch_optional(&self.pool).await.map_err(db_err)?;
        Ok(row.map(|r| LeadershipRecord {
            scope: r.get("scope"),
            token: to_u64(r.get("token")),
            holder: r.get("holder"),
            address: r.get("address"),
            backend: r.get("backend"),
            since: r.get("since"),
        }))
    }

    async fn fire(&self, fence: &Fence, runs: &[NewRun], advances: &[JobAdvance]) -> Result<Vec<FireOutcome>, StoreError> {
        let mut tx = self.write_tx().await?;
        Self::check_fence(&mut tx, fence).await?;
        let mut created = std::collections::HashSet::new();
        for chunk in runs.chunks(INSERT_CHUNK) {
            let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
                "INSERT INTO runs (id, job_uid, namespace, job, scheduled_at, fired_at, state, attempt, reason, manual, updated_at) ",
            );
            qb.push_values(chunk, |mut b, r| {
                b.push_bind(r.id())
                    .push_bind(&r.job_uid)
                    .push_bind(&r.namespace)
                    .push_bind(&r.job)
                    .push_bind(r.scheduled_at)
                    .push_bind(r.fired_at)
                    .push_bind(r.state.as_str())
                    .push_bind(0i64)
                    .push_bind(&r.reason)
                    .push_bind(i64::from(r.manual))
                    .push_bind(r.fired_at);
            });
            qb.push(" ON CONFLICT (job_uid, scheduled_at) DO NOTHING RETURNING id");
            let ids: Vec<String> = qb.build_query_scalar().fetch_all(&mut *tx).await.map_err(db_err)?;
            created.extend(ids);
        }
        // One statement per chunk of advances; the highest time per job wins.
        let mut latest: std::collections::HashMap<&str, Millis> = std::collections::HashMap::new();
        for a in advances {
            let e = latest.entry(a.job_uid.as_str()).or_insert(a.last_scheduled_at);
            *e = (*e).max(a.last_scheduled_at);
        }
        let latest: Vec<(&str, Millis)> = latest.into_iter().collect();
        for chunk in latest.chunks(INSERT_CHUNK) {
            let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new("UPDATE jobs SET last_scheduled_at = CASE uid");
            for (uid, at) in chunk {
                qb.push(" WHEN ")
                    .push_bind(*uid)
                    .push(" THEN MAX(COALESCE(last_scheduled_at, ")
                    .push_bind(*at)
                    .push("), ")
                    .push_bind(*at)
                    .push(")");
            }
            qb.push(" ELSE last_scheduled_at END WHERE uid IN (");
            let mut sep = qb.separated(", ");
            for (uid, _) in chunk {
                sep.push_bind(*uid);
            }
            qb.push(")");
            qb.build().execute(&mut *tx).await.map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)?;
        Ok(runs.iter().map(|r| if created.contains(&r.id()) { FireOutcome::Created } else { FireOutcome::Existed }).collect())
    }

    async fn transition(&self, fence: &Fence, transitions: &[Transition]) -> Result<Vec<bool>, StoreError> {
        for t in transitions {
            if !t.from.can_become(t.to) {
                return Err(StoreError::InvalidTransition { run: t.run_id.clone(), from: t.from.to_string(), to: t.to.to_string() });
            }
        }
        let mut tx = self.write_tx().await?;
        Self::check_fence(&mut tx, fence).await?;
        let mut applied = Vec::with_capacity(transitions.len());
        for t in transitions {
            let n = sqlx::query(
                "UPDATE runs SET state = ?, attempt = ?, reason = COALESCE(?, reason), next_attempt_at = ?, updated_at = ?,
                 cancel_requested = CASE WHEN ? IN ('succeeded','failed','cancelled','skipped') THEN 0 ELSE cancel_requested END
                 WHERE id = ? AND state = ? AND attempt = ?",
            )
            .bind(t.to.as_str())
            .bind(i64::from(t.to_attempt))
            .bind(&t.reason)
            .bind(t.next_attempt_at)
            .bind(t.at)
            .bind(t.to.as_str())
            .bind(&t.run_id)
            .bind(t.from.as_str())
            .bind(i64::from(t.from_attempt))
            .execute(&mut *tx)
            .await
            .map_err(db_err)?
            .rows_affected();
            if n == 1 {
                if let Some(change) = &t.attempt {
                    apply_attempt_change(&mut tx, &t.run_id, change, t.at).await?;
                }
            }
            applied.push(n == 1);
        }
        tx.commit().await.map_err(db_err)?;
        Ok(applied)
    }

    async fn request_cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
        let mut tx = self.write_tx().await?;
        let n = sqlx::query("UPDATE runs SET state = 'cancelled', reason = 'cancelled by request', updated_at = ? WHERE id = ? AND state IN ('pending', 'retrying')")
            .bind(now)
            .bind(run_id)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?
            .rows_affected();
        if n == 1 {
            tx.commit().await.map_err(db_err)?;
            return Ok(CancelOutcome::Cancelled);
        }
        let n = sqlx::query("UPDATE runs SET cancel_requested = 1, updated_at = ? WHERE id = ? AND state IN ('assigned', 'running')")
            .bind(now)
            .bind(run_id)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?
            .rows_affected();
        if n == 1 {
            tx.commit().await.map_err(db_err)?;
            return Ok(CancelOutcome::Requested);
        }
        let exists: Option<String> =
            sqlx::query_scalar("SELECT state FROM runs WHERE id = ?").bind(run_id).fetch_optional(&mut *tx).await.map_err(db_err)?;
        match exists {
            None => Err(StoreError::NotFound(format!("run {run_id}"))),
            Some(_) => Err(StoreError::Terminal(run_id.to_string())),
        }
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError> {
        let Some(row) = sqlx::query("SELECT * FROM runs WHERE id = ?").bind(run_id).fetch_optional(&self.pool).await.map_err(db_err)?
        else {
            return Ok(None);
        };
        let run = run_from_row(&row)?;
        let attempts = sqlx::query("SELECT * FROM attempts WHERE run_id = ? ORDER BY attempt")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(db_err)?;
        Ok(Some(RunDetail { run, attempts: attempts.iter().map(attempt_from_row).collect::<Result<_, _>>()? }))
    }

    async fn list_runs(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError> {
        let limit = limit.clamp(1, 1000);
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new("SELECT * FROM runs WHERE 1 = 1");
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
        let rows = qb.build().fetch_all(&self.pool).await.map_err(db_err)?;
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

    async fn cancel_requests(&self) -> Result<Vec<RunRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM runs WHERE state IN ('assigned', 'running') AND cancel_requested = 1")
            .fetch_all(&self.pool)
            .await
            .map_err(db_err)?;
        rows.iter().map(run_from_row).collect()
    }
}

async fn apply_attempt_change(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: &str,
    change: &AttemptChange,
    at: Millis,
) -> Result<(), StoreError> {
    match change {
        AttemptChange::Assign { attempt, worker, token } => {
            sqlx::query("INSERT INTO attempts (run_id, attempt, worker, token, state, assigned_at) VALUES (?, ?, ?, ?, 'assigned', ?)")
                .bind(run_id)
                .bind(i64::from(*attempt))
                .bind(worker)
                .bind(to_i64(*token))
                .bind(at)
                .execute(&mut **tx)
                .await
                .map_err(db_err)?;
        }
        AttemptChange::Start { attempt } => {
            sqlx::query("UPDATE attempts SET state = 'running', started_at = ? WHERE run_id = ? AND attempt = ? AND state = 'assigned'")
                .bind(at)
                .bind(run_id)
                .bind(i64::from(*attempt))
                .execute(&mut **tx)
                .await
                .map_err(db_err)?;
        }
        AttemptChange::End { attempt, state, exit_code, output } => {
            sqlx::query(
                "UPDATE attempts SET state = ?, ended_at = ?, started_at = COALESCE(started_at, ?), exit_code = ?, output = ?
                 WHERE run_id = ? AND attempt = ? AND state IN ('assigned', 'running')",
            )
            .bind(state.as_str())
            .bind(at)
            .bind(at)
            .bind(exit_code.map(i64::from))
            .bind(output)
            .bind(run_id)
            .bind(i64::from(*attempt))
            .execute(&mut **tx)
            .await
            .map_err(db_err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn open_temp() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("gnomon.db").display());
        (dir, url)
    }

    #[tokio::test]
    async fn conformance_suite_passes_on_sqlite() {
        let (_dir, url) = open_temp().await;
        let url2 = url.clone();
        crate::conformance::store_suite(move || {
            let url = url2.clone();
            async move { Arc::new(SqliteStore::open(&url).await.unwrap()) as Arc<dyn Store> }
        })
        .await;
        let _ = url;
    }

    #[tokio::test]
    async fn elector_suite_passes_on_local() {
        let (_dir, url) = open_temp().await;
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&url).await.unwrap());
        crate::conformance::elector_suite(store.clone(), Arc::new(crate::local::LocalElector::new(store))).await;
    }

    use std::sync::Arc;
}
