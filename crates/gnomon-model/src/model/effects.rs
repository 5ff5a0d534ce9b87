//! What several actions do alike: a fenced write reaching the store, an
//! attempt ended, an abort sent, the leader's cache rebuilt, an assignment
//! taken, a report recorded, a step committed, and a worker's trouble,
//! self-fencing and dropped attempt.

use super::{may_report, runs, AttemptModel, StepRule};
use crate::state::*;

impl AttemptModel {
    /// A write with `token` reaches the store: whether it lands (every
    /// landed write is judged by the token it carried).
    pub(super) fn write(&self, s: &mut State, token: u8) -> bool {
        if self.cfg.store_checks_tokens && token != s.store.fence {
            return false;
        }
        if token < s.store.fence {
            s.store.stale_landed = true;
        }
        true
    }

    /// Clears the `healthy` ghost of the live attempts assigned to `w`.
    pub(super) fn trouble(s: &mut State, w: usize) {
        for run in s.store.runs.iter_mut().flatten() {
            if let Some(a) = run.current_mut() {
                if usize::from(a.worker) == w && a.state.is_live() {
                    a.healthy = false;
                }
            }
        }
    }

    /// Self-fencing: the worker kills its executing attempt (an open step
    /// transaction is aborted) and spools it `lost`.
    pub(super) fn self_fence(s: &mut State, w: usize) {
        let Some(slot) = s.workers[w].slot else { return };
        if !matches!(slot.phase, Phase::Executing(_)) {
            return;
        }
        if slot.step == Step::InTx {
            s.db.lock[usize::from(slot.run)] = None;
        }
        let sl = s.workers[w].slot.as_mut().expect("the slot");
        sl.phase = Phase::Done(Outcome::Lost);
        if sl.step == Step::InTx {
            sl.step = Step::NotYet;
        }
    }

    /// The worker drops its attempt; an open step transaction is aborted
    /// (its connection is gone).
    pub(super) fn drop_slot(s: &mut State, w: usize) {
        if let Some(slot) = s.workers[w].slot.take() {
            if slot.step == Step::InTx {
                s.db.lock[usize::from(slot.run)] = None;
            }
        }
    }

    /// Ends the run's current attempt with `state` in a write with `token`
    /// (the caller checked that the attempt is live). `by_leader`: the
    /// leader decided it (lease, orphan, overrun), not a report.
    pub(super) fn end_attempt(&self, s: &mut State, run: usize, state: AttemptState, token: u8, by_leader: bool) -> bool {
        if !self.write(s, token) {
            return false;
        }
        let timeout = self.cfg.timeout;
        let r = s.store.runs[run].as_mut().expect("a live run");
        let n = r.attempt;
        let a = r.current_mut().expect("a live attempt");
        let early = a.healthy && a.started && a.age <= timeout;
        if by_leader && matches!(state, AttemptState::Lost | AttemptState::TimedOut) && early {
            s.store.ended_early = true;
        }
        a.state = state;
        r.state = match state {
            AttemptState::Succeeded => RunState::Succeeded,
            _ if n < MAX_ATTEMPTS => RunState::Retrying,
            _ => RunState::Failed,
        };
        if let Some(l) = s.leader.as_mut() {
            l.runs[run] = LeaderRun::default();
        }
        true
    }

    /// The leader tells the worker to stop an attempt (delivered in order
    /// on the worker's stream, if it has one).
    pub(super) fn abort(s: &mut State, w: usize, run: usize, attempt: u8) {
        let wk = &mut s.workers[w];
        if !wk.connected {
            return;
        }
        match (wk.slot.as_mut(), wk.inbox) {
            (Some(slot), _) if usize::from(slot.run) == run && slot.attempt == attempt => slot.aborted = true,
            (_, Some(a)) if usize::from(a.run) == run && a.attempt == attempt => wk.inbox = None,
            _ => {}
        }
        // An up worker handles it at once; a frozen one once it resumes.
        let wk = s.workers[w];
        if wk.status == Status::Up && wk.slot.is_some_and(|sl| sl.aborted) {
            Self::drop_slot(s, w);
        }
    }

