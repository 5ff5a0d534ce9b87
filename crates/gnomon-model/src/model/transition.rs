//! The transition function: what each [`Action`] does to a state, or
//! `None` where it is not enabled.

use super::{may_report, runs, Action, AttemptModel};
use crate::state::*;

impl AttemptModel {
    /// Spends one fault of the budget, if one is left.
    fn fault(&self, s: &mut State) -> bool {
        if s.faults >= self.cfg.faults {
            return false;
        }
        s.faults += 1;
        true
    }

    /// The clock moves one tick, unless something must happen first.
    fn tick(&self, s: &mut State) -> Option<()> {
        let cfg = &self.cfg;
        // A leader fires what is due before time goes on.
        if s.leader.is_some() && runs(cfg).any(|r| cfg.due[r] <= s.clock && s.store.runs[r].is_none()) {
            return None;
        }
        // An up worker handles what reached it on its stream (an assignment
        // it has a slot for, an abort) before time goes on: the stream is in
        // order, so before the next heartbeat's ack.
        let unread = s
            .workers
            .iter()
            .any(|wk| wk.status == Status::Up && (wk.slot.is_some_and(|sl| sl.aborted) || (wk.inbox.is_some() && wk.slot.is_none())));
        if unread {
            return None;
        }
        let last_due = cfg.due.iter().copied().max().unwrap_or(0);
        s.clock = (s.clock + 1).min(last_due + 1);
        let overdue = cfg.timeout + 1;
        for run in s.store.runs.iter_mut().flatten() {
            if let Some(a) = run.current_mut() {
                if a.state.is_live() {
                    a.age = (a.age + 1).min(overdue);
                }
            }
        }
        if let Some(l) = s.leader.as_mut() {
            l.age = (l.age + 1).min(cfg.lease + 1);
            for lr in l.runs.iter_mut() {
                if let Holder::Orphan { left } = &mut lr.holder {
                    *left = left.saturating_sub(1);
                }
                if let Some(b) = &mut lr.began_age {
                    *b = (*b + 1).min(overdue);
                }
            }
            for left in l.leases.iter_mut().flatten() {
                *left = left.saturating_sub(1);
            }
        }
        for w in 0..WORKERS {
            let wk = &mut s.workers[w];
            wk.ack_age = (wk.ack_age + 1).min(cfg.self_fence_after);
            if let Some(Slot { phase: Phase::Executing(age), .. }) = wk.slot.as_mut() {
                *age = (*age + 1).min(cfg.timeout);
            }
            // The executor of an up worker stops an attempt at its timeout
            // (one inside its step transaction right after it).
            let timed_out =
                wk.status == Status::Up && wk.slot.is_some_and(|sl| sl.phase == Phase::Executing(cfg.timeout) && sl.step != Step::InTx);
            // Heartbeats are periodic: an up worker with a stream and a
            // session to the leader is acked every tick.
            if let Some(l) = s.leader.as_mut() {
                if wk.status == Status::Up && wk.connected && l.leases[w].is_some() {
                    l.leases[w] = Some(cfg.lease + 1);
                    wk.ack_age = 0;
                }
            }
            if self.lapsed(s, w) {
                Self::trouble(s, w);
                // The watchdog of an up worker fences it as its fence
                // lapses (a frozen one's runs only once it resumes).
                if s.workers[w].status == Status::Up {
                    Self::self_fence(s, w);
                }
            }
            if timed_out && s.workers[w].slot.is_some_and(|sl| matches!(sl.phase, Phase::Executing(_))) {
                s.workers[w].slot.as_mut().expect("the slot").phase = Phase::Done(Outcome::TimedOut);
                if s.workers[w].connected {
                    let _ = self.report(s, w);
                }
            }
        }
        Some(())
    }

