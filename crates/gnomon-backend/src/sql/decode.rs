//! Rows of the SQL stores' tables, read by sqlx into typed structs
//! (`FromRow`, by column name, on every SQL database: SQLite's reads go
//! through sqlx too), then into the store's records, checking what the
//! columns' types cannot (states, JSON, ranges).

use gnomon_core::spec::JobSpec;
use gnomon_core::{AttemptState, RunState};

use super::driver::{Decodes, Text};
use super::plan::RunRow;
use crate::{AttemptRecord, JobRecord, LeadershipRecord, Notification, NotificationState, RunRecord, StoreError};

fn parsed<T>(what: &str, text: &str, parse: impl Fn(&str) -> Option<T>) -> Result<T, StoreError> {
    parse(text).ok_or_else(|| StoreError::Corrupt(format!("{what} {text:?}")))
}

fn unsigned(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn small(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn text(t: Option<Text>) -> Option<String> {
    t.map(|t| t.0)
}

/// A `jobs` row.
#[derive(Debug, sqlx::FromRow)]
pub struct JobsRow {
    uid: Text,
    namespace: Text,
    name: Text,
    spec: Text,
    version: i64,
    paused: i64,
    created_at: i64,
    updated_at: i64,
    last_scheduled_at: Option<i64>,
    paused_at: Option<i64>,
    resumed_at: Option<i64>,
    schedule_changed_at: Option<i64>,
    previous_schedule: Option<Text>,
    change_seq: i64,
}

impl TryFrom<JobsRow> for JobRecord {
    type Error = StoreError;

    fn try_from(r: JobsRow) -> Result<Self, StoreError> {
        let spec: JobSpec = serde_json::from_str(&r.spec.0).map_err(|e| StoreError::Corrupt(format!("job spec: {e}")))?;
        let previous_schedule = r
            .previous_schedule
            .map(|t| serde_json::from_str(&t.0))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("job previous_schedule: {e}")))?;
        Ok(JobRecord {
            uid: r.uid.0,
            namespace: r.namespace.0,
            name: r.name.0,
            spec,
            version: unsigned(r.version),
            paused: r.paused != 0,
            created_at: r.created_at,
            updated_at: r.updated_at,
            last_scheduled_at: r.last_scheduled_at,
            paused_at: r.paused_at,
            resumed_at: r.resumed_at,
            schedule_changed_at: r.schedule_changed_at,
            previous_schedule,
            change_seq: unsigned(r.change_seq),
        })
    }
}

/// A `runs` row.
#[derive(Debug, sqlx::FromRow)]
pub struct RunsRow {
    id: Text,
    seq: i64,
    job_uid: Text,
    job: Text,
    namespace: Text,
    scheduled_at: i64,
    fired_at: i64,
    state: Text,
    attempt: i64,
    reason: Option<Text>,
    next_attempt_at: Option<i64>,
    manual: i64,
    cancel_requested: i64,
    updated_at: i64,
    params: Option<Text>,
    payload: Option<Text>,
    upstream: Option<Text>,
}

impl TryFrom<RunsRow> for RunRecord {
    type Error = StoreError;

    fn try_from(r: RunsRow) -> Result<Self, StoreError> {
        Ok(RunRecord {
            state: parsed("run state", &r.state.0, RunState::parse)?,
            upstream: r.upstream.map(|t| crate::decode_upstream(&t.0)).transpose()?,
            id: r.id.0,
            seq: r.seq,
            job_uid: r.job_uid.0,
            job: r.job.0,
            namespace: r.namespace.0,
            scheduled_at: r.scheduled_at,
            fired_at: r.fired_at,
            attempt: small(r.attempt),
            reason: text(r.reason),
            next_attempt_at: r.next_attempt_at,
            manual: r.manual != 0,
            cancel_requested: r.cancel_requested != 0,
            updated_at: r.updated_at,
            params: text(r.params),
            payload: text(r.payload),
        })
    }
}

/// The columns of a `runs` row that a transition batch reads and writes.
#[derive(Debug, sqlx::FromRow)]
pub struct RunCasRow {
    id: Text,
    state: Text,
    attempt: i64,
    reason: Option<Text>,
    next_attempt_at: Option<i64>,
    updated_at: i64,
    cancel_requested: i64,
}

