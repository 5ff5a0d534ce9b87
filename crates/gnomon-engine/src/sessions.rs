//! [`Sessions`]: the worker sessions the leader has, their leases and the
//! attempts that occupy their slots. It owns them: the rest of the leader
//! reads a [`Session`] and asks `Sessions` to change it, so that the maps by
//! worker and by session id, the expiry marks and the adopted store leases
//! move together.
//!
//! Invariants (checked by the tests below):
//! - a session id names exactly one session, the one with that id, and a
//!   session is named by its id while its stream is up (a closed stream's
//!   id names nothing: what arrives on it is ignored);
//! - a worker is marked expired only while it has no session;
//! - a session's stream is `Up`, `CutOff` (its send side closed: the worker
//!   stopped reading; it renews nothing and takes no work) or `Down` (the
//!   stream ended; the lease keeps running). The runtime owns the streams
//!   themselves and says when one is cut off;
//! - which attempts a worker holds is not kept here: the [`RunBook`] is
//!   its one record, and every slot count is read from it.

use gnomon_proto::v1;

use crate::runbook::RunBook;
use crate::runbook::RunId;
use crate::with_duration;
use crate::HashMap;
use crate::HashSet;
use gnomon_core::Millis;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A worker's prefetch queue is filled only while its recent attempts took
/// at most this long on average (so a queued run starts within about this
/// long).
pub const PREFETCH_SHORT_MS: f64 = 100.0;

/// Where a session's stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Connected: messages go out.
    Up,
    /// Its send side closed (the worker stopped reading): it renews nothing
    /// and takes no work until it reconnects.
    CutOff,
    /// The stream ended; the lease keeps running.
    Down,
}

/// A worker session, as the leader keeps it. Fields are read anywhere in
/// the leader and changed only through [`Sessions`].
#[derive(Debug)]
pub struct Session {
    pub session_id: String,
    pub labels: BTreeMap<String, String>,
    /// The namespaces whose runs it may be given (its credential's; `None`: all).
    pub namespaces: Option<Arc<[String]>>,
    pub capacity: usize,
    /// Attempts it queues beyond `capacity` (its Hello's `prefetch`).
    pub prefetch: usize,
    /// How much of the queue dispatch may fill now (recomputed each pass):
    /// 0 while it is closed, half of it under yellow or red backpressure.
    pub queue_open: usize,
    /// Moving average of its attempts' durations (ms), once one has ended.
    pub recent_ms: Option<f64>,
    pub executors: HashSet<String>,
    pub handlers: HashSet<String>,
    /// Its stream (the runtime holds the stream itself).
    pub stream: Stream,
    pub lease_until: Millis,
    pub last_heartbeat: Millis,
    /// Of the attempts it holds, the ones its last heartbeats did not
    /// list: how many in a row (the leader runtime's `reconcile_held`).
    pub unlisted: HashMap<RunId, u8>,
    pub draining: bool,
    /// The session's lease in the store (etcd), and when it was last refreshed.
    pub store_lease: Option<i64>,
    pub refreshed_at: Millis,
}

impl Session {
    /// A session of a worker that said Hello now.
    pub fn new(session_id: String, hello: v1::Hello, namespaces: Option<Arc<[String]>>, now: Millis, ttl: Millis) -> Self {
        Session {
            session_id,
            labels: hello.labels.into_iter().collect(),
            namespaces,
            capacity: usize::try_from(hello.capacity).unwrap_or(1),
            prefetch: usize::try_from(hello.prefetch).unwrap_or(0),
            queue_open: 0,
            recent_ms: None,
            executors: hello.executors.into_iter().collect(),
            handlers: hello.handlers.into_iter().collect(),
            stream: Stream::Up,
            lease_until: now + ttl,
            last_heartbeat: now,
            unlisted: HashMap::default(),
            draining: false,
            store_lease: None,
            refreshed_at: now,
        }
    }

