//! Deciding waiting dependency runs: once every upstream run of its
//! instant that may decide it has ended (or will never come), a waiting
//! run becomes `pending` or is recorded `skipped`, by a compare-and-swap
//! from `waiting`, so it is released at most once whichever leader decides.
//!
//! A decision rests only on committed facts: the runs the [`RunBook`]
//! holds open, the ends it mirrored, the store's copy of the others, and
//! whether the [`JobTimeline`] (or a running backfill) will still give an
//! upstream a run at the instant.
//! Ended runs never change, so a run released on them stays right; a run
//! not decided yet is decided again when one of its candidates ends, when
//! a job changes, and after every rebuild.

use gnomon_core::deps::{decide, edge_state, EdgeState, Release, UpstreamRun};

use super::*;

/// The most waiting runs one turn decides; the rest are decided in the
/// turns after (a job change that touches many waiting runs is bounded
/// work per turn).
const MAX_RELEASE_BATCH: usize = 512;

impl LeaderRuntime {
    /// Decides the waiting runs marked undecided, and writes the releases
    /// and skips in one batch.
    pub(super) async fn release_waiting(&mut self, now: Millis) -> Result<()> {
        let ids = self.cache.runs.take_undecided(MAX_RELEASE_BATCH);
        let mut batch = Vec::new();
        for id in ids {
            let Some(run) = self.cache.runs.get(&id) else { continue };
            let Some(after) = run.after.clone() else { continue };
            let (at, uid) = (run.scheduled_at, run.key.uid.clone());
            let mut edges = Vec::with_capacity(after.edges.len());
            for (edge, candidates) in after.edges.iter().zip(upstream_candidates(&after, at)) {
                let state = self.edge_at(&edge.job, &edge.uid, edge.on, at, &candidates).await?;
                edges.push((edge.job.clone(), state));
            }
            let (to, reason) = match decide(&edges) {
                Release::Wait(_) => continue,
                Release::Skip(reason) => (RunState::Skipped, Some(reason)),
                Release::Run => self.overlap_at_release(&uid, at),
            };
            batch.push(Transition {
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
        self.apply(batch).await
    }

    /// One edge at the instant `at`, from its candidate runs: open here
    /// (then it waits, without asking the store), ended, or read from the
    /// store; and, if the upstream's timeline will still make one, expected.
    async fn edge_at(&self, job: &str, uid: &str, on: gnomon_core::deps::On, at: Millis, candidates: &[String]) -> Result<EdgeState> {
        let mut runs = Vec::new();
        let mut unknown = Vec::new();
        for c in candidates {
            match self.cache.runs.known_upstream(c) {
                Some(UpstreamRun::Open) => return Ok(EdgeState::Waiting),
                Some(known) => runs.push(known),
                None => unknown.push(c),
            }
        }
        for c in unknown {
            match self.store.get_run(c).await? {
                Some(d) if d.run.state.is_terminal() => runs.push(UpstreamRun::Ended(d.run.state)),
                Some(_) => runs.push(UpstreamRun::Open),
                None => {}
            }
        }
        if self.cache.jobs.expects(uid, at) || self.backfill_will_make(uid, at) {
            runs.push(UpstreamRun::Expected);
        } else if runs.is_empty() {
            runs.push(UpstreamRun::Absent);
        }
        Ok(edge_state(job, on, &runs))
    }

    /// What a run whose upstreams all accepted becomes under its job's
    /// overlap policy (a waiting run occupied nothing; it counts from now).
    fn overlap_at_release(&mut self, uid: &str, at: Millis) -> (RunState, Option<String>) {
        let Some(entry) = self.cache.jobs.get(uid) else { return (RunState::Pending, None) };
        let (open, waiting, _) = self.cache.runs.job_counts(uid);
        match decide_overlap(entry.overlap, open, waiting) {
            OverlapDecision::Fire => (RunState::Pending, None),
            OverlapDecision::FireAndCancelOpen => {
                self.cache.runs.replace_later([(uid.to_string(), at)]);
                (RunState::Pending, Some("overlap: replaced the previous run".into()))
            }
            OverlapDecision::Skip(reason) => (RunState::Skipped, Some(reason)),
        }
    }
}
