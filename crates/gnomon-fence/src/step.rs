//! The step records: what the guard found for a step ([`Step`]), the
//! fresh step the caller records a result for ([`Fresh`]), and step names.

use serde::Serialize;
use sqlx::Transaction;

use crate::{statements, Backend, BoxFuture, FenceError};

/// The step name of a run that is one step.
pub const DEFAULT_STEP: &str = "run";

/// The longest step name: 255 characters.
pub const MAX_STEP_LEN: usize = 255;

/// What the guard found for a step.
#[derive(Debug)]
#[must_use = "a recorded step's result is the step's; a fresh step is done, recorded and committed by the caller"]
pub enum Step {
    /// The step is committed already, by `attempt` under `token` (older,
    /// newer or the caller's own): write nothing, use `result` (JSON
    /// `null` when nothing was recorded).
    Recorded { attempt: u32, token: u64, result: serde_json::Value },
    /// The step is the caller's: do its writes in the same transaction,
    /// [`Fresh::record`] the result, commit.
    Fresh(Fresh),
}

impl Step {
    /// Whether the step is the caller's to do.
    pub fn is_fresh(&self) -> bool {
        matches!(self, Step::Fresh(_))
    }
}

/// A step the guard gave the caller: its record is inserted (result
/// `null`) in the caller's transaction, and commits with it.
#[derive(Debug)]
#[must_use = "record the step's result before committing"]
pub struct Fresh {
    pub(crate) run_id: String,
    pub(crate) step: String,
    pub(crate) steps_table: String,
}

impl Fresh {
    /// The step's name.
    pub fn step(&self) -> &str {
        &self.step
    }

    /// Records the step's result (as JSON) in the transaction the guard
    /// ran in; commit afterwards. Without it the recorded result is `null`.
    pub fn record<'a, DB: Backend, R: Serialize + ?Sized>(
        self,
        tx: &'a mut Transaction<'_, DB>,
        result: &R,
    ) -> BoxFuture<'a, Result<(), FenceError>> {
        let json = serde_json::to_string(result);
        Box::pin(async move {
            let json = json.map_err(FenceError::BadResult)?;
            statements::record::<DB>(&mut **tx, &self.steps_table, &self.run_id, &self.step, &json).await
        })
    }
}

pub(crate) fn recorded((attempt, token, result): (i64, i64, Option<String>)) -> Result<Step, FenceError> {
    let result = match result {
        Some(text) => serde_json::from_str(&text).map_err(FenceError::BadResult)?,
        None => serde_json::Value::Null,
    };
    Ok(Step::Recorded { attempt: u32::try_from(attempt).unwrap_or(u32::MAX), token: u64::try_from(token).unwrap_or(0), result })
}

pub(crate) fn check_step(step: &str) -> Result<(), FenceError> {
    let n = step.chars().count();
    if n == 0 || n > MAX_STEP_LEN {
        return Err(FenceError::BadStep(step.to_string()));
    }
    Ok(())
}