    /// Connected and not draining: it may be given work.
    pub fn takes_work(&self) -> bool {
        self.stream == Stream::Up && !self.draining
    }

    /// Whether its credential lets it run the namespace's runs.
    pub fn serves(&self, namespace: &str) -> bool {
        self.namespaces.as_ref().is_none_or(|n| n.iter().any(|ns| ns == namespace))
    }
}

/// The leader's worker sessions.
#[derive(Default)]
pub struct Sessions {
    by_worker: HashMap<String, Session>,
    /// Worker id by session id.
    ids: HashMap<String, String>,
    /// Workers whose session lease ran out under this leader, and when.
    expired: HashMap<String, Millis>,
    /// Store leases adopted from the previous leader (worker -> lease),
    /// until the worker reconnects.
    adopted: HashMap<String, i64>,
    round_robin: usize,
    /// Something the view shows changed.
    dirty: bool,
}

impl Sessions {
    pub fn get(&self, worker: &str) -> Option<&Session> {
        self.by_worker.get(worker)
    }

    pub fn contains(&self, worker: &str) -> bool {
        self.by_worker.contains_key(worker)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Session)> {
        self.by_worker.iter()
    }

    /// The worker whose session this is.
    pub fn worker_of(&self, session_id: &str) -> Option<&String> {
        self.ids.get(session_id)
    }

    /// Takes out a worker's session, for a new one to replace it; the
    /// worker is no longer marked expired.
    pub fn take(&mut self, worker: &str) -> Option<Session> {
        self.expired.remove(worker);
        let s = self.by_worker.remove(worker)?;
        self.ids.remove(&s.session_id);
        self.dirty = true;
        Some(s)
    }

    pub fn insert(&mut self, worker: String, session: Session) {
        self.expired.remove(&worker);
        if let Some(old) = self.by_worker.remove(&worker) {
            self.ids.remove(&old.session_id);
        }
        self.ids.insert(session.session_id.clone(), worker.clone());
        self.by_worker.insert(worker, session);
        self.dirty = true;
    }

    /// A session's stream ended: it stays, without a stream, while its
    /// lease runs. Returns its worker.
    pub fn stream_closed(&mut self, session_id: &str) -> Option<String> {
        let worker = self.ids.remove(session_id)?;
        if let Some(s) = self.by_worker.get_mut(&worker).filter(|s| s.session_id == session_id) {
            s.stream = Stream::Down;
            self.dirty = true;
        }
        Some(worker)
    }

    /// Sessions whose lease ran out by `now` (a store-kept lease gets
    /// `store_slack` more: the store's deletion of its key decides), taken
    /// out and marked expired. Marks older than `forget_after` are
    /// dropped: a rebuild's fallback deadline for such a worker's attempts
    /// (the term's start plus a lease and the reconnect slack) has passed
    /// as well, so the mark decides nothing any more, and the marks stay
    /// as few as the workers that expired lately.
    pub fn expire(&mut self, now: Millis, store_slack: Millis, forget_after: Millis) -> Vec<(String, Session)> {
        self.expired.retain(|_, at| now - *at <= forget_after);
        let ended: Vec<String> = self
            .by_worker
            .iter()
            .filter(|(_, s)| s.lease_until + if s.store_lease.is_some() { store_slack } else { 0 } < now)
            .map(|(w, _)| w.clone())
            .collect();
        let mut out = Vec::with_capacity(ended.len());
        for worker in ended {
            if let Some(s) = self.take(&worker) {
                self.expired.insert(worker.clone(), now);
                out.push((worker, s));
            }
        }
        out
    }

    /// When the worker's session lease ran out under this leader.
    pub fn expired_at(&self, worker: &str) -> Option<Millis> {
        self.expired.get(worker).copied()
    }