impl TryFrom<RunCasRow> for (String, RunRow) {
    type Error = StoreError;

    fn try_from(r: RunCasRow) -> Result<Self, StoreError> {
        let row = RunRow {
            state: parsed("run state", &r.state.0, RunState::parse)?,
            attempt: small(r.attempt),
            reason: text(r.reason),
            next_attempt_at: r.next_attempt_at,
            updated_at: r.updated_at,
            cancel_requested: r.cancel_requested != 0,
        };
        Ok((r.id.0, row))
    }
}

/// A `notifications` row.
#[derive(Debug, sqlx::FromRow)]
pub struct NotificationsRow {
    id: Text,
    run_id: Text,
    namespace: Text,
    job: Text,
    outcome: Text,
    target: Text,
    state: Text,
    attempts: i64,
    next_at: i64,
    last_error: Option<Text>,
    created_at: i64,
    updated_at: i64,
}

impl TryFrom<NotificationsRow> for Notification {
    type Error = StoreError;

    fn try_from(r: NotificationsRow) -> Result<Self, StoreError> {
        Ok(Notification {
            state: parsed("notification state", &r.state.0, NotificationState::parse)?,
            id: r.id.0,
            run_id: r.run_id.0,
            namespace: r.namespace.0,
            job: r.job.0,
            outcome: r.outcome.0,
            target: r.target.0,
            attempts: small(r.attempts),
            next_at: r.next_at,
            last_error: text(r.last_error),
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

/// An `attempts` row.
#[derive(Debug, sqlx::FromRow)]
pub struct AttemptsRow {
    attempt: i64,
    worker: Text,
    token: i64,
    state: Text,
    assigned_at: i64,
    started_at: Option<i64>,
    ended_at: Option<i64>,
    exit_code: Option<i64>,
    output: Text,
}

impl TryFrom<AttemptsRow> for AttemptRecord {
    type Error = StoreError;

    fn try_from(r: AttemptsRow) -> Result<Self, StoreError> {
        Ok(AttemptRecord {
            state: parsed("attempt state", &r.state.0, AttemptState::parse)?,
            attempt: small(r.attempt),
            worker: r.worker.0,
            token: unsigned(r.token),
            assigned_at: r.assigned_at,
            started_at: r.started_at,
            ended_at: r.ended_at,
            exit_code: r.exit_code.and_then(|c| i32::try_from(c).ok()),
            output: r.output.0,
        })
    }
}

/// A `leadership` row.
#[derive(Debug, sqlx::FromRow)]
pub struct LeadershipRow {
    scope: Text,
    token: i64,
    holder: Text,
    address: Text,
    backend: Text,
    since: i64,
    leader_time: i64,
}

impl From<LeadershipRow> for LeadershipRecord {
    fn from(r: LeadershipRow) -> Self {
        LeadershipRecord {
            scope: r.scope.0,
            token: unsigned(r.token),
            holder: r.holder.0,
            address: r.address.0,
            backend: r.backend.0,
            since: r.since,
            leader_time: r.leader_time,
        }
    }
}

/// A `backfills` row.
#[derive(Debug, sqlx::FromRow)]
pub struct BackfillsRow {
    id: Text,
    namespace: Text,
    job: Text,
    job_uid: Text,
    from_ms: i64,
    to_ms: i64,
    params: Option<Text>,
    rate: i64,
    total: i64,
    cursor_ms: i64,
    state: Text,
    created: i64,
    kept: i64,
    reason: Option<Text>,
    created_at: i64,
    updated_at: i64,
}

impl TryFrom<BackfillsRow> for crate::BackfillRecord {
    type Error = StoreError;

    fn try_from(r: BackfillsRow) -> Result<Self, StoreError> {
        Ok(crate::BackfillRecord {
            state: parsed("backfill state", &r.state.0, crate::BackfillState::parse)?,
            id: r.id.0,
            namespace: r.namespace.0,
            job: r.job.0,
            job_uid: r.job_uid.0,
            from: r.from_ms,
            to: r.to_ms,
            params: text(r.params),
            rate: small(r.rate),
            total: unsigned(r.total),
            cursor: r.cursor_ms,
            created: unsigned(r.created),
            kept: unsigned(r.kept),
            reason: text(r.reason),
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

/// A job's head (`SELECT uid, version, last_scheduled_at FROM jobs`).
#[derive(Debug, sqlx::FromRow)]
pub struct HeadRow {
    uid: Text,
    version: i64,
    last_scheduled_at: Option<i64>,
}

impl From<HeadRow> for crate::JobHead {
    fn from(r: HeadRow) -> Self {
        crate::JobHead { uid: r.uid.0, version: unsigned(r.version), last_scheduled_at: r.last_scheduled_at }
    }
}

/// A run's live attempt (`run_id, attempt, worker, assigned_at, started_at`).
#[derive(Debug, sqlx::FromRow)]
pub struct LiveAttemptRow {
    run_id: Text,
    attempt: i64,
    worker: Text,
    assigned_at: i64,
    started_at: Option<i64>,
}

impl From<LiveAttemptRow> for crate::LiveAttempt {
    fn from(r: LiveAttemptRow) -> Self {
        crate::LiveAttempt {
            run_id: r.run_id.0,
            attempt: small(r.attempt),
            worker: r.worker.0,
            assigned_at: r.assigned_at,
            started_at: r.started_at,
        }
    }
}

/// A run as the walk for kept keyed runs reads it (`id, namespace,
/// state, fired_at`, and a keyed run's `params, payload`).
#[derive(Debug, sqlx::FromRow)]
pub struct KeptRow {
    pub seq: i64,
    id: Text,
    namespace: Text,
    state: Text,
    fired_at: i64,
    params: Option<Text>,
    payload: Option<Text>,
}

impl KeptRow {
    /// When the run was fired.
    pub fn fired_at(&self) -> gnomon_core::Millis {
        self.fired_at
    }

    /// The run's kept record, if it is a keyed run that has ended and was
    /// fired at or after `since`.
    pub fn kept(&self, since: gnomon_core::Millis) -> Result<Option<crate::KeptRun>, StoreError> {
        if !parsed("run state", &self.state.0, RunState::parse)?.is_terminal() {
            return Ok(None);
        }
        fn text(t: &Option<Text>) -> Option<&str> {
            t.as_ref().map(|t| t.0.as_str())
        }
        Ok(crate::KeptRun::of(&self.id.0, &self.namespace.0, self.fired_at, text(&self.params), text(&self.payload), since))
    }
}

/// A job's name and its spec when the spec may have edges (`name, edges`).
#[derive(Debug, sqlx::FromRow)]
pub struct EdgesRow {
    pub name: Text,
    pub edges: Option<Text>,
}

/// A `jobs` row (`SELECT *`).
pub(crate) fn job_from_row(r: &impl Decodes<JobsRow>) -> Result<JobRecord, StoreError> {
    r.decode()?.try_into()
}

/// A `runs` row (`SELECT *`).
pub(crate) fn run_from_row(r: &impl Decodes<RunsRow>) -> Result<RunRecord, StoreError> {
    r.decode()?.try_into()
}

/// A run's id and the columns a transition batch reads.
pub(crate) fn run_row(r: &impl Decodes<RunCasRow>) -> Result<(String, RunRow), StoreError> {
    r.decode()?.try_into()
}

/// A `notifications` row (`SELECT *`).
pub(crate) fn notification_from_row(r: &impl Decodes<NotificationsRow>) -> Result<Notification, StoreError> {
    r.decode()?.try_into()
}

/// An `attempts` row (`SELECT *`).
pub(crate) fn attempt_from_row(r: &impl Decodes<AttemptsRow>) -> Result<AttemptRecord, StoreError> {
    r.decode()?.try_into()
}

/// A `leadership` row (`SELECT *`).
pub(crate) fn leadership_from_row(r: &impl Decodes<LeadershipRow>) -> Result<LeadershipRecord, StoreError> {
    Ok(r.decode()?.into())
}

/// A `backfills` row (`SELECT *`).
pub(crate) fn backfill_from_row(r: &impl Decodes<BackfillsRow>) -> Result<crate::BackfillRecord, StoreError> {
    r.decode()?.try_into()
}
