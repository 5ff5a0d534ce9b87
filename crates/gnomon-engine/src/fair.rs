//! The per-namespace side of the [`RunBook`](crate::runbook::RunBook): the ready queue, one queue
//! per namespace taken in turn, and what each namespace holds open.
//!
//! The job timer is kept per namespace too ([`NsTimer`]): due jobs are
//! taken from the namespaces in turn, and a namespace whose fires are
//! deferred is passed over without touching its entries.
//!
//! Invariants (checked by the tests below):
//! - [`FairQueue::pop`] takes from the namespace with ready runs that holds
//!   the fewest active attempts, and among equals the one served longest
//!   ago: a namespace with a deep queue never keeps another's ready run
//!   from the next free slot;
//! - the queue's length is the sum of its namespaces' queues, and an empty
//!   namespace queue is dropped;
//! - a namespace's counts are the states of its open runs, each counted
//!   once (the book adds and takes away exactly as runs come, change and go).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use gnomon_core::{Millis, RunState};

use crate::runbook::RunId;

/// The ready runs, one queue per namespace.
#[derive(Default)]
pub struct FairQueue {
    queues: BTreeMap<String, VecDeque<RunId>>,
    /// When each namespace was last served (a pop counter).
    served: BTreeMap<String, u64>,
    pops: u64,
    len: usize,
}

impl FairQueue {
    pub fn push_back(&mut self, namespace: &str, id: RunId) {
        match self.queues.get_mut(namespace) {
            Some(q) => q.push_back(id),
            None => {
                self.queues.insert(namespace.to_string(), VecDeque::from([id]));
            }
        }
        self.len += 1;
    }

    pub fn push_front(&mut self, namespace: &str, id: RunId) {
        self.queues.entry(namespace.to_string()).or_default().push_front(id);
        self.len += 1;
    }

    /// The next ready run: from the namespace with ready runs whose
    /// `active` count is lowest, then the one served longest ago; a
    /// namespace `skip` names is passed over.
    pub fn pop(&mut self, active: impl Fn(&str) -> usize, skip: impl Fn(&str) -> bool) -> Option<RunId> {
        let ns = self
            .queues
            .keys()
            .filter(|ns| !skip(ns))
            .min_by_key(|ns| (active(ns), self.served.get(ns.as_str()).copied().unwrap_or(0)))?
            .clone();
        let q = self.queues.get_mut(&ns)?;
        let id = q.pop_front();
        if q.is_empty() {
            self.queues.remove(&ns);
        }
        if id.is_some() {
            self.len -= 1;
            self.pops += 1;
            self.served.insert(ns, self.pops);
        }
        id
    }

    /// Every queued run, namespace by namespace.
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = &RunId> {
        self.queues.values().flatten()
    }

    /// The first `n` queued runs of each namespace.
    pub fn fronts(&self, n: usize) -> impl Iterator<Item = &RunId> {
        self.queues.values().flat_map(move |q| q.iter().take(n))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many namespaces have runs queued.
    pub fn namespaces(&self) -> usize {
        self.queues.len()
    }
}

/// What one namespace holds open, by state.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NsCounts {
    /// Waiting for a worker.
    pub pending: u64,
    /// Dependency runs waiting for their upstreams.
    pub waiting: u64,
    /// Waiting for their next attempt.
    pub retrying: u64,
    /// Assigned to a worker or running.
    pub active: u64,
    /// Keyed runs that have ended and are still held (they refuse a
    /// repeated key or a replayed webhook call until their hold ends).
    pub kept: u64,
    /// The params and payload bytes of the open and kept runs.
    pub bytes: u64,
}

impl NsCounts {
    /// Every open run.
    pub fn open(&self) -> u64 {
        self.pending + self.waiting + self.retrying + self.active
    }

    /// What the `open_runs` quota counts: every open run and every kept
    /// keyed run.
    pub fn counted(&self) -> u64 {
        self.open() + self.kept
    }

    /// The runs that wait to be placed: what defers the namespace's fires.
    pub fn backlog(&self) -> u64 {
        self.pending + self.waiting
    }

    fn slot(&mut self, state: RunState) -> Option<&mut u64> {
        match state {
            RunState::Pending => Some(&mut self.pending),
            RunState::Waiting => Some(&mut self.waiting),
            RunState::Retrying => Some(&mut self.retrying),
            s if s.is_active() => Some(&mut self.active),
            _ => None,
        }
    }
}

/// The open and kept runs of every namespace, counted by state, and
/// their bytes.
#[derive(Default)]
pub struct NsTally {
    counts: BTreeMap<String, NsCounts>,
}

impl NsTally {
    fn entry(&mut self, namespace: &str) -> &mut NsCounts {
        if !self.counts.contains_key(namespace) {
            self.counts.insert(namespace.to_string(), NsCounts::default());
        }
        self.counts.get_mut(namespace).expect("inserted above")
    }

