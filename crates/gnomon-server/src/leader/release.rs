//! Gathering what deciding waiting dependency runs needs from the store
//! (the engine decides them: `gnomon_engine::release`).
use super::*;
use gnomon_core::deps::UpstreamRun;

/// The most waiting runs one turn decides; the rest are decided in the
/// turns after (a job change that touches many waiting runs is bounded
/// work per turn).
const MAX_RELEASE_BATCH: usize = 512;

pub(super) use gnomon_engine::release::UpstreamReads;

impl LeaderRuntime {
    /// The waiting runs to decide this turn (at most a batch), and what
    /// deciding them needs from the store: the state of each candidate
    /// upstream run that the run book neither holds open nor saw end.
    pub(super) async fn gather_releases(&mut self) -> Result<(Vec<RunId>, UpstreamReads)> {
        let ids = self.engine.cache.runs.take_undecided(MAX_RELEASE_BATCH);
        let mut needs: Vec<String> = Vec::new();
        for id in &ids {
            let Some(run) = self.engine.cache.runs.get(id) else { continue };
            let Some(after) = run.after.clone() else { continue };
            for candidates in upstream_candidates(&after, run.scheduled_at) {
                // An open candidate decides the edge (it waits) unread.
                if candidates.iter().any(|c| matches!(self.engine.cache.runs.known_upstream(c), Some(UpstreamRun::Open))) {
                    continue;
                }
                needs.extend(candidates.into_iter().filter(|c| self.engine.cache.runs.known_upstream(c).is_none()));
            }
        }
        needs.sort_unstable();
        needs.dedup();
        let mut reads = UpstreamReads::default();
        for c in needs {
            let state = self.store.get_run(&c).await?.map(|d| d.run.state);
            reads.insert(c, state);
        }
        Ok((ids, reads))
    }
}
