//! The transitions: [`AttemptModel`] and its [`Action`]s.

use stateright::{Model, Property};

use crate::state::*;

/// The rule the job's database applies to a step commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepRule {
    /// The step-record rule: the first attempt to commit a (run, step)
    /// record wins; any other attempt, older or newer, finds the record,
    /// writes nothing and takes the recorded result; an attempt older than
    /// the run's newest started attempt may not commit a step that has no
    /// record.
    Record,
    /// The old guard rule: refused only when a later attempt (or a higher
    /// token) has already written through the guard; no step record.
    LaterAttemptOnly,
}

/// The bounds and the rules the model is checked with.
#[derive(Clone, Debug)]
pub struct Config {
    /// The scheduled instants, one run each: the tick each is due (the
    /// first should be 0).
    pub due: Vec<u8>,
    /// Leadership terms (tokens `1..=terms`); term 1 leads from the start.
    pub terms: u8,
    /// A worker session's lease, in ticks: the leader ends a session when a
    /// full lease has passed since its last heartbeat (`lease_until < now`),
    /// and a new term's orphans wait as long from the term's start.
    pub lease: u8,
    /// Ticks without an acknowledged heartbeat after which a worker's fence
    /// has lapsed (`self_fence_fraction` × the lease, rounded up). The
    /// protocol needs it at most the lease; a larger one is a defect.
    pub self_fence_after: u8,
    /// The job's timeout, in ticks, counted from an attempt's start.
    pub timeout: u8,
    /// The leader may rebuild its cache from the store within a term (a
    /// store error), keeping each worker's session; each rebuild spends a
    /// fault.
    pub rebuilds: bool,
    /// The defect: a rebuild forgets when live attempts began (an orphan
    /// counts from the epoch, so it is overdue at once; an attempt whose
    /// worker has a session here counts from the rebuild), as `recover`
    /// did when it loaded them with `assigned_at = 0`.
    pub rebuild_forgets_start: bool,
    /// The rule of the job's database for step commits.
    pub step_rule: StepRule,
    /// The store refuses a leader write whose token is not the current fence.
    pub store_checks_tokens: bool,
    /// Faults a behaviour may have: a worker paused (also inside its step
    /// transaction), killed or cut off, a leader crash, a store error (a
    /// rebuild). New terms are bounded by `terms` alone.
    pub faults: u8,
    /// Explore one state per pair of states that differ only by the
    /// workers' names.
    pub symmetry: bool,
}

impl Config {
    /// The fixed protocol at the default bound: one instant, two workers,
    /// two terms, two attempts, a lease of 2 ticks, a fence lapsing after 2
    /// ticks without an ack, a timeout of 3 ticks, one fault.
    pub fn fixed() -> Self {
        Config {
            due: vec![0],
            terms: 2,
            lease: 2,
            self_fence_after: 2,
            timeout: 3,
            rebuilds: true,
            rebuild_forgets_start: false,
            step_rule: StepRule::Record,
            store_checks_tokens: true,
            faults: 1,
            symmetry: true,
        }
    }

    /// The model.
    pub fn model(self) -> AttemptModel {
        assert!(!self.due.is_empty() && self.due.len() <= MAX_RUNS, "1 to {MAX_RUNS} instants");
        assert!(self.terms >= 1 && self.lease >= 1 && self.timeout >= 1);
        assert!(self.self_fence_after >= 1);
        AttemptModel { cfg: self }
    }
}