    /// Drops a namespace that counts nothing any more.
    fn tidy(&mut self, namespace: &str) {
        if self.counts.get(namespace).is_some_and(|c| *c == NsCounts::default()) {
            self.counts.remove(namespace);
        }
    }

    pub fn add(&mut self, namespace: &str, state: RunState) {
        if state.is_terminal() {
            return;
        }
        if let Some(n) = self.entry(namespace).slot(state) {
            *n += 1;
        }
    }

    pub fn remove(&mut self, namespace: &str, state: RunState) {
        let Some(c) = self.counts.get_mut(namespace) else { return };
        if let Some(n) = c.slot(state) {
            *n = n.saturating_sub(1);
        }
        self.tidy(namespace);
    }

    /// An open run's bytes came (`grow`) or went.
    pub fn bytes(&mut self, namespace: &str, bytes: u64, grow: bool) {
        if bytes == 0 {
            return;
        }
        let c = self.entry(namespace);
        c.bytes = if grow { c.bytes.saturating_add(bytes) } else { c.bytes.saturating_sub(bytes) };
        self.tidy(namespace);
    }

    /// A keyed run of `bytes` is held (`hold`) or its hold ended.
    pub fn kept(&mut self, namespace: &str, bytes: u64, hold: bool) {
        let c = self.entry(namespace);
        c.kept = if hold { c.kept + 1 } else { c.kept.saturating_sub(1) };
        self.bytes(namespace, bytes, hold);
        self.tidy(namespace);
    }

    pub fn of(&self, namespace: &str) -> NsCounts {
        self.counts.get(namespace).copied().unwrap_or_default()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &NsCounts)> {
        self.counts.iter().map(|(k, v)| (k.as_str(), v))
    }
}

/// A timer entry: (due, job uid, the job entry's generation when pushed).
pub type TimerEntry = (Millis, String, u64);

/// The jobs' next due times, one heap per namespace.
#[derive(Default)]
pub struct NsTimer {
    heaps: BTreeMap<String, BinaryHeap<Reverse<TimerEntry>>>,
    /// Which namespace a call of [`Self::take_due`] starts with.
    turn: usize,
}

impl NsTimer {
    pub fn push(&mut self, namespace: &str, entry: TimerEntry) {
        match self.heaps.get_mut(namespace) {
            Some(h) => h.push(Reverse(entry)),
            None => {
                self.heaps.insert(namespace.to_string(), BinaryHeap::from([Reverse(entry)]));
            }
        }
    }

    /// The earliest due time of the namespaces not deferred (an entry may
    /// be stale).
    pub fn next_due(&self, defers: impl Fn(&str) -> bool) -> Option<Millis> {
        self.heaps.iter().filter(|(ns, _)| !defers(ns)).filter_map(|(_, h)| h.peek().map(|Reverse((due, _, _))| *due)).min()
    }

    /// Up to `limit` jobs due by `now`, one namespace at a time in turn
    /// (each in due order), from the namespaces not deferred; entries
    /// `valid` refuses (stale) are dropped on the way.
    pub fn take_due(&mut self, now: Millis, limit: usize, defers: impl Fn(&str) -> bool, valid: impl Fn(&str, u64) -> bool) -> Vec<String> {
        let mut out = Vec::new();
        let mut open: Vec<&mut BinaryHeap<Reverse<TimerEntry>>> =
            self.heaps.iter_mut().filter(|(ns, _)| !defers(ns)).map(|(_, h)| h).collect();
        if open.is_empty() || limit == 0 {
            return out;
        }
        let n = open.len();
        open.rotate_left(self.turn % n);
        self.turn = self.turn.wrapping_add(1);
        let mut live = vec![true; n];
        while out.len() < limit && live.iter().any(|l| *l) {
            for (heap, live) in open.iter_mut().zip(live.iter_mut()).filter(|(_, l)| **l) {
                // The namespace's next valid due job, if one is due.
                loop {
                    match heap.peek() {
                        Some(Reverse((due, _, _))) if *due <= now => {
                            let Some(Reverse((_, uid, generation))) = heap.pop() else { break };
                            if valid(&uid, generation) {
                                out.push(uid);
                                break;
                            }
                        }
                        _ => {
                            *live = false;
                            break;
                        }
                    }
                }
                if out.len() >= limit {
                    break;
                }
            }
        }
        self.heaps.retain(|_, h| !h.is_empty());
        out
    }