    /// A heartbeat renews the lease and says whether the worker drains.
    /// Returns the store lease to refresh, when its refresh is due (at
    /// 0.7×TTL), or `None` (also when the session's send side is closed:
    /// it renews nothing).
    pub fn heartbeat(&mut self, worker: &str, now: Millis, ttl: Millis, draining: bool) -> Option<i64> {
        let s = self.by_worker.get_mut(worker)?;
        if s.stream == Stream::CutOff {
            return None;
        }
        s.lease_until = now + ttl;
        s.last_heartbeat = now;
        if s.draining != draining {
            tracing::info!(worker = %worker, draining, "worker drain state changed");
        }
        s.draining = draining;
        self.dirty = true;
        let lease = s.store_lease.filter(|_| now - s.refreshed_at >= ttl * 7 / 10)?;
        s.refreshed_at = now;
        Some(lease)
    }

    /// Whether the worker's send side is closed (it stopped reading).
    pub fn is_cut_off(&self, worker: &str) -> bool {
        self.by_worker.get(worker).is_some_and(|s| s.stream == Stream::CutOff)
    }

    /// The runtime found the worker's send side closed (it stopped reading
    /// and was cut off, or its stream task ended): it takes no work and
    /// renews nothing until it reconnects.
    pub fn cut_off(&mut self, worker: &str) {
        if let Some(s) = self.by_worker.get_mut(worker).filter(|s| s.stream == Stream::Up) {
            s.stream = Stream::CutOff;
            self.dirty = true;
        }
    }

    /// The session's lease in the store, registered now.
    pub fn set_store_lease(&mut self, worker: &str, lease: i64, now: Millis) {
        if let Some(s) = self.by_worker.get_mut(worker) {
            s.store_lease = Some(lease);
            s.refreshed_at = now;
        }
        self.adopted.remove(worker);
    }

    /// The store deleted the session's lease key: the session is evicted a
    /// lease after its last heartbeat, never earlier. Whether it was this
    /// session's lease.
    pub fn store_lease_deleted(&mut self, worker: &str, lease: i64, ttl: Millis) -> bool {
        let Some(s) = self.by_worker.get_mut(worker).filter(|s| s.store_lease == Some(lease)) else { return false };
        s.store_lease = None;
        s.lease_until = s.lease_until.min(s.last_heartbeat + ttl);
        true
    }

    /// The worker's store lease: its session's, or the one adopted from the
    /// previous leader.
    pub fn store_lease(&self, worker: &str) -> Option<i64> {
        self.by_worker.get(worker).and_then(|s| s.store_lease).or_else(|| self.adopted.get(worker).copied())
    }

    /// Adopts a live store lease of a worker the previous leader had.
    pub fn adopt(&mut self, worker: &str, lease: i64) {
        self.adopted.insert(worker.to_string(), lease);
    }

    /// Forgets an adopted lease the store deleted; whether it was adopted.
    pub fn forget_adopted(&mut self, worker: &str, lease: i64) -> bool {
        if self.adopted.get(worker) == Some(&lease) {
            self.adopted.remove(worker);
            return true;
        }
        false
    }

    pub fn adopted_count(&self) -> usize {
        self.adopted.len()
    }

    /// Forgets every heartbeat miss (a rebuild recomputes the holdings
    /// from the store).
    pub fn clear_unlisted(&mut self) {
        for s in self.by_worker.values_mut() {
            s.unlisted.clear();
        }
        self.dirty = true;
    }

    /// The attempts the worker's last heartbeats did not list, and how many
    /// times in a row.
    pub fn set_unlisted(&mut self, worker: &str, unlisted: HashMap<RunId, u8>) {
        if let Some(s) = self.by_worker.get_mut(worker) {
            s.unlisted = unlisted;
        }
    }

    /// An attempt of `ms` ended on the worker: its moving average.
    pub fn record_duration(&mut self, worker: &str, ms: f64) {
        if let Some(s) = self.by_worker.get_mut(worker) {
            s.recent_ms = with_duration(s.recent_ms, ms);
        }
    }