    /// The leader's cache rebuilt from the store (`recover`): a live
    /// attempt whose worker has a session here is held by it; any other
    /// waits for its worker until a lease after the term began.
    pub(super) fn rebuild(&self, s: &State, token: u8, age: u8, leases: [Option<u8>; WORKERS]) -> Leader {
        let mut cache = [LeaderRun::default(); MAX_RUNS];
        for r in runs(&self.cfg) {
            let Some(run) = s.store.runs[r] else { continue };
            if !run.state.is_live() {
                continue;
            }
            let a = run.current().expect("a live attempt");
            let held_here = leases[usize::from(a.worker)].is_some();
            let holder = if held_here { Holder::Held(a.worker) } else { Holder::Orphan { left: (self.cfg.lease + 1).saturating_sub(age) } };
            // The defect: the start is forgotten. An orphan counts from the
            // epoch (overdue), one held here from the rebuild.
            let began_age = self.cfg.rebuild_forgets_start.then_some(if held_here { 0 } else { self.cfg.timeout + 1 });
            cache[r] = LeaderRun { holder, began_age };
        }
        Leader { token, age, leases, runs: cache }
    }

    /// The worker takes the assignment sent to it and starts it, or drops it.
    pub(super) fn receive(&self, s: &mut State, w: usize) {
        let wk = s.workers[w];
        let Some(a) = wk.inbox else { return };
        s.workers[w].inbox = None;
        // Stale tokens are ignored; while the fence has lapsed an
        // assignment is dropped, not started.
        if a.token < wk.max_token || self.lapsed(s, w) {
            return;
        }
        let r = usize::from(a.run);
        s.workers[w].max_token = a.token;
        s.workers[w].slot =
            Some(Slot { run: a.run, attempt: a.attempt, token: a.token, phase: Phase::Executing(0), step: Step::NotYet, aborted: false });
        // The attempt registers its fence in the job's database.
        if self.cfg.step_rule == StepRule::Record {
            s.db.newest[r] = s.db.newest[r].max((a.attempt, a.token));
        }
        // The leader records the start from the attempt's holder (a start
        // sent on a cut stream is not recorded: the store's attempt keeps
        // counting from its assignment).
        if let (Some(l), true) = (s.leader, wk.connected) {
            let accepted = s.store.runs[r]
                .is_some_and(|run| run.state == RunState::Assigned && run.attempt == a.attempt && may_report(&l, r, w as u8));
            if accepted && self.write(s, l.token) {
                let run = s.store.runs[r].as_mut().expect("the run");
                run.state = RunState::Running;
                let at = run.current_mut().expect("the attempt");
                at.state = AttemptState::Running;
                at.started = true;
                at.age = 0;
                at.healthy = true;
            }
        }
    }

    /// The worker's spooled report reaches the leader, which records it if
    /// it is of the run's current attempt from its holder (a stale report
    /// changes nothing) and acks it. `None`: the write did not land and the
    /// report stays spooled.
    pub(super) fn report(&self, s: &mut State, w: usize) -> Option<()> {
        let slot = s.workers[w].slot?;
        let Phase::Done(outcome) = slot.phase else { return None };
        let l = s.leader?;
        let r = usize::from(slot.run);
        let current = s.store.runs[r].filter(|run| run.state.is_live() && run.attempt == slot.attempt && may_report(&l, r, w as u8));
        if let Some(run) = current {
            let assigned_by = run.current().expect("the attempt").token;
            if !self.end_attempt(s, r, outcome.attempt_state(), l.token, false) {
                return None;
            }
            if outcome == Outcome::Succeeded && assigned_by < l.token {
                s.seen |= seen::SUCCEEDED_AFTER_RECLAIM;
            }
        }
        s.workers[w].slot = None;
        Some(())
    }

    /// The job's database judges a step commit by the worker's attempt
    /// (under the run's row lock).
    pub(super) fn commit_step(&self, s: &mut State, w: usize) {
        let slot = s.workers[w].slot.expect("the slot");
        let r = usize::from(slot.run);
        let step = match self.cfg.step_rule {
            StepRule::Record => match s.db.record[r] {
                Some(_) => Step::Done,
                None if (slot.attempt, slot.token) < s.db.newest[r] => Step::Refused,
                None => {
                    s.db.record[r] = Some(slot.attempt);
                    s.db.newest[r] = s.db.newest[r].max((slot.attempt, slot.token));
                    s.db.commits[r] = (s.db.commits[r] + 1).min(2);
                    Step::Done
                }
            },
            StepRule::LaterAttemptOnly => match s.db.row[r] {
                Some((a, t)) if a > slot.attempt || t > slot.token => Step::Refused,
                _ => {
                    s.db.row[r] = Some((slot.attempt, slot.token));
                    s.db.commits[r] = (s.db.commits[r] + 1).min(2);
                    Step::Done
                }
            },
        };
        s.workers[w].slot.as_mut().expect("the slot").step = step;
    }
}