    /// What `action` does to `last`: the next state, or `None` where it is
    /// not enabled.
    pub(super) fn step(&self, last: &State, action: Action) -> Option<State> {
        let cfg = &self.cfg;
        let mut s = *last;
        match action {
            Action::Tick => self.tick(&mut s)?,
            Action::Elect => {
                if s.store.fence >= cfg.terms {
                    return None;
                }
                if let Some(l) = s.leader {
                    s.deposed = Some(l.token);
                }
                s.store.fence += 1;
                s.leader = Some(self.rebuild(&s, s.store.fence, 0, [None; WORKERS]));
                for wk in s.workers.iter_mut() {
                    wk.connected = false;
                }
            }
            Action::Crash => {
                if s.leader.is_none() || s.store.fence >= cfg.terms || !self.fault(&mut s) {
                    return None;
                }
                s.leader = None;
                for wk in s.workers.iter_mut() {
                    wk.connected = false;
                }
            }
            Action::Rebuild => {
                let l = s.leader?;
                if !cfg.rebuilds || !self.fault(&mut s) {
                    return None;
                }
                s.leader = Some(self.rebuild(&s, l.token, l.age, l.leases));
            }
            Action::Fire(i) => {
                let i = usize::from(i);
                let l = s.leader?;
                if cfg.due[i] > s.clock {
                    return None;
                }
                // Insert-or-ignore on the instant's key: a second fire writes
                // nothing.
                if s.store.runs[i].is_none() {
                    if !self.write(&mut s, l.token) {
                        return None;
                    }
                    s.store.runs[i] = Some(Run { state: RunState::Pending, attempt: 0, attempts: [None; MAX_ATTEMPTS as usize] });
                    s.store.created[i] = (s.store.created[i] + 1).min(2);
                }
            }
            Action::Assign { run, worker } => {
                let (r, w) = (usize::from(run), usize::from(worker));
                let l = s.leader?;
                let st = s.store.runs[r]?;
                let busy = l.runs.iter().any(|lr| lr.holder == Holder::Held(worker));
                if st.state != RunState::Pending
                    || l.leases[w].is_none()
                    || !s.workers[w].connected
                    || busy
                    || s.workers[w].inbox.is_some()
                    || !self.write(&mut s, l.token)
                {
                    return None;
                }
                let n = st.attempt + 1;
                let rec = s.store.runs[r].as_mut().expect("the run");
                rec.attempts[usize::from(n - 1)] =
                    Some(Attempt { worker, token: l.token, started: false, age: 0, state: AttemptState::Assigned, healthy: false });
                rec.state = RunState::Assigned;
                rec.attempt = n;
                s.leader.as_mut().expect("the leader").runs[r] = LeaderRun { holder: Holder::Held(worker), began_age: None };
                s.workers[w].inbox = Some(Assignment { run, attempt: n, token: l.token });
                // An up worker takes it at once; a frozen one when it resumes.
                if s.workers[w].status == Status::Up && s.workers[w].slot.is_none() {
                    self.receive(&mut s, w);
                }
            }
            Action::Retry(run) => {
                let r = usize::from(run);
                let l = s.leader?;
                if s.store.runs[r]?.state != RunState::Retrying || !self.write(&mut s, l.token) {
                    return None;
                }
                s.store.runs[r].as_mut().expect("the run").state = RunState::Pending;
            }
            Action::ExpireLease(worker) => {
                let w = usize::from(worker);
                let l = s.leader?;
                if l.leases[w] != Some(0) {
                    return None;
                }
                s.leader.as_mut().expect("the leader").leases[w] = None;
                s.workers[w].connected = false;
                for r in runs(cfg) {
                    if l.runs[r].holder == Holder::Held(worker) {
                        self.end_attempt(&mut s, r, AttemptState::Lost, l.token, true);
                    }
                }
            }
            Action::ExpireOrphan(run) => {
                let r = usize::from(run);
                let l = s.leader?;
                if l.runs[r].holder != (Holder::Orphan { left: 0 }) || !self.end_attempt(&mut s, r, AttemptState::Lost, l.token, true) {
                    return None;
                }
            }
            Action::Overrun(run) => {
                let r = usize::from(run);
                let l = s.leader?;
                let Holder::Held(w) = l.runs[r].holder else { return None };
                let st = s.store.runs[r]?;
                let age = l.runs[r].began_age.unwrap_or(st.current()?.age);
                if age <= cfg.timeout || !self.end_attempt(&mut s, r, AttemptState::TimedOut, l.token, true) {
                    return None;
                }
                s.seen |= seen::OVERRUN;
                Self::abort(&mut s, usize::from(w), r, st.attempt);
            }
            Action::StaleFire(i) => {
                let i = usize::from(i);
                let token = s.deposed?;
                if cfg.due[i] > s.clock {
                    return None;
                }
                s.deposed = None;
                if s.store.runs[i].is_some() {
                    // Refused by the instant's key, whatever the token.
                } else if !self.write(&mut s, token) {
                    s.seen |= seen::STALE_REFUSED;
                } else {
                    s.store.runs[i] = Some(Run { state: RunState::Pending, attempt: 0, attempts: [None; MAX_ATTEMPTS as usize] });
                    s.store.created[i] = (s.store.created[i] + 1).min(2);
                }
            }
            Action::StaleEnd(run) => {
                let r = usize::from(run);
                let token = s.deposed?;
                if !s.store.runs[r]?.state.is_live() {
                    return None;
                }
                s.deposed = None;
                if !self.end_attempt(&mut s, r, AttemptState::Lost, token, true) {
                    s.seen |= seen::STALE_REFUSED;
                }
            }
            Action::DeposedStops => {
                s.deposed?;
                s.deposed = None;
            }
            Action::Receive(worker) => {
                let w = usize::from(worker);
                let wk = s.workers[w];
                if wk.inbox.is_none() || wk.status != Status::Up || wk.slot.is_some() {
                    return None;
                }
                self.receive(&mut s, w);
            }
            Action::Hello(worker) => {
                let w = usize::from(worker);
                let wk = s.workers[w];
                let l = s.leader?;
                if wk.status != Status::Up || wk.connected {
                    return None;
                }
                // What was on the old stream is gone.
                s.workers[w].inbox = None;
                s.workers[w].max_token = wk.max_token.max(l.token);
                let listed = wk.slot.filter(|sl| matches!(sl.phase, Phase::Executing(_)));
                let lm = s.leader.as_mut().expect("the leader");
                // Attempts it held and no longer lists: their report may
                // still be spooled; one lease for it to arrive.
                for r in runs(cfg) {
                    let unlisted = listed.is_none_or(|sl| usize::from(sl.run) != r);
                    if lm.runs[r].holder == Holder::Held(worker) && unlisted {
                        lm.runs[r].holder = Holder::Orphan { left: cfg.lease + 1 };
                    }
                    // So do the orphans the store says it holds (ended
                    // while it was away): a lease for their spooled reports.
                    let stored = s.store.runs[r].and_then(|run| run.current().map(|a| a.worker));
                    if let Holder::Orphan { left } = &mut lm.runs[r].holder {
                        if stored == Some(worker) && unlisted {
                            *left = (*left).max(cfg.lease + 1);
                        }
                    }
                }
                if let Some(sl) = listed {
                    let r = usize::from(sl.run);
                    let current = s.store.runs[r].is_some_and(|run| run.state.is_live() && run.attempt == sl.attempt);
                    if current && may_report(lm, r, worker) {
                        lm.runs[r].holder = Holder::Held(worker);
                    } else {
                        Self::drop_slot(&mut s, w);
                    }
                }
                s.leader.as_mut().expect("the leader").leases[w] = Some(cfg.lease + 1);
                let wk = &mut s.workers[w];
                wk.connected = true;
                wk.ack_age = 0;
                // The spool is sent again after the `Welcome`.
                if wk.slot.is_some_and(|sl| matches!(sl.phase, Phase::Done(_))) {
                    self.report(&mut s, w)?;
                }
            }
            Action::Disconnect(worker) => {
                let w = usize::from(worker);
                if !s.workers[w].connected || !self.fault(&mut s) {
                    return None;
                }
                s.workers[w].connected = false;
                Self::trouble(&mut s, w);
            }
            Action::Pause(worker) => {
                let w = usize::from(worker);
                if s.workers[w].status != Status::Up || !self.fault(&mut s) {
                    return None;
                }
                s.workers[w].status = Status::Paused;
                Self::trouble(&mut s, w);
            }
            Action::Resume(worker) => {
                let w = usize::from(worker);
                if s.workers[w].status != Status::Paused {
                    return None;
                }
                s.workers[w].status = Status::Up;
            }
            Action::Kill(worker) => {
                let w = usize::from(worker);
                if s.workers[w].status == Status::Killed || !self.fault(&mut s) {
                    return None;
                }
                Self::drop_slot(&mut s, w);
                Self::trouble(&mut s, w);
                let wk = &mut s.workers[w];
                wk.status = Status::Killed;
                wk.inbox = None;
                wk.connected = false;
            }
            Action::SelfFence(worker) => {
                let w = usize::from(worker);
                if s.workers[w].status != Status::Up || !self.lapsed(&s, w) {
                    return None;
                }
                Self::self_fence(&mut s, w);
            }
            Action::HandleAbort(worker) => {
                let w = usize::from(worker);
                let wk = s.workers[w];
                if wk.status != Status::Up || !wk.slot?.aborted {
                    return None;
                }
                Self::drop_slot(&mut s, w);
            }
            Action::Finish(worker, outcome) => {
                let w = usize::from(worker);
                let wk = s.workers[w];
                let slot = wk.slot?;
                let Phase::Executing(age) = slot.phase else { return None };
                let allowed = match outcome {
                    Outcome::Succeeded => slot.step == Step::Done,
                    Outcome::Failed => slot.step != Step::InTx,
                    // A frozen worker's executor stops it once it resumes.
                    Outcome::TimedOut => slot.step != Step::InTx && age >= cfg.timeout,
                    Outcome::Lost => false,
                };
                if wk.status != Status::Up || !allowed {
                    return None;
                }
                s.workers[w].slot.as_mut().expect("the slot").phase = Phase::Done(outcome);
                if wk.connected {
                    self.report(&mut s, w)?;
                }
            }
            Action::Report(worker) => {
                let w = usize::from(worker);
                let wk = s.workers[w];
                if wk.status != Status::Up || !wk.connected {
                    return None;
                }
                self.report(&mut s, w)?;
            }
            Action::Commit(worker) | Action::PauseInTx(worker) => {
                let w = usize::from(worker);
                let wk = s.workers[w];
                let slot = wk.slot?;
                let r = usize::from(slot.run);
                if wk.status != Status::Up
                    || !matches!(slot.phase, Phase::Executing(_))
                    || !matches!(slot.step, Step::NotYet | Step::Aborted)
                    || s.db.lock[r].is_some()
                {
                    return None;
                }
                if matches!(action, Action::Commit(_)) {
                    self.commit_step(&mut s, w);
                } else {
                    if !self.fault(&mut s) {
                        return None;
                    }
                    s.db.lock[r] = Some(worker);
                    s.workers[w].slot.as_mut().expect("the slot").step = Step::InTx;
                    s.workers[w].status = Status::Paused;
                    Self::trouble(&mut s, w);
                }
            }
            Action::TxCommit(worker) => {
                let w = usize::from(worker);
                let wk = s.workers[w];
                let slot = wk.slot?;
                if wk.status != Status::Up || slot.step != Step::InTx {
                    return None;
                }
                s.db.lock[usize::from(slot.run)] = None;
                self.commit_step(&mut s, w);
            }
            Action::TxTimeout(run) => {
                let r = usize::from(run);
                let holder = usize::from(s.db.lock[r]?);
                if s.workers[holder].status != Status::Paused {
                    return None;
                }
                s.db.lock[r] = None;
                s.workers[holder].slot.as_mut().expect("a lock holder holds an attempt").step = Step::Aborted;
            }
        }
        Some(s)
    }
}
