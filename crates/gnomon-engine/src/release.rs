//! Deciding waiting dependency runs: once every upstream run of its
//! instant that may decide it has ended (or will never come), a waiting
//! run becomes `pending` or is recorded `skipped`, by a compare-and-swap
//! from `waiting`, so it is released at most once whichever leader decides.
//!
//! A decision rests only on committed facts: the runs the [`RunBook`]
//! holds open, the ends it mirrored, the store's copy of the others, and
//! whether the [`JobTimeline`](crate::timeline::JobTimeline) (or a running backfill) will still give an
//! upstream a run at the instant.
//! Ended runs never change, so a run released on them stays right; a run
//! not decided yet is decided again when one of its candidates ends, when
//! a job changes, and after every rebuild.

use gnomon_records::upstream_candidates;

use gnomon_core::deps::{decide, edge_state, EdgeState, Release, UpstreamRun};

use crate::plan::TurnPlan;
use crate::runbook::RunBook;
use crate::runbook::RunId;
use crate::Engine;
use crate::HashMap;
use gnomon_core::policy::decide_overlap;
use gnomon_core::policy::OverlapDecision;
use gnomon_core::Millis;
use gnomon_core::RunState;
use gnomon_records::Transition;

/// What the store holds of upstream runs the run book does not know:
/// read before planning, so deciding reads nothing. An id absent here was
/// not asked for; `None` means the store has no such run.
pub type UpstreamReads = HashMap<String, Option<RunState>>;

impl Engine {
    /// Decides the waiting runs gathered, from committed facts and the
    /// reads made for them: each released or skipped goes into the plan.
    pub fn plan_releases<A>(&mut self, ids: Vec<RunId>, reads: &UpstreamReads, now: Millis, plan: &mut TurnPlan<A>) {
        for id in ids {
            let Some(run) = self.cache.runs.get(&id) else { continue };
            let Some(after) = run.after.clone() else { continue };
            let (at, uid) = (run.scheduled_at, run.key.uid.clone());
            let edges: Vec<(String, EdgeState)> = after
                .edges
                .iter()
                .zip(upstream_candidates(&after, at))
                .map(|(edge, candidates)| (edge.job.clone(), self.edge_at(&edge.job, &edge.uid, edge.on, at, &candidates, reads)))
                .collect();
            let (to, reason) = match decide(&edges) {
                Release::Wait(_) => continue,
                Release::Skip(reason) => (RunState::Skipped, Some(reason)),
                Release::Run => self.overlap_at_release(&uid, at),
            };
            plan.releases.push(Transition {
                run_id: id.to_string(),
                from: RunState::Waiting,
                from_attempt: 0,
                to,
                to_attempt: 0,
                reason,
                next_attempt_at: None,
                attempt: None,
                at: now,
                notify: Vec::new(),
            });
        }
    }

    /// One edge at the instant `at`, from its candidate runs: open here
    /// (then it waits), ended, or as the store holds it (`reads`); and, if
    /// the upstream's timeline will still make one, expected.
    pub fn edge_at(
        &self,
        job: &str,
        uid: &str,
        on: gnomon_core::deps::On,
        at: Millis,
        candidates: &[String],
        reads: &UpstreamReads,
    ) -> EdgeState {
        let mut runs = Vec::new();
        for c in candidates {
            match self.cache.runs.known_upstream(c) {
                Some(UpstreamRun::Open) => return EdgeState::Waiting,
                Some(known) => runs.push(known),
                None => match reads.get(c.as_str()) {
                    Some(Some(state)) if state.is_terminal() => runs.push(UpstreamRun::Ended(*state)),
                    Some(Some(_)) => runs.push(UpstreamRun::Open),
                    Some(None) => {}
                    // Not read (the gather saw it known): it waits for the
                    // next decision rather than guess.
                    None => return EdgeState::Waiting,
                },
            }
        }
        if self.cache.jobs.expects(uid, at) || self.backfill_will_make(uid, at) {
            runs.push(UpstreamRun::Expected);
        } else if runs.is_empty() {
            runs.push(UpstreamRun::Absent);
        }
        edge_state(job, on, &runs)
    }

    /// What a run whose upstreams all accepted becomes under its job's
    /// overlap policy (a waiting run occupied nothing; it counts from now).
    pub fn overlap_at_release(&mut self, uid: &str, at: Millis) -> (RunState, Option<String>) {
        let Some(entry) = self.cache.jobs.get(uid) else { return (RunState::Pending, None) };
        let (open, waiting, _) = self.cache.runs.job_counts(uid);
        match decide_overlap(entry.overlap, open, waiting) {
            OverlapDecision::Fire => (RunState::Pending, None),
            OverlapDecision::FireAndCancelOpen => {
                self.cache.runs.replace_later([(uid.to_string(), at)]);
                (RunState::Pending, Some(RunBook::REPLACING_REASON.into()))
            }
            OverlapDecision::Skip(reason) => (RunState::Skipped, Some(reason)),
        }
    }
}
