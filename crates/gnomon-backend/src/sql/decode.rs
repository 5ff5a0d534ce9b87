//! Rows of the SQL stores' tables, read into the store's records.

use gnomon_core::spec::JobSpec;
use gnomon_core::{AttemptState, RunState};

use super::driver::SqlRow;
use super::plan::RunRow;
use crate::{AttemptRecord, JobRecord, LeadershipRecord, Notification, NotificationState, RunRecord, StoreError};

fn parsed<T>(what: &str, text: &str, parse: impl Fn(&str) -> Option<T>) -> Result<T, StoreError> {
    parse(text).ok_or_else(|| StoreError::Corrupt(format!("{what} {text:?}")))
}

/// A `jobs` row (`SELECT *`).
pub(crate) fn job_from_row(r: &impl SqlRow) -> Result<JobRecord, StoreError> {
    let spec: JobSpec = serde_json::from_str(&r.text("spec")?).map_err(|e| StoreError::Corrupt(format!("job spec: {e}")))?;
    Ok(JobRecord {
        uid: r.text("uid")?,
        namespace: r.text("namespace")?,
        name: r.text("name")?,
        spec,
        version: r.uint("version")?,
        paused: r.flag("paused")?,
        created_at: r.int("created_at")?,
        updated_at: r.int("updated_at")?,
        last_scheduled_at: r.opt_int("last_scheduled_at")?,
        paused_at: r.opt_int("paused_at")?,
        resumed_at: r.opt_int("resumed_at")?,
        schedule_changed_at: r.opt_int("schedule_changed_at")?,
        previous_schedule: r
            .opt_text("previous_schedule")?
            .map(|t| serde_json::from_str(&t))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("job previous_schedule: {e}")))?,
        change_seq: r.uint("change_seq")?,
    })
}

/// A `runs` row (`SELECT *`).
pub(crate) fn run_from_row(r: &impl SqlRow) -> Result<RunRecord, StoreError> {
    Ok(RunRecord {
        id: r.text("id")?,
        seq: r.int("seq")?,
        job_uid: r.text("job_uid")?,
        job: r.text("job")?,
        namespace: r.text("namespace")?,
        scheduled_at: r.int("scheduled_at")?,
        fired_at: r.int("fired_at")?,
        state: parsed("run state", &r.text("state")?, RunState::parse)?,
        attempt: r.u32("attempt")?,
        reason: r.opt_text("reason")?,
        next_attempt_at: r.opt_int("next_attempt_at")?,
        manual: r.flag("manual")?,
        cancel_requested: r.flag("cancel_requested")?,
        updated_at: r.int("updated_at")?,
        params: r.opt_text("params")?,
        payload: r.opt_text("payload")?,
        upstream: r.opt_text("upstream")?,
    })
}

/// The columns of a `runs` row that a transition batch reads and writes.
pub(crate) fn run_row(r: &impl SqlRow) -> Result<RunRow, StoreError> {
    Ok(RunRow {
        state: parsed("run state", &r.text("state")?, RunState::parse)?,
        attempt: r.u32("attempt")?,
        reason: r.opt_text("reason")?,
        next_attempt_at: r.opt_int("next_attempt_at")?,
        updated_at: r.int("updated_at")?,
        cancel_requested: r.flag("cancel_requested")?,
    })
}

/// A `notifications` row (`SELECT *`).
pub(crate) fn notification_from_row(r: &impl SqlRow) -> Result<Notification, StoreError> {
    Ok(Notification {
        id: r.text("id")?,
        run_id: r.text("run_id")?,
        namespace: r.text("namespace")?,
        job: r.text("job")?,
        outcome: r.text("outcome")?,
        target: r.text("target")?,
        state: parsed("notification state", &r.text("state")?, NotificationState::parse)?,
        attempts: r.u32("attempts")?,
        next_at: r.int("next_at")?,
        last_error: r.opt_text("last_error")?,
        created_at: r.int("created_at")?,
        updated_at: r.int("updated_at")?,
    })
}

/// An `attempts` row (`SELECT *`).
pub(crate) fn attempt_from_row(r: &impl SqlRow) -> Result<AttemptRecord, StoreError> {
    Ok(AttemptRecord {
        attempt: r.u32("attempt")?,
        worker: r.text("worker")?,
        token: r.uint("token")?,
        state: parsed("attempt state", &r.text("state")?, AttemptState::parse)?,
        assigned_at: r.int("assigned_at")?,
        started_at: r.opt_int("started_at")?,
        ended_at: r.opt_int("ended_at")?,
        exit_code: r.opt_int("exit_code")?.and_then(|c| i32::try_from(c).ok()),
        output: r.text("output")?,
    })
}

/// A `leadership` row (`SELECT *`).
pub(crate) fn leadership_from_row(r: &impl SqlRow) -> Result<LeadershipRecord, StoreError> {
    Ok(LeadershipRecord {
        scope: r.text("scope")?,
        token: r.uint("token")?,
        holder: r.text("holder")?,
        address: r.text("address")?,
        backend: r.text("backend")?,
        since: r.int("since")?,
        leader_time: r.int("leader_time")?,
    })
}

/// A `backfills` row (`SELECT *`).
pub(crate) fn backfill_from_row(r: &impl SqlRow) -> Result<crate::BackfillRecord, StoreError> {
    Ok(crate::BackfillRecord {
        id: r.text("id")?,
        namespace: r.text("namespace")?,
        job: r.text("job")?,
        job_uid: r.text("job_uid")?,
        from: r.int("from_ms")?,
        to: r.int("to_ms")?,
        params: r.opt_text("params")?,
        rate: r.u32("rate")?,
        total: r.uint("total")?,
        cursor: r.int("cursor_ms")?,
        state: parsed("backfill state", &r.text("state")?, crate::BackfillState::parse)?,
        created: r.uint("created")?,
        kept: r.uint("kept")?,
        reason: r.opt_text("reason")?,
        created_at: r.int("created_at")?,
        updated_at: r.int("updated_at")?,
    })
}