    /// Every entry.
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = &TimerEntry> {
        self.heaps.values().flat_map(|h| h.iter().map(|Reverse(e)| e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> RunId {
        std::sync::Arc::from(s)
    }

    #[test]
    fn a_deep_queue_does_not_keep_another_namespace_from_the_next_slot() {
        let mut q = FairQueue::default();
        for i in 0..1000 {
            q.push_back("a", id(&format!("a{i}")));
        }
        q.push_back("b", id("b0"));
        assert_eq!(q.len(), 1001);
        // Equal holdings: a was served never, b never; the first pops
        // alternate, so b's run goes at the first or second slot.
        let first_two: Vec<RunId> = (0..2).filter_map(|_| q.pop(|_| 0, |_| false)).collect();
        assert!(first_two.iter().any(|r| &**r == "b0"), "{first_two:?}");
        assert_eq!(q.len(), 999);
        assert_eq!(q.iter().count(), 999, "the length is the sum of the queues");
    }

    #[test]
    fn the_namespace_holding_fewer_slots_goes_first() {
        let mut q = FairQueue::default();
        for i in 0..3 {
            q.push_back("a", id(&format!("a{i}")));
            q.push_back("b", id(&format!("b{i}")));
        }
        let active = |ns: &str| if ns == "a" { 5 } else { 0 };
        let none = |_: &str| false;
        assert_eq!(q.pop(active, none).as_deref(), Some("b0"));
        assert_eq!(q.pop(active, none).as_deref(), Some("b1"));
        q.push_front("b", id("b1"));
        assert_eq!(q.pop(active, none).as_deref(), Some("b1"), "a run put back goes first in its namespace");
        assert_eq!(q.pop(active, |ns| ns == "b").as_deref(), Some("a0"), "a namespace passed over");
        assert_eq!(q.pop(|_| 0, none).as_deref(), Some("b2"), "equal holdings: the one served longest ago");
        assert_eq!(q.fronts(1).map(|r| r.to_string()).collect::<Vec<_>>(), ["a1"]);
        assert_eq!((q.len(), q.namespaces()), (2, 1), "b's empty queue is dropped");
    }

    #[test]
    fn a_tally_counts_each_open_run_once_by_state() {
        let mut t = NsTally::default();
        t.add("a", RunState::Pending);
        t.add("a", RunState::Waiting);
        t.add("a", RunState::Running);
        t.add("a", RunState::Succeeded);
        assert_eq!(t.of("a"), NsCounts { pending: 1, waiting: 1, retrying: 0, active: 1, ..NsCounts::default() });
        assert_eq!((t.of("a").open(), t.of("a").backlog()), (3, 2));
        t.remove("a", RunState::Pending);
        t.add("a", RunState::Assigned);
        assert_eq!(t.of("a").active, 2);
        for s in [RunState::Waiting, RunState::Assigned, RunState::Running] {
            t.remove("a", s);
        }
        assert_eq!(t.iter().count(), 0, "an empty namespace leaves the tally");
        t.add("b", RunState::Pending);
        t.bytes("b", 10, true);
        t.remove("b", RunState::Pending);
        assert_eq!(t.of("b").bytes, 10, "a namespace holding bytes stays");
        t.bytes("b", 10, false);
        t.kept("b", 7, true);
        assert_eq!((t.of("b").kept, t.of("b").bytes, t.of("b").counted(), t.of("b").open()), (1, 7, 1, 0));
        t.kept("b", 7, false);
        assert_eq!(t.iter().count(), 0, "a hold that ended leaves nothing");
    }

    #[test]
    fn due_jobs_are_taken_from_the_namespaces_in_turn_and_a_deferred_one_is_passed_over() {
        let mut t = NsTimer::default();
        for i in 0..100 {
            t.push("a", (i, format!("a{i}"), 1));
        }
        t.push("b", (50, "b".into(), 1));
        t.push("b", (60, "b-stale".into(), 1));
        t.push("c", (0, "c".into(), 1));
        let valid = |uid: &str, _| uid != "b-stale";
        let first = t.take_due(60, 4, |_| false, valid);
        assert_eq!(first.len(), 4);
        for ns in ["a", "b", "c"] {
            assert!(first.iter().any(|u| u.starts_with(ns)), "{ns} gets a job into the first chunk: {first:?}");
        }
        assert_eq!(first, ["a0", "b", "c", "a1"], "in turn, each namespace in due order");
        assert_eq!(t.next_due(|_| false), Some(2));
        assert_eq!(t.next_due(|ns| ns == "a"), Some(60), "an entry may be stale");
        let rest = t.take_due(60, 1000, |ns| ns == "a", valid);
        assert!(rest.is_empty(), "a is deferred, b's entry was stale: {rest:?}");
        assert_eq!(t.next_due(|ns| ns == "a"), None, "the stale entry was dropped on the way, c is done");
        assert_eq!(t.iter().count(), 98, "a's entries are kept while it is deferred");
        let rest = t.take_due(60, 1000, |_| false, valid);
        assert_eq!(rest.len(), 59, "a's due jobs, in due order");
        assert!(rest.windows(2).all(|w| w[0][1..].parse::<u32>().unwrap() < w[1][1..].parse::<u32>().unwrap()));
    }
}