    /// Sets how much of each prefetch queue dispatch may fill: `depth` of a
    /// session whose queue is open (its attempts are short on average and
    /// `young` says none it holds is old), 0 otherwise.
    pub fn open_queues(&mut self, runs: &RunBook, young: impl Fn(&RunId) -> bool, depth: impl Fn(&Session, f64) -> usize) {
        for (worker, s) in self.by_worker.iter_mut() {
            let open =
                s.prefetch > 0 && s.recent_ms.is_some_and(|m| m <= PREFETCH_SHORT_MS) && runs.runs_held_by(worker).iter().all(&young);
            s.queue_open = match (open, s.recent_ms) {
                (true, Some(avg)) => depth(s, avg),
                _ => 0,
            };
        }
    }

    /// What the workers that take work can take: free slots, and with
    /// `queues` the open part of their prefetch queues.
    pub fn room(&self, queues: bool, runs: &RunBook) -> usize {
        self.by_worker
            .iter()
            .filter(|(_, s)| s.takes_work())
            .map(|(w, s)| (s.capacity + if queues { s.queue_open } else { 0 }).saturating_sub(runs.held_by(w)))
            .sum()
    }

    /// The slots of the workers that take work.
    pub fn capacity(&self) -> usize {
        self.by_worker.values().filter(|s| s.takes_work()).map(|s| s.capacity).sum()
    }

    /// Slots and prefetch queues of the workers that take work: what they
    /// can absorb at once.
    pub fn absorb(&self) -> usize {
        self.by_worker.values().filter(|s| s.takes_work()).map(|s| s.capacity + s.prefetch).sum()
    }

    /// Where the round-robin strategy stands.
    pub fn round_robin(&self) -> usize {
        self.round_robin
    }

    pub fn set_round_robin(&mut self, at: usize) {
        self.round_robin = at;
    }

    /// Whether the view needs publishing since last asked; clears it.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runbook::RunBook;
    use gnomon_core::Millis;
    use gnomon_core::RunState;
    use std::sync::Arc;

    fn hello(worker: &str, capacity: u32, prefetch: u32) -> v1::Hello {
        v1::Hello { worker_id: worker.into(), capacity, prefetch, executors: vec!["shell".into()], ..Default::default() }
    }

    fn session(id: &str, worker: &str, capacity: u32, now: Millis) -> (Session, ()) {
        (Session::new(id.into(), hello(worker, capacity, 0), None, now, 10_000), ())
    }

    /// Every session is named by its id and every id by its session.
    fn check(s: &Sessions) {
        for (worker, session) in &s.by_worker {
            if session.stream != Stream::Down {
                assert_eq!(s.ids.get(&session.session_id), Some(worker), "session {} of {worker} is named by its id", session.session_id);
            }
            assert!(!s.expired.contains_key(worker), "{worker} has a session and is marked expired");
        }
        for (id, worker) in &s.ids {
            assert_eq!(s.by_worker.get(worker).map(|x| x.session_id.as_str()), Some(id.as_str()));
        }
    }

    #[test]
    fn a_new_session_replaces_the_old_one_and_its_id() {
        let mut s = Sessions::default();
        let (a, _rx) = session("w1-a", "w1", 4, 0);
        s.insert("w1".into(), a);
        check(&s);
        let old = s.take("w1").expect("the old session");
        assert_eq!(old.session_id, "w1-a");
        let (b, _rx2) = session("w1-b", "w1", 4, 100);
        s.insert("w1".into(), b);
        check(&s);
        assert_eq!(s.worker_of("w1-a"), None, "the old id names nothing");
        assert_eq!(s.worker_of("w1-b").map(String::as_str), Some("w1"));
    }

