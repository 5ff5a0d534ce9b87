//! [`TurnPlan`]: everything one turn decided, kept by the part that
//! decided it, and the turn's one fenced store write that carries it all
//! ([`LeaderRuntime::write_plan`]). Only what that write committed is
//! applied to the components; then replies and messages go out.
//!
//! Invariants (checked by `tests/leader/turn.rs` and the simulation):
//! - a turn makes at most one store write, and none when it decided nothing;
//! - planning reads nothing from the store: what a plan needs is read
//!   before it (`gather`), and every decision rests on committed state;
//! - a write that fails, or whose outcome is unknown, applies nothing: the
//!   components are rebuilt from the store, the worker reports go back to
//!   the inbox, and every ask is answered with the error.

use gnomon_backend::TurnBatch;

use super::asks::PlannedAsk;

/// What one turn writes, its asks the leader's.
pub(super) type TurnPlan = gnomon_engine::plan::TurnPlan<PlannedAsk>;
use super::*;

/// The parts' items, one after another, and where each part ends.
fn join<T>(parts: Vec<Vec<T>>) -> (Vec<T>, Vec<usize>) {
    let lens = parts.iter().map(Vec::len).collect();
    (parts.into_iter().flatten().collect(), lens)
}

/// [`join`] undone: the parts back, `lens` long each, in order (the last
/// ones short where `all` is).
fn split<T>(all: Vec<T>, lens: &[usize]) -> Vec<Vec<T>> {
    let mut items = all.into_iter();
    lens.iter().map(|n| items.by_ref().take(*n).collect()).collect()
}

