//! [`RunBook`]: the leader's copy of the open runs, with the queues and
//! indexes over them: by job, ready for dispatch, waiting to retry, whose
//! worker holds their live attempt, which live attempts wait for their
//! worker to reclaim them, which cancels were sent, and which waiting
//! dependency runs each upstream run's end may decide. It is part of the
//! cache, rebuilt from the store as a whole; it owns these maps so that a
//! run's entries come and go together.
//!
//! Invariants (checked by the tests below):
//! - every run named by the job index, a holder or an orphan is open here,
//!   and a run leaves them all when it leaves the book;
//! - a run is held by at most one worker, and an orphan has no holder
//!   entry of another worker's: reclaiming it makes the reclaimer the holder;
//! - a waiting run is named under each of its upstream candidates in the
//!   waiters index exactly while it waits, and it is marked to be decided
//!   again whenever one of them is created ended or ends;
//! - a namespace's tally counts the bytes of its open runs, and a keyed run
//!   that ended counts as kept (run and bytes) until its hold ends.
//!
//! The ready queue and the retry heap may name runs that have moved on
//! since; their readers skip those.

use crate::timeline::JobKey;
use crate::HashMap;
use crate::HashSet;
use gnomon_core::Millis;
use gnomon_core::RunState;
use gnomon_records::AttemptChange;
use gnomon_records::Transition;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

/// A run id, allocated once and shared by every index that names the run.
pub type RunId = Arc<str>;

/// What the leader keeps of an open run. Read anywhere in the leader;
/// changed only through [`RunBook`].
#[derive(Debug, Clone)]
pub struct OpenRun {
    pub key: Arc<JobKey>,
    pub scheduled_at: Millis,
    pub state: RunState,
    pub attempt: u32,
    pub ready_since: Millis,
    /// When its live attempt was assigned, as the store has it (heartbeat
    /// reconciliation and prefetch count from here).
    pub assigned_at: Millis,
    /// When its live attempt's timeout began: the later of its assignment
    /// and its start as its worker reported it. Restored from the store on
    /// a rebuild, never taken from the new term.
    pub began_at: Millis,
    /// The values of its params (a JSON object), as every attempt gets them.
    pub params: Option<Arc<str>>,
    /// The payload of the webhook call that started it.
    pub payload: Option<Arc<str>>,
    /// A dependency run's origin and edges.
    pub after: Option<Arc<gnomon_core::deps::RunAfter>>,
}

/// A live attempt whose worker has no session here.
#[derive(Debug, Clone)]
struct Orphan {
    /// When it can no longer be running: it is ended `lost` then.
    deadline: Millis,
    /// The worker the store says holds it, when known.
    worker: Option<String>,
}

/// The open runs and their indexes.
#[derive(Default)]
pub struct RunBook {
    runs: HashMap<RunId, OpenRun>,
    by_job: HashMap<String, HashSet<RunId>>,
    /// The pending runs, one queue per namespace (see [`FairQueue`]).
    ready: FairQueue,
    /// The open runs of each namespace, by state.
    tally: NsTally,
    retries: BinaryHeap<Reverse<(Millis, RunId)>>,
    /// Runs with a live attempt, and the worker holding it: the one record
    /// of an attempt's holder (a worker's slots are counted from it)…
    holders: HashMap<RunId, String>,
    /// …and its inverse, kept in step by the methods that change it.
    held: HashMap<String, HashSet<RunId>>,
    /// Whether a holding changed since the view last read it.
    holds_changed: bool,
    /// Live attempts whose worker has no session here, waiting for it to
    /// reclaim them (or for their lease to run out).
    orphans: HashMap<RunId, Orphan>,
    /// Cancels sent: (run, attempt).
    cancels_sent: HashSet<(String, u32)>,
    /// Upstream candidate run id → the waiting runs it may decide.
    waiters: HashMap<String, Vec<RunId>>,
    /// How candidates that ended while named in `waiters` ended.
    ended: HashMap<String, RunState>,
    /// Waiting runs to decide again (ordered, so a seed replays).
    undecided: std::collections::BTreeSet<RunId>,
    /// `replace` fires written whose older runs are still to be cancelled:
    /// (job uid, the new run's instant).
    replace_due: Vec<(String, Millis)>,
    /// Keyed runs that ended and are still held: (hold's end, namespace,
    /// bytes), the soonest first.
    kept: BinaryHeap<Reverse<(Millis, String, u64)>>,
}