    #[test]
    fn a_closed_stream_keeps_the_session_until_its_lease_runs_out() {
        let mut s = Sessions::default();
        let (a, _rx) = session("w1-a", "w1", 2, 0);
        s.insert("w1".into(), a);
        assert_eq!(s.stream_closed("w1-a").as_deref(), Some("w1"));
        assert!(s.get("w1").is_some_and(|x| x.stream == Stream::Down));
        assert_eq!(s.worker_of("w1-a"), None, "what arrives on a closed stream is ignored");
        check(&s);
        assert_eq!(s.room(false, &RunBook::default()), 0, "a worker without a stream takes no work");
        assert!(s.expire(9_000, 3_000, 12_000).is_empty(), "its lease still runs");
        let gone = s.expire(10_001, 3_000, 12_000);
        assert_eq!(gone.len(), 1);
        assert_eq!(s.expired_at("w1"), Some(10_001));
        check(&s);
        let (b, _rx2) = session("w1-b", "w1", 2, 10_002);
        s.insert("w1".into(), b);
        assert_eq!(s.expired_at("w1"), None, "a new session clears the mark");
        check(&s);
    }

    #[test]
    fn expiry_marks_are_forgotten_once_they_decide_nothing() {
        let mut s = Sessions::default();
        for (i, w) in ["w1", "w2"].into_iter().enumerate() {
            let (x, _rx) = session(&format!("{w}-a"), w, 1, i as Millis * 5_000);
            s.insert(w.into(), x);
        }
        assert_eq!(s.expire(10_001, 0, 12_000).len(), 1, "w1's lease ran out");
        assert_eq!(s.expire(15_001, 0, 12_000).len(), 1, "then w2's");
        assert!(s.expire(22_001, 0, 12_000).is_empty());
        assert_eq!((s.expired_at("w1"), s.expired_at("w2")), (Some(10_001), Some(15_001)));
        s.expire(22_002, 0, 12_000);
        assert_eq!((s.expired_at("w1"), s.expired_at("w2")), (None, Some(15_001)), "w1's mark is past the horizon");
        s.expire(27_002, 0, 12_000);
        assert_eq!(s.expired.len(), 0);
    }

    #[test]
    fn slots_count_what_is_held_and_a_store_lease_gets_slack() {
        let mut s = Sessions::default();
        let (a, _rx) = session("w1-a", "w1", 3, 0);
        s.insert("w1".into(), a);
        // The run book is the one record of what a worker holds.
        let mut runs = RunBook::default();
        for id in ["r1", "r2"] {
            runs.track(Arc::from(id), crate::runbook::tests::open("j", RunState::Assigned, 1));
            runs.hold(Arc::from(id), "w1");
        }
        assert_eq!((s.room(false, &runs), s.capacity(), s.absorb()), (1, 3, 3));
        runs.release("r1");
        assert_eq!(s.room(false, &runs), 2);
        s.set_store_lease("w1", 77, 0);
        assert_eq!(s.store_lease("w1"), Some(77));
        assert!(s.expire(10_500, 3_000, 12_000).is_empty(), "the store's deletion decides first");
        assert!(s.store_lease_deleted("w1", 77, 10_000));
        assert_eq!(s.expire(10_001, 3_000, 12_000).len(), 1, "then the in-memory lease, a TTL after the last heartbeat");
        s.adopt("w2", 5);
        assert_eq!(s.store_lease("w2"), Some(5));
        assert!(!s.forget_adopted("w2", 6));
        assert!(s.forget_adopted("w2", 5));
        assert_eq!(s.adopted_count(), 0);
    }

    #[test]
    fn heartbeats_renew_and_ask_for_a_store_refresh_at_seven_tenths() {
        let mut s = Sessions::default();
        let (a, _rx) = session("w1-a", "w1", 1, 0);
        s.insert("w1".into(), a);
        s.set_store_lease("w1", 9, 0);
        assert_eq!(s.heartbeat("w1", 2_000, 10_000, false), None);
        assert_eq!(s.heartbeat("w1", 7_000, 10_000, true), Some(9));
        assert_eq!(s.heartbeat("w1", 8_000, 10_000, true), None, "refreshed at 7 s");
        assert!(s.get("w1").is_some_and(|x| x.draining && x.lease_until == 18_000));
        assert_eq!(s.room(false, &RunBook::default()), 0, "a draining worker takes no work");
    }
}