impl LeaderRuntime {
    /// The turn's one fenced write, then the committed outcome applied to
    /// the components, then the replies and messages.
    pub(super) async fn write_plan(&mut self, mut plan: TurnPlan, now: Millis) -> Result<()> {
        if plan.writes_nothing() {
            // Refused reports are still answered (or their worker would
            // keep them spooled and send them forever).
            if !plan.events.acks.is_empty() {
                self.finish_events(std::mem::take(&mut plan.events), Vec::new()).await?;
            }
            self.send_aborts(plan.aborts);
            self.send_cancels(plan.cancel_sends);
            return Ok(());
        }
        // Stamp the fire and the assignments when the write begins, not when
        // the turn began (so a run's fired_at never follows its assigned_at).
        let stamp = self.engine.now;
        let mut fire = plan.fire.take();
        let mut run_parts = Vec::with_capacity(1 + plan.asks.len() + plan.backfills.len());
        let mut advances = Vec::new();
        match fire.as_mut() {
            Some(f) => {
                f.stamp = stamp;
                for run in &mut f.new_runs {
                    run.fired_at = stamp;
                }
                run_parts.push(std::mem::take(&mut f.new_runs));
                advances = std::mem::take(&mut f.advances);
            }
            None => run_parts.push(Vec::new()),
        }
        let mut new_backfills = Vec::new();
        for ask in &mut plan.asks {
            match ask {
                PlannedAsk::Trigger { runs, .. } => run_parts.push(std::mem::take(runs)),
                PlannedAsk::Backfill { new, .. } => {
                    run_parts.push(Vec::new());
                    new_backfills.push(new.clone());
                }
            }
        }
        let mut progress = Vec::with_capacity(plan.backfills.len());
        let mut backfill_runs = Vec::with_capacity(plan.backfills.len());
        let mut offset: usize = run_parts.iter().map(Vec::len).sum();
        for step in &mut plan.backfills {
            backfill_runs.push(offset..offset + step.roots);
            offset += step.runs.len();
            run_parts.push(std::mem::take(&mut step.runs));
            progress.push(step.progress.clone());
        }
        for t in &mut plan.dispatch.batch {
            t.at = stamp;
        }
        let (runs, run_lens) = join(run_parts);
        let (mut transitions, t_lens) = join(vec![
            std::mem::take(&mut plan.ends),
            std::mem::take(&mut plan.cancels),
            std::mem::take(&mut plan.retries),
            std::mem::take(&mut plan.releases),
            std::mem::take(&mut plan.events.batch),
            std::mem::take(&mut plan.dispatch.dropped),
            std::mem::take(&mut plan.dispatch.batch),
        ]);
        notify::attach_notifications(&self.engine.cache.runs, &self.engine.cache.jobs, &mut transitions);
        let new_backfill_count = new_backfills.len();
        let batch = TurnBatch { runs, advances, transitions, backfills: progress, backfill_runs, new_backfills, at: stamp };
        let began = std::time::Instant::now();
        let result = self.store.write_turn(&self.engine.fence, &batch).await;
        metrics::histogram!("gnomon_store_turn_write_seconds").record(began.elapsed().as_secs_f64());
        self.stats.wrote(batch.rows(), began);
        let counted = result.as_ref().map(|w| batch.counted_progress(&w.fired)).unwrap_or_default();
        let TurnBatch { runs, transitions, .. } = batch;
        let mut run_parts = split(runs, &run_lens).into_iter();
        if let Some(f) = fire.as_mut() {
            f.new_runs = run_parts.next().unwrap_or_default();
        } else {
            run_parts.next();
        }
        for ask in &mut plan.asks {
            if let PlannedAsk::Trigger { runs, .. } = ask {
                *runs = run_parts.next().unwrap_or_default();
            } else {
                run_parts.next();
            }
        }
        for step in &mut plan.backfills {
            step.runs = run_parts.next().unwrap_or_default();
        }
        let mut t_parts = split(transitions, &t_lens).into_iter();
        let mut next = || t_parts.next().unwrap_or_default();
        let (ends, cancels, retries, releases) = (next(), next(), next(), next());
        plan.events.batch = next();
        plan.dispatch.dropped = next();
        plan.dispatch.batch = next();
        // Any error: the outcome is unknown (all, some or none of it may
        // have landed). The caller rebuilds the cache from the store; the
        // results stay in the inbox to be written again (a result already
        // written is then acked as recorded), and every ask hears the error.
        let wrote = match result.and_then(|w| w.applied.map(|a| (w.fired, a, w.advanced, w.created))) {
            Ok(w) => w,
            Err(e) => {
                self.engine.requeue_events(std::mem::take(&mut plan.events));
                self.fail_asks(plan.asks, &e);
                return Err(e);
            }
        };
        let (fired, applied, advanced, created) = wrote;
        // A store that answers for fewer (or more) rows than were written
        // has answered something else: the outcome is unknown, as after an
        // error (nothing is applied; the cache is rebuilt from the store).
        let asked = (run_lens.iter().sum::<usize>(), t_lens.iter().sum::<usize>(), plan.backfills.len(), new_backfill_count);
        let answered = (fired.len(), applied.len(), advanced.len(), created.len());
        if asked != answered {
            let e = StoreError::Backend(format!(
                "the turn write answered (runs, transitions, backfills, new backfills) = {answered:?} for {asked:?}"
            ));
            self.engine.requeue_events(std::mem::take(&mut plan.events));
            self.fail_asks(plan.asks, &e);
            return Err(e);
        }
        let mut fired = split(fired, &run_lens).into_iter();
        let fire_outcomes = fired.next().unwrap_or_default();
        let mut applied = split(applied, &t_lens).into_iter();
        let mut next = || applied.next().unwrap_or_default();
        let (ends_ok, cancels_ok, retries_ok, releases_ok, events_ok, dropped_ok, assigned_ok) =
            (next(), next(), next(), next(), next(), next(), next());
        // The asks first: their callers hear what was made.
        let mut first_error = None;
        let mut created = created.into_iter();
        for ask in plan.asks {
            let made = matches!(ask, PlannedAsk::Backfill { .. }).then(|| created.next().unwrap_or(false));
            if let Err(e) = self.apply_ask(ask, fired.next().unwrap_or_default(), made, stamp) {
                first_error.get_or_insert(e);
            }
        }
        self.settle(&ends, ends_ok).await?;
        self.send_aborts(plan.aborts);
        self.settle(&cancels, cancels_ok).await?;
        self.send_cancels(std::mem::take(&mut plan.cancel_sends));
        self.settle(&retries, retries_ok).await?;
        self.settle(&releases, releases_ok).await?;
        let events = std::mem::take(&mut plan.events);
        self.finish_events(events, events_ok).await?;
        let dispatch = std::mem::take(&mut plan.dispatch);
        self.settle(&dispatch.dropped, dropped_ok).await?;
        self.finish_dispatch(dispatch, assigned_ok, now).await?;
        for ((step, ok), counted) in plan.backfills.into_iter().zip(advanced).zip(counted) {
            self.apply_backfill_step(step, fired.next().unwrap_or_default(), ok, counted).await?;
        }
        if let Some(f) = fire {
            self.finish_fire(f, fire_outcomes)?;
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Mirrors the transitions that applied; reloads the runs of those that
    /// did not (someone else moved them).
    pub(super) async fn settle(&mut self, batch: &[Transition], applied: Vec<bool>) -> Result<()> {
        let mut moved: HashMap<&'static str, u64> = HashMap::default();
        for (t, ok) in batch.iter().zip(applied) {
            if ok {
                *moved.entry(t.to.as_str()).or_default() += 1;
                self.engine.mirror_state(t);
            } else {
                self.reload_run(&t.run_id).await?;
            }
        }
        for (state, n) in moved {
            metrics::counter!("gnomon_runs_total", "state" => state).increment(n);
        }
        Ok(())
    }

    /// Tells workers to drop attempts the leader ended (should their
    /// assignment still turn up).
    fn send_aborts(&mut self, aborts: Vec<(String, String, u32, String)>) {
        for (worker, run_id, attempt, reason) in aborts {
            self.send_to(&worker, server_message::Msg::Abort(v1::Abort { run_id, attempt, token: self.engine.fence.token, reason }));
        }
    }

    /// Tells workers to cancel the live attempts a newer run replaced.
    fn send_cancels(&mut self, cancels: Vec<(String, u32)>) {
        for (run, attempt) in cancels {
            self.send_cancel(&run, attempt);
        }
    }

    /// The turn's write failed: every ask it carried hears the error.
    fn fail_asks(&mut self, asks: Vec<PlannedAsk>, e: &StoreError) {
        for ask in asks {
            match ask {
                PlannedAsk::Trigger { pending, .. } => {
                    let _ = pending.reply.send(Err(e.clone().into()));
                }
                PlannedAsk::Backfill { reply, .. } => {
                    let _ = reply.send(Err(e.clone().into()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_gives_back_the_parts_join_made() {
        let parts = vec![vec![1, 2], vec![], vec![3], vec![4, 5, 6]];
        let (all, lens) = join(parts.clone());
        assert_eq!(all, [1, 2, 3, 4, 5, 6]);
        assert_eq!(split(all, &lens), parts);
        // Outcomes as long as the parts split the same way; shorter ones
        // leave the last parts short, never misplaced.
        assert_eq!(split(vec![true; 6], &lens), vec![vec![true; 2], vec![], vec![true], vec![true; 3]]);
        assert_eq!(split(vec![1, 2, 3], &lens), vec![vec![1, 2], vec![], vec![3], vec![]]);
    }
}
