//! The turn's backfill step: each running backfill due a chunk creates the
//! runs of its next instants (see [`Backfills`], the component, for the
//! rules), and its progress is written with the turn.

use gnomon_backend::BackfillProgress;

use super::*;
use gnomon_engine::plan::BackfillStep;

impl LeaderRuntime {
    /// Reads the running backfills (new ones, cancelled ones).
    pub(super) async fn load_backfills(&mut self) -> Result<()> {
        let list = self.store.running_backfills().await?;
        // A waiting run may have expected an instant of one that is gone.
        let gone = self.engine.cache.backfills.load(list, self.engine.now);
        self.engine.cache.runs.reconsider_waiting_on(&gone);
        Ok(())
    }

    /// A backfill's chunk is written (`fired`, its runs' outcomes) and its
    /// progress applied or refused (`advanced`; `counted` is the progress
    /// with the chunk counted, as the store recorded it). When the store
    /// refused it (the backfill was cancelled, or an earlier write whose
    /// outcome was unknown did land), the store's copy is taken instead: a
    /// backfill that still runs stays (waiting runs may expect its
    /// instants), one that ended leaves, and the waiting runs on its job
    /// are decided again.
    pub(super) async fn apply_backfill_step(
        &mut self,
        step: BackfillStep,
        fired: Vec<FireOutcome>,
        advanced: bool,
        counted: BackfillProgress,
    ) -> Result<()> {
        let BackfillStep { mut record, mut runs, roots, next_at, .. } = step;
        let now = self.engine.now;
        let mut fired = fired;
        let dep_fired = fired.split_off(roots.min(fired.len()));
        self.engine.track_dependency_runs(runs.split_off(roots.min(runs.len())), dep_fired, now);
        for (run, outcome) in runs.into_iter().zip(fired) {
            if outcome == FireOutcome::Created {
                metrics::counter!("gnomon_runs_total", "state" => "pending").increment(1);
                self.engine.track_pending(run, now);
            }
        }
        if counted.done.is_some() {
            tracing::info!(backfill = %record.id, job = %record.job, created = counted.created, kept = counted.kept, "backfill done");
        }
        if advanced && record.advance(&counted) {
            if record.state != gnomon_backend::BackfillState::Running {
                self.engine.cache.runs.reconsider_waiting_on(&HashSet::from_iter([record.job_uid.clone()]));
            }
            self.engine.cache.backfills.advanced(record, next_at);
            return Ok(());
        }
        match self.store.get_backfill(&record.id).await? {
            Some(fresh) if fresh.state == gnomon_backend::BackfillState::Running => self.engine.cache.backfills.advanced(fresh, next_at),
            _ => {
                self.engine.cache.backfills.remove(&record.id);
                self.engine.cache.runs.reconsider_waiting_on(&HashSet::from_iter([record.job_uid.clone()]));
            }
        }
        Ok(())
    }
}