/// What can happen. Workers and runs are named by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The clock moves one tick; every up worker with a stream and a
    /// session to the leader heartbeats and is acked (its lease renewed).
    Tick,
    /// A new term: token + 1, fenced in the store; the leader rebuilds its
    /// cache from the store; a leader still up is deposed (a write of it
    /// may still be on its way); every worker's stream is cut.
    Elect,
    /// The leader's process dies (a new term follows).
    Crash,
    /// The leader rebuilds its cache from the store (a store error),
    /// keeping each worker's session.
    Rebuild,
    /// The leader fires an instant: creates its run, keyed by the instant
    /// (a second fire is refused).
    Fire(u8),
    /// The leader assigns a pending run's next attempt to a worker (a
    /// fenced write, then the `Assign` message).
    Assign {
        /// The run.
        run: u8,
        /// The worker.
        worker: u8,
    },
    /// The leader moves a retrying run back to pending.
    Retry(u8),
    /// The leader ends a session whose lease ran out: its attempts are lost.
    ExpireLease(u8),
    /// The leader ends an orphan past its deadline: lost.
    ExpireOrphan(u8),
    /// The leader's backstop ends an attempt past its timeout: timed out,
    /// and its worker is told to stop it.
    Overrun(u8),
    /// The deposed leader's write creating a run arrives at the store.
    StaleFire(u8),
    /// The deposed leader's write ending a run's attempt lost arrives.
    StaleEnd(u8),
    /// The deposed leader notices and stops.
    DeposedStops,
    /// A worker takes the assignment sent to it and starts it, registering
    /// its fence in the job's database (or drops it: a stale token, a
    /// lapsed fence).
    Receive(u8),
    /// A worker (re)connects to the current leader: its `Hello` lists the
    /// attempt it runs, which it reclaims or is told is superseded.
    Hello(u8),
    /// A worker's stream is cut (a fault).
    Disconnect(u8),
    /// A worker freezes (a fault).
    Pause(u8),
    /// A frozen worker runs again.
    Resume(u8),
    /// A worker's process dies with its attempt (a fault).
    Kill(u8),
    /// A worker whose fence lapsed kills its attempt and spools it `lost`.
    SelfFence(u8),
    /// A worker handles an `Abort`: stops the attempt, does not report it.
    HandleAbort(u8),
    /// A worker's attempt ends; the report is sent on the worker's stream
    /// to the leader, or spooled while it has none.
    Finish(u8, Outcome),
    /// A worker's spooled report reaches the leader, which records it or
    /// refuses it as stale; the report is acked.
    Report(u8),
    /// A worker's attempt commits its step in one transaction (the run's
    /// row lock taken and released).
    Commit(u8),
    /// A worker's attempt opens its step transaction, takes the run's row
    /// lock and freezes inside it (a fault).
    PauseInTx(u8),
    /// A resumed worker's attempt commits the transaction it held.
    TxCommit(u8),
    /// The database's idle-in-transaction timeout aborts the transaction
    /// of a frozen holder of the run's row lock.
    TxTimeout(u8),
}

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

    /// A write with `token` reaches the store: whether it lands (every
    /// landed write is judged by the token it carried).
    fn write(&self, s: &mut State, token: u8) -> bool {
        if self.cfg.store_checks_tokens && token != s.store.fence {
            return false;
        }
        if token < s.store.fence {
            s.store.stale_landed = true;
        }
        true
    }

    /// Spends one fault of the budget, if one is left.
    fn fault(&self, s: &mut State) -> bool {
        if s.faults >= self.cfg.faults {
            return false;
        }
        s.faults += 1;
        true
    }

    /// The state as the checker keeps it (its symmetry representative).
    fn canon(&self, s: State) -> State {
        if self.cfg.symmetry {
            s.representative()
        } else {
            s
        }
    }

    /// Clears the `healthy` ghost of the live attempts assigned to `w`.
    fn trouble(s: &mut State, w: usize) {
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
    fn self_fence(s: &mut State, w: usize) {
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
    fn drop_slot(s: &mut State, w: usize) {
        if let Some(slot) = s.workers[w].slot.take() {
            if slot.step == Step::InTx {
                s.db.lock[usize::from(slot.run)] = None;
            }
        }
    }

    /// Ends the run's current attempt with `state` in a write with `token`
    /// (the caller checked that the attempt is live). `by_leader`: the
    /// leader decided it (lease, orphan, overrun), not a report.
    fn end_attempt(&self, s: &mut State, run: usize, state: AttemptState, token: u8, by_leader: bool) -> bool {
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
    fn abort(s: &mut State, w: usize, run: usize, attempt: u8) {
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
    fn rebuild(&self, s: &State, token: u8, age: u8, leases: [Option<u8>; WORKERS]) -> Leader {
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
    fn receive(&self, s: &mut State, w: usize) {
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
    fn report(&self, s: &mut State, w: usize) -> Option<()> {
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
    fn commit_step(&self, s: &mut State, w: usize) {
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

    fn step(&self, last: &State, action: Action) -> Option<State> {
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
                    if lm.runs[r].holder == Holder::Held(worker) && listed.is_none_or(|sl| usize::from(sl.run) != r) {
                        lm.runs[r].holder = Holder::Orphan { left: cfg.lease + 1 };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> AttemptModel {
        Config { symmetry: false, ..Config::fixed() }.model()
    }

    /// Plays the actions from the initial state; each must change it.
    fn play(m: &AttemptModel, actions: &[Action]) -> State {
        let mut s = m.init_states()[0];
        for a in actions {
            s = m.next_state(&s, *a).unwrap_or_else(|| panic!("{a:?} is enabled in {s:?}"));
        }
        s
    }

    #[test]
    fn a_second_fire_of_an_instant_writes_nothing() {
        let m = model();
        let s = play(&m, &[Action::Fire(0)]);
        assert_eq!(s.store.created[0], 1);
        assert_eq!(m.next_state(&s, Action::Fire(0)), None, "refused by the instant's key");
    }

    #[test]
    fn a_stale_report_changes_nothing_and_is_acked() {
        let m = model();
        // w0 succeeds while cut off; its lease runs out first, so the
        // attempt is lost; the spooled report arrives after its Hello.
        let s = play(
            &m,
            &[
                Action::Fire(0),
                Action::Assign { run: 0, worker: 0 },
                Action::Disconnect(0),
                Action::Commit(0),
                Action::Finish(0, Outcome::Succeeded),
                Action::Tick,
                Action::Tick,
                Action::Tick,
                Action::ExpireLease(0),
            ],
        );
        let run = s.store.runs[0].expect("the run");
        assert_eq!((run.state, run.current().expect("a1").state), (RunState::Retrying, AttemptState::Lost));
        let s = m.next_state(&s, Action::Hello(0)).expect("Hello");
        let after = s.store.runs[0].expect("the run");
        assert_eq!(after, run, "the stale report changed nothing");
        assert_eq!(s.workers[0].slot, None, "and was acked");
    }

    #[test]
    fn a_frozen_workers_assignment_waits_and_is_dropped_once_its_fence_lapsed() {
        let m = model();
        let s = play(&m, &[Action::Fire(0), Action::Pause(0), Action::Assign { run: 0, worker: 0 }, Action::Tick, Action::Tick]);
        assert!(s.workers[0].inbox.is_some(), "the assignment waits");
        let s = play(
            &m,
            &[Action::Fire(0), Action::Pause(0), Action::Assign { run: 0, worker: 0 }, Action::Tick, Action::Tick, Action::Resume(0)],
        );
        let s = m.next_state(&s, Action::Receive(0)).expect("taken");
        assert_eq!((s.workers[0].inbox, s.workers[0].slot), (None, None), "dropped, not started");
    }

    #[test]
    fn the_database_ends_a_frozen_holders_transaction_and_the_retry_commits() {
        let m = model();
        let s = play(
            &m,
            &[
                Action::Fire(0),
                Action::Assign { run: 0, worker: 0 },
                Action::PauseInTx(0),
                Action::Tick,
                Action::Tick,
                Action::Tick,
                Action::ExpireLease(0),
                Action::Retry(0),
                Action::Assign { run: 0, worker: 1 },
            ],
        );
        assert_eq!(s.db.lock[0], Some(0), "the frozen holder keeps the row");
        assert_eq!(m.next_state(&s, Action::Commit(1)), None, "the retry waits for the row");
        let s = play(
            &m,
            &[
                Action::Fire(0),
                Action::Assign { run: 0, worker: 0 },
                Action::PauseInTx(0),
                Action::Tick,
                Action::Tick,
                Action::Tick,
                Action::ExpireLease(0),
                Action::Retry(0),
                Action::Assign { run: 0, worker: 1 },
                Action::TxTimeout(0),
                Action::Commit(1),
                Action::Resume(0),
            ],
        );
        assert_eq!(s.db.record[0], Some(2));
        // The resumed attempt 1 finds its transaction gone; trying again, it
        // takes attempt 2's result and writes nothing.
        let s = m.next_state(&s, Action::Commit(0)).expect("tries again");
        assert_eq!((s.db.commits[0], s.workers[0].slot.map(|sl| sl.step)), (1, Some(Step::Done)));
    }
}
