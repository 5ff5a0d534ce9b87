//! The compare-and-swap rules of a transition batch, applied in memory to
//! the rows it locked, and the folding of a fire's transitions into its
//! inserts: pure functions the SQL stores share.

use std::collections::HashMap;

use gnomon_core::{Millis, RunState};

use crate::{AttemptChange, Transition};

/// The state of one run as a transition batch sees it.
#[derive(Debug, Clone)]
pub(crate) struct RunRow {
    pub state: RunState,
    pub attempt: u32,
    pub reason: Option<String>,
    pub next_attempt_at: Option<Millis>,
    pub updated_at: Millis,
    pub cancel_requested: bool,
}

impl crate::model::RunCasFields for RunRow {
    fn cas(&mut self) -> crate::model::RunCas<'_> {
        crate::model::RunCas {
            state: &mut self.state,
            attempt: &mut self.attempt,
            reason: &mut self.reason,
            next_attempt_at: &mut self.next_attempt_at,
            updated_at: &mut self.updated_at,
            cancel_requested: &mut self.cancel_requested,
        }
    }
}

impl RunRow {
    /// A new run's row as a fire inserts it.
    pub(crate) fn inserted(r: &crate::NewRun) -> RunRow {
        RunRow {
            state: r.state,
            attempt: 0,
            reason: r.reason.clone(),
            next_attempt_at: None,
            updated_at: r.fired_at,
            cancel_requested: false,
        }
    }
}

/// The transitions a fire may fold into its inserts, by run id: those that
/// are the only one of their run in the batch (index into `transitions`).
pub(crate) fn fold_candidates(transitions: &[Transition]) -> HashMap<&str, usize> {
    let mut per_run: HashMap<&str, (usize, usize)> = HashMap::new();
    for (i, t) in transitions.iter().enumerate() {
        per_run.entry(t.run_id.as_str()).or_insert((i, 0)).1 += 1;
    }
    per_run.into_iter().filter(|(_, (_, n))| *n == 1).map(|(id, (i, _))| (id, i)).collect()
}

/// A fire's job advances, one per job: the highest time wins
/// (`last_scheduled_at` never goes back).
pub(crate) fn latest_advances(advances: &[crate::JobAdvance]) -> Vec<(&str, Millis)> {
    let mut latest: HashMap<&str, Millis> = HashMap::new();
    for a in advances {
        let e = latest.entry(a.job_uid.as_str()).or_insert(a.last_scheduled_at);
        *e = (*e).max(a.last_scheduled_at);
    }
    latest.into_iter().collect()
}

/// The outcome of simulating a batch against the locked rows.
pub(crate) struct Planned<'a> {
    /// Per transition: applied or not.
    pub applied: Vec<bool>,
    /// Per changed run: (id, original state, original attempt, final row).
    pub finals: Vec<(String, RunState, u32, RunRow)>,
    /// Attempt changes of applied transitions, in order.
    pub attempts: Vec<(&'a str, &'a AttemptChange, Millis)>,
}

/// Applies the CAS rule of each transition in order, as the SQLite store's
/// one-`UPDATE`-per-transition loop would, against rows locked by the caller.
pub(crate) fn plan_transitions<'a>(locked: HashMap<String, RunRow>, batch: &'a [Transition]) -> Planned<'a> {
    let mut current = locked;
    let mut original: HashMap<String, (RunState, u32)> = HashMap::new();
    let mut order = Vec::new();
    let mut applied = Vec::with_capacity(batch.len());
    let mut attempts = Vec::new();
    for t in batch {
        let Some(row) = current.get_mut(&t.run_id) else {
            applied.push(false);
            continue;
        };
        let before = (row.state, row.attempt);
        if !t.apply_to(row) {
            applied.push(false);
            continue;
        }
        if !original.contains_key(&t.run_id) {
            original.insert(t.run_id.clone(), before);
            order.push(t.run_id.clone());
        }
        if let Some(change) = &t.attempt {
            attempts.push((t.run_id.as_str(), change, t.at));
        }
        applied.push(true);
    }
    let finals = order
        .into_iter()
        .map(|id| {
            let (s, a) = original[&id];
            let row = current[&id].clone();
            (id, s, a, row)
        })
        .collect();
    Planned { applied, finals, attempts }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: RunState, attempt: u32) -> RunRow {
        RunRow { state, attempt, reason: None, next_attempt_at: None, updated_at: 0, cancel_requested: true }
    }

    fn t(id: &str, from: RunState, fa: u32, to: RunState, ta: u32) -> Transition {
        Transition {
            run_id: id.into(),
            from,
            from_attempt: fa,
            to,
            to_attempt: ta,
            reason: None,
            next_attempt_at: None,
            attempt: None,
            at: 7,
            notify: Vec::new(),
        }
    }

    #[test]
    fn plan_chains_transitions_and_rejects_wrong_state() {
        let mut locked = HashMap::new();
        locked.insert("r1".to_string(), row(RunState::Assigned, 1));
        locked.insert("r2".to_string(), row(RunState::Pending, 0));
        let batch = vec![
            t("r1", RunState::Assigned, 1, RunState::Running, 1),
            t("r1", RunState::Running, 1, RunState::Succeeded, 1),
            t("r2", RunState::Running, 1, RunState::Succeeded, 1),
            t("missing", RunState::Pending, 0, RunState::Assigned, 1),
            t("r1", RunState::Running, 1, RunState::Failed, 1),
        ];
        let plan = plan_transitions(locked, &batch);
        assert_eq!(plan.applied, vec![true, true, false, false, false]);
        assert_eq!(plan.finals.len(), 1);
        let (id, from, from_attempt, fin) = &plan.finals[0];
        assert_eq!((id.as_str(), *from, *from_attempt), ("r1", RunState::Assigned, 1));
        assert_eq!(fin.state, RunState::Succeeded);
        assert!(!fin.cancel_requested, "a terminal run's cancel request is cleared");
        assert_eq!(fin.updated_at, 7);
    }
}