impl OpenRun {
    /// Its params' and payload's bytes.
    pub fn bytes(&self) -> u64 {
        (self.params.as_ref().map_or(0, |p| p.len()) + self.payload.as_ref().map_or(0, |p| p.len())) as u64
    }
}

pub use gnomon_records::upstream_candidates;

pub use crate::fair::NsCounts;
use crate::fair::{FairQueue, NsTally};

impl RunBook {
    pub fn get(&self, id: &str) -> Option<&OpenRun> {
        self.runs.get(id)
    }

    pub fn contains(&self, id: &str) -> bool {
        self.runs.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.runs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shared id of an open run (a new one if the run is not open).
    pub fn rid(&self, id: &str) -> RunId {
        self.runs.get_key_value(id).map(|(k, _)| k.clone()).unwrap_or_else(|| Arc::from(id))
    }

    /// Adds an open run (replacing one of the same id).
    pub fn track(&mut self, id: RunId, run: OpenRun) {
        if let Some(old) = self.runs.get(&id) {
            self.tally.remove(&old.key.namespace, old.state);
            self.tally.bytes(&old.key.namespace, old.bytes(), false);
        }
        self.tally.add(&run.key.namespace, run.state);
        self.tally.bytes(&run.key.namespace, run.bytes(), true);
        self.by_job.entry(run.key.uid.clone()).or_default().insert(id.clone());
        if run.state == RunState::Waiting {
            if let Some(after) = &run.after {
                for c in upstream_candidates(after, run.scheduled_at).into_iter().flatten() {
                    let list = self.waiters.entry(c).or_default();
                    if !list.contains(&id) {
                        list.push(id.clone());
                    }
                }
            }
            self.undecided.insert(id.clone());
        }
        self.runs.insert(id, run);
    }

    /// Takes a run that stops waiting out of the waiters index.
    fn stop_waiting(&mut self, id: &str, run: &OpenRun) {
        let Some(after) = run.after.as_ref().filter(|_| run.state == RunState::Waiting) else { return };
        for c in upstream_candidates(after, run.scheduled_at).into_iter().flatten() {
            if let Some(list) = self.waiters.get_mut(&c) {
                list.retain(|w| &**w != id);
                if list.is_empty() {
                    self.waiters.remove(&c);
                    self.ended.remove(&c);
                }
            }
        }
        self.undecided.remove(id);
    }

    /// A run that may decide waiting runs ended (or was created ended, as
    /// a skip record): they are decided again, knowing how it ended.
    pub fn upstream_ended(&mut self, id: &str, state: Option<RunState>) {
        let Some(list) = self.waiters.get(id) else { return };
        self.undecided.extend(list.iter().cloned());
        if let Some(state) = state {
            self.ended.insert(id.to_string(), state);
        }
    }

    /// Every waiting run is decided again (the whole state was reloaded).
    #[cfg(test)]
    pub fn reconsider_all_waiting(&mut self) {
        let waiting: Vec<RunId> = self.runs.iter().filter(|(_, r)| r.state == RunState::Waiting).map(|(id, _)| id.clone()).collect();
        self.undecided.extend(waiting);
    }

    /// The waiting runs of the jobs `uids`, and those with an edge to one
    /// of them, are decided again (those jobs changed or went, or a
    /// backfill of theirs ended: an upstream may no longer be expected to
    /// run at an instant).
    pub fn reconsider_waiting_on(&mut self, uids: &HashSet<String>) {
        if uids.is_empty() {
            return;
        }
        let touched = |r: &OpenRun| {
            uids.contains(r.key.uid.as_str()) || r.after.as_ref().is_some_and(|a| a.edges.iter().any(|e| uids.contains(&e.uid)))
        };
        let waiting: Vec<RunId> =
            self.runs.iter().filter(|(_, r)| r.state == RunState::Waiting && touched(r)).map(|(id, _)| id.clone()).collect();
        self.undecided.extend(waiting);
    }

    /// Up to `limit` waiting runs to decide now, taken out (the rest stay
    /// marked for the next turn).
    pub fn take_undecided(&mut self, limit: usize) -> Vec<RunId> {
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(id) = self.undecided.pop_first() else { break };
            if self.runs.get(&id).is_some_and(|r| r.state == RunState::Waiting) {
                out.push(id);
            }
        }
        out
    }

    /// A stored run fired (or released) under `replace`, as its reason
    /// says: while it is open, the job's older open runs are to be
    /// cancelled. A rebuild finds them by this reason, so a cancel planned
    /// but not written is planned again.
    pub const REPLACING_REASON: &'static str = "overlap: replaced the previous run";

