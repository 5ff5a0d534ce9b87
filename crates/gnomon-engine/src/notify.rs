//! Which notifications a transition raises. They ride in the transition's
//! own store write (written only if it applies), so an outcome and the
//! notifications it raises are committed together or not at all; the
//! deliverer (`gnomon_server::notifier`) sends them.

use crate::runbook::RunBook;
use crate::timeline::JobTimeline;
use gnomon_core::RunState;
use gnomon_records::AttemptChange;
use gnomon_records::Transition;
use std::sync::Arc;

use gnomon_core::notify::{notification_id, NotifyOn, NotifyTarget};
use gnomon_records::NewNotification;

/// One notify target of a job, as the leader keeps it.
#[derive(Debug)]
pub struct Target {
    on: Vec<NotifyOn>,
    late_after_ms: i64,
    /// The target as stored with each notification.
    json: Arc<str>,
}

/// A job's targets (`None` for the many jobs without any).
pub fn targets(spec: &[NotifyTarget]) -> Option<Box<[Target]>> {
    if spec.is_empty() {
        return None;
    }
    let t = spec
        .iter()
        .map(|t| Target {
            on: t.on.clone(),
            late_after_ms: t.settings().late_after_ms,
            json: serde_json::to_string(t).unwrap_or_default().into(),
        })
        .collect();
    Some(t)
}

/// Attaches to each transition of `batch` the notifications its outcome
/// raises: `failed` on a run that ends failed; `succeeded` and
/// `recovered` (the deliverer checks the previous run) on one that ends
/// succeeded; `late` on a run's first assignment past `late_after`.
pub fn attach_notifications(runs: &RunBook, jobs: &JobTimeline, batch: &mut [Transition]) {
    for t in batch.iter_mut() {
        let Some(run) = runs.get(t.run_id.as_str()) else { continue };
        let Some(targets) = jobs.get(&run.key.uid).and_then(|j| j.notify.as_ref()) else { continue };
        let first_assign = matches!(t.attempt, Some(AttemptChange::Assign { attempt: 1, .. }));
        for (i, target) in targets.iter().enumerate() {
            for &on in &target.on {
                let raised = match on {
                    NotifyOn::Failed => t.to == RunState::Failed,
                    NotifyOn::Succeeded | NotifyOn::Recovered => t.to == RunState::Succeeded,
                    NotifyOn::Late => first_assign && t.at - run.scheduled_at > target.late_after_ms,
                };
                if raised {
                    t.notify.push(NewNotification {
                        id: notification_id(&t.run_id, on, i),
                        run_id: t.run_id.clone(),
                        namespace: run.key.namespace.clone(),
                        job: run.key.name.clone(),
                        outcome: on.as_str().to_string(),
                        target: target.json.to_string(),
                        created_at: t.at,
                    });
                }
            }
        }
    }
}
