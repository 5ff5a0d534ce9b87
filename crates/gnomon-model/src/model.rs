//! The model: [`AttemptModel`], checked with a [`Config`], and what its
//! [`Action`]s may do in each state (the transitions are in `transition.rs`,
//! the effects they share in `effects.rs`).

use stateright::{Model, Property};

use crate::state::*;

mod action;
mod config;
mod effects;
mod transition;

#[cfg(test)]
mod tests;

pub use action::Action;
pub use config::{Config, StepRule};

/// The model of gnomon's attempt protocol.
#[derive(Clone, Debug)]
pub struct AttemptModel {
    /// Its bounds and rules.
    pub cfg: Config,
}

/// The runs of the configuration, as indices.
fn runs(cfg: &Config) -> impl Iterator<Item = usize> {
    0..cfg.due.len()
}

/// Whether `worker` may speak for the run's live attempt: it holds it, or
/// the attempt waits for its worker (`RunBook::may_report`).
fn may_report(l: &Leader, run: usize, worker: u8) -> bool {
    match l.runs[run].holder {
        Holder::Held(h) => h == worker,
        Holder::Orphan { .. } => true,
        Holder::None => false,
    }
}

impl AttemptModel {
    /// Whether the worker's fence has lapsed: no heartbeat acked for
    /// `self_fence_after` ticks.
    pub fn lapsed(&self, s: &State, w: usize) -> bool {
        s.workers[w].ack_age >= self.cfg.self_fence_after
    }

    /// Whether the worker runs an attempt of `run` that it would keep
    /// running: it is up, its fence holds, and the attempt executes within
    /// its timeout.
    pub fn live_on_worker(&self, s: &State, w: usize, run: usize) -> bool {
        let wk = &s.workers[w];
        let Some(slot) = wk.slot else { return false };
        let Phase::Executing(age) = slot.phase else { return false };
        wk.status == Status::Up && usize::from(slot.run) == run && !self.lapsed(s, w) && age < self.cfg.timeout
    }

    /// Nothing is left that a property could judge: every instant has its
    /// run and every run ended, no worker holds or is sent anything, and no
    /// deposed leader has a write on its way.
    fn quiescent(&self, s: &State) -> bool {
        s.deposed.is_none()
            && runs(&self.cfg).all(|r| s.store.runs[r].is_some_and(|run| run.state.is_terminal()))
            && s.workers.iter().all(|w| w.slot.is_none() && w.inbox.is_none())
    }

    /// The state as the checker keeps it (its symmetry representative).
    fn canon(&self, s: State) -> State {
        if self.cfg.symmetry {
            s.representative()
        } else {
            s
        }
    }
}

impl Model for AttemptModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let lease_left = Some(self.cfg.lease + 1);
        let worker = Worker { status: Status::Up, connected: true, ack_age: 0, max_token: 1, inbox: None, slot: None };
        let leader = Leader { token: 1, age: 0, leases: [lease_left; WORKERS], runs: [LeaderRun::default(); MAX_RUNS] };
        vec![State {
            clock: 0,
            store: Store { fence: 1, runs: [None; MAX_RUNS], created: [0; MAX_RUNS], stale_landed: false, ended_early: false },
            leader: Some(leader),
            deposed: None,
            workers: [worker; WORKERS],
            db: JobDb::default(),
            faults: 0,
            seen: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if self.quiescent(s) {
            return;
        }
        actions.extend([Action::Tick, Action::Elect, Action::Crash, Action::Rebuild, Action::DeposedStops]);
        for r in runs(&self.cfg) {
            let run = r as u8;
            actions.push(Action::Fire(run));
            for worker in 0..WORKERS as u8 {
                actions.push(Action::Assign { run, worker });
            }
            actions.extend([
                Action::Retry(run),
                Action::ExpireOrphan(run),
                Action::Overrun(run),
                Action::StaleFire(run),
                Action::StaleEnd(run),
                Action::TxTimeout(run),
            ]);
        }
        for w in 0..WORKERS as u8 {
            actions.extend([
                Action::ExpireLease(w),
                Action::Receive(w),
                Action::Hello(w),
                Action::Disconnect(w),
                Action::Pause(w),
                Action::Resume(w),
                Action::Kill(w),
                Action::SelfFence(w),
                Action::HandleAbort(w),
                Action::Finish(w, Outcome::Succeeded),
                Action::Finish(w, Outcome::Failed),
                Action::Finish(w, Outcome::TimedOut),
                Action::Report(w),
                Action::Commit(w),
                Action::PauseInTx(w),
                Action::TxCommit(w),
            ]);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        self.step(last, action).filter(|next| next != last).map(|s| self.canon(s))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        crate::properties::all()
    }
}