    /// The open runs of these jobs before these instants are to be
    /// cancelled (a `replace` run is fired or released).
    pub fn replace_later(&mut self, due: impl IntoIterator<Item = (String, Millis)>) {
        self.replace_due.extend(due);
    }

    /// The `replace` cancellations due, taken out.
    pub fn take_replace_due(&mut self) -> Vec<(String, Millis)> {
        std::mem::take(&mut self.replace_due)
    }

    /// Whether waiting runs are marked to be decided, or runs a newer
    /// run replaced are to be cancelled: work for the next turn.
    pub fn has_undecided(&self) -> bool {
        !self.undecided.is_empty() || !self.replace_due.is_empty()
    }

    /// What the leader knows of a candidate upstream run without the
    /// store: open here, or ended while a waiting run named it.
    pub fn known_upstream(&self, id: &str) -> Option<gnomon_core::deps::UpstreamRun> {
        use gnomon_core::deps::UpstreamRun;
        if self.runs.contains_key(id) {
            return Some(UpstreamRun::Open);
        }
        self.ended.get(id).map(|s| UpstreamRun::Ended(*s))
    }

    /// Removes a run and everything that names it; the worker whose slot
    /// it held, if one did.
    pub fn untrack(&mut self, id: &str) -> Option<String> {
        self.upstream_ended(id, None);
        if let Some(run) = self.runs.remove(id) {
            self.tally.remove(&run.key.namespace, run.state);
            self.tally.bytes(&run.key.namespace, run.bytes(), false);
            self.stop_waiting(id, &run);
            if let Some(set) = self.by_job.get_mut(run.key.uid.as_str()) {
                set.remove(id);
                if set.is_empty() {
                    self.by_job.remove(run.key.uid.as_str());
                }
            }
        }
        self.release(id)
    }

    /// Removes a run that ended (see [`Self::untrack`]): a keyed one is
    /// counted as kept, from its instant (at or after its fire), for as
    /// long as retention holds it.
    pub fn ended(&mut self, id: &str) -> Option<String> {
        if let Some(run) = self.runs.get(id).filter(|_| gnomon_records::is_keyed_run_id(id)) {
            let (ns, at, bytes) = (run.key.namespace.clone(), run.scheduled_at, run.bytes());
            self.keep(&ns, at, bytes);
        }
        self.untrack(id)
    }

    /// Counts a keyed run fired at `fired_at` that has ended as kept until
    /// its hold ends.
    pub fn keep(&mut self, namespace: &str, fired_at: Millis, bytes: u64) {
        self.tally.kept(namespace, bytes, true);
        self.kept.push(Reverse((fired_at.saturating_add(gnomon_records::KEYED_RUN_HOLD_MS), namespace.to_string(), bytes)));
    }

    /// Ends the holds that have run out by `now`; whether any did.
    pub fn release_kept(&mut self, now: Millis) -> bool {
        let mut any = false;
        while self.kept.peek().is_some_and(|Reverse((until, _, _))| *until <= now) {
            let Some(Reverse((_, ns, bytes))) = self.kept.pop() else { break };
            self.tally.kept(&ns, bytes, false);
            any = true;
        }
        any
    }

    /// Forgets which worker holds the run's attempt (and that it waited
    /// for one), freeing its slot; that worker, if one did.
    pub fn release(&mut self, id: &str) -> Option<String> {
        self.orphans.remove(id);
        let worker = self.holders.remove(id)?;
        self.unindex_hold(&worker, id);
        Some(worker)
    }

    fn unindex_hold(&mut self, worker: &str, id: &str) {
        if let Some(set) = self.held.get_mut(worker) {
            set.remove(id);
            if set.is_empty() {
                self.held.remove(worker);
            }
        }
        self.holds_changed = true;
    }

    /// How many live attempts `worker` holds: the slots they take.
    pub fn held_by(&self, worker: &str) -> usize {
        self.held.get(worker).map_or(0, HashSet::len)
    }

    /// The runs whose live attempt `worker` holds.
    pub fn runs_held_by(&self, worker: &str) -> Vec<RunId> {
        self.held.get(worker).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    /// Whether a holding changed since the last call.
    pub fn take_holds_changed(&mut self) -> bool {
        std::mem::take(&mut self.holds_changed)
    }

    /// Queues an open run for dispatch, behind the others of its namespace.
    pub fn queue(&mut self, id: RunId) {
        if let Some(run) = self.runs.get(&id) {
            self.ready.push_back(&run.key.namespace, id);
        }
    }

    /// The next run queued for dispatch: from the namespace with queued
    /// runs that holds the fewest active attempts (see [`FairQueue::pop`]),
    /// passing over the namespaces `skip` names.
    pub fn pop_ready(&mut self, skip: impl Fn(&str) -> bool) -> Option<RunId> {
        let tally = &self.tally;
        self.ready.pop(|ns| usize::try_from(tally.of(ns).active).unwrap_or(usize::MAX), skip)
    }

    /// Puts runs a dispatch pass passed over back at the front of their
    /// namespaces' queues, in order (a run no longer open is dropped).
    pub fn requeue_front(&mut self, ids: Vec<RunId>) {
        for id in ids.into_iter().rev() {
            if let Some(run) = self.runs.get(&id) {
                self.ready.push_front(&run.key.namespace, id);
            }
        }
    }

    /// How many namespaces have runs queued for dispatch.
    pub fn ready_namespaces(&self) -> usize {
        self.ready.namespaces()
    }

    /// The first queued runs of each namespace (a queue may name runs that
    /// have moved on).
    pub fn ready(&self) -> impl Iterator<Item = &RunId> {
        self.ready.fronts(64)
    }

    /// What namespace `ns` holds open.
    pub fn ns_counts(&self, ns: &str) -> NsCounts {
        self.tally.of(ns)
    }

    /// Every namespace with open runs, and what it holds.
    pub fn ns_tally(&self) -> impl Iterator<Item = (&str, &NsCounts)> {
        self.tally.iter()
    }

    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Schedules a retrying run's release to pending at `at`.
    pub fn schedule_retry(&mut self, at: Millis, id: RunId) {
        self.retries.push(Reverse((at, id)));
    }

    /// When the next retry is due.
    pub fn next_retry_at(&self) -> Option<Millis> {
        self.retries.peek().map(|Reverse((at, _))| *at)
    }

    /// The retrying runs due by `now`, taken off the heap.
    pub fn take_due_retries(&mut self, now: Millis) -> Vec<RunId> {
        let mut due = Vec::new();
        while let Some(Reverse((at, _))) = self.retries.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, id))) = self.retries.pop() else { break };
            if self.runs.get(&id).is_some_and(|r| r.state == RunState::Retrying) {
                due.push(id);
            }
        }
        due
    }

    /// Mirrors a transition the store applied. A terminal one removes the
    /// run, a retry releases its holder; either way the worker whose slot
    /// is freed is returned.
    pub fn mirror(&mut self, t: &Transition) -> Option<String> {
        if t.to.is_terminal() {
            self.upstream_ended(&t.run_id, Some(t.to));
            return self.ended(&t.run_id);
        }
        let id = self.rid(&t.run_id);
        if let Some(run) = self.runs.get(&id).filter(|r| r.state == RunState::Waiting).cloned() {
            self.stop_waiting(&id, &run);
        }
        let run = self.runs.get_mut(&id)?;
        self.tally.remove(&run.key.namespace, run.state);
        self.tally.add(&run.key.namespace, t.to);
        run.state = t.to;
        run.attempt = t.to_attempt;
        if let Some(AttemptChange::Start { .. }) = t.attempt {
            run.began_at = run.began_at.max(t.at);
        }
        match t.to {
            RunState::Pending => {
                run.ready_since = t.at;
                self.ready.push_back(&run.key.namespace, id);
                None
            }
            RunState::Retrying => {
                let released = self.release(&id);
                self.retries.push(Reverse((t.next_attempt_at.unwrap_or(t.at), id)));
                released
            }
            _ => None,
        }
    }

    /// The run's assignment is persisted.
    pub fn assigned(&mut self, id: &str, attempt: u32, at: Millis) -> Option<&OpenRun> {
        let run = self.runs.get_mut(id)?;
        self.tally.remove(&run.key.namespace, run.state);
        self.tally.add(&run.key.namespace, RunState::Assigned);
        run.state = RunState::Assigned;
        run.attempt = attempt;
        run.assigned_at = at;
        run.began_at = at;
        Some(run)
    }

    /// Restores when the run's live attempt was assigned and began, as the
    /// store has them.
    pub fn restore_attempt_times(&mut self, id: &str, assigned_at: Millis, began_at: Millis) {
        if let Some(r) = self.runs.get_mut(id) {
            r.assigned_at = assigned_at;
            r.began_at = began_at;
        }
    }

    /// The worker holding the run's live attempt.
    pub fn holder(&self, id: &str) -> Option<&String> {
        self.holders.get(id)
    }

    /// Makes `worker` the holder of the run's attempt (it is no orphan
    /// then); the previous holder, if another.
    pub fn hold(&mut self, id: RunId, worker: &str) -> Option<String> {
        self.orphans.remove(&id);
        let previous = self.holders.insert(id.clone(), worker.to_string());
        if let Some(p) = previous.as_deref().filter(|p| *p != worker) {
            self.unindex_hold(p, &id);
        }
        self.held.entry(worker.to_string()).or_default().insert(id);
        self.holds_changed = true;
        previous.filter(|w| w != worker)
    }

    /// The runs with a live attempt, and their holders.
    pub fn holders(&self) -> impl Iterator<Item = (&RunId, &String)> {
        self.holders.iter()
    }

    /// Whether `worker` may report on the run's attempt: it holds it, or the
    /// attempt waits for its worker.
    pub fn may_report(&self, id: &str, worker: &str) -> bool {
        self.holders.get(id).is_some_and(|w| w == worker)
            || self.orphans.get(id).is_some_and(|o| o.worker.as_deref().is_none_or(|w| w == worker))
    }

    /// The run's live attempt waits for its worker until `deadline`.
    pub fn orphan(&mut self, id: RunId, deadline: Millis, worker: Option<String>) {
        self.orphans.insert(id, Orphan { deadline, worker });
    }

    pub fn is_orphan(&self, id: &str) -> bool {
        self.orphans.contains_key(id)
    }

    /// A worker came back: its orphans that `listed` does not name (they
    /// ended while it was away, and their reports are still spooled) get
    /// until `until` at least for those reports to arrive.
    pub fn await_reports_of(&mut self, worker: &str, listed: impl Fn(&str) -> bool, until: Millis) {
        for (id, o) in self.orphans.iter_mut() {
            if o.worker.as_deref() == Some(worker) && !listed(id) {
                o.deadline = o.deadline.max(until);
            }
        }
    }

    /// Sets the deadline of every orphan of `worker`.
    pub fn set_orphan_deadlines(&mut self, worker: &str, deadline: Millis) {
        for o in self.orphans.values_mut().filter(|o| o.worker.as_deref() == Some(worker)) {
            o.deadline = deadline;
        }
    }

    /// The orphans past their deadline, no longer orphans or held; but
    /// those `reported` says a report has come for (from the orphan's
    /// worker, when known), which stay for that report.
    pub fn take_overdue_orphans(&mut self, now: Millis, reported: impl Fn(&str, Option<&str>) -> bool) -> Vec<(RunId, Option<String>)> {
        let overdue: Vec<RunId> = self
            .orphans
            .iter()
            .filter(|(id, o)| o.deadline < now && !reported(id, o.worker.as_deref()))
            .map(|(id, _)| id.clone())
            .collect();
        overdue
            .into_iter()
            .map(|id| {
                let holder = self.release(&id);
                (id, holder)
            })
            .collect()
    }

    /// The job's open runs.
    pub fn of_job(&self, job_uid: &str) -> Vec<RunId> {
        self.by_job.get(job_uid).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    /// The job's open runs: how many, how many wait (pending or retrying),
    /// how many are active.
    pub fn job_counts(&self, job_uid: &str) -> (usize, usize, usize) {
        let Some(ids) = self.by_job.get(job_uid) else { return (0, 0, 0) };
        let mut open = 0;
        let mut waiting = 0;
        let mut active = 0;
        // A waiting dependency run occupies nothing yet.
        for r in ids.iter().filter_map(|id| self.runs.get(id)).filter(|r| r.state != RunState::Waiting) {
            open += 1;
            if matches!(r.state, RunState::Pending | RunState::Retrying) {
                waiting += 1;
            }
            if r.state.is_active() {
                active += 1;
            }
        }
        (open, waiting, active)
    }

    /// Notes a cancel sent for the run's attempt.
    pub fn note_cancel(&mut self, id: &str, attempt: u32) {
        self.cancels_sent.insert((id.to_string(), attempt));
    }

    pub fn cancel_sent(&self, id: &str, attempt: u32) -> bool {
        self.cancels_sent.contains(&(id.to_string(), attempt))
    }

    /// Forgets the cancels sent for the run's attempts (its attempt ended).
    pub fn forget_cancels(&mut self, id: &str) {
        self.cancels_sent.retain(|(r, _)| r != id);
    }
}

#[cfg(test)]
#[path = "runbook_tests.rs"]
pub(crate) mod tests;
