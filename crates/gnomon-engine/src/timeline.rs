//! [`JobTimeline`]: the jobs the leader schedules, each with its timeline
//! (where its due instants start, what a previous version still has due),
//! and the timer of their next due times. Part of the cache, rebuilt from
//! the store as a whole; it owns the entries and the timer so that a
//! timer entry is valid exactly while its job's entry is at the same
//! generation.
//!
//! Invariants (checked by the tests below):
//! - every scheduled (not paused) job with a next instant has a timer entry
//!   at its generation; older entries are skipped when they come due;
//! - `last_scheduled_at` never goes back.

use gnomon_core::Millis;

use crate::with_duration;
use crate::HashMap;
use gnomon_core::retry::BackoffPolicy;
use gnomon_core::schedule::Schedule;
use gnomon_core::spec::Executor;
use gnomon_core::spec::MisfirePolicy;
use gnomon_core::spec::OverlapPolicy;
use gnomon_core::spec::RouteSpec;
use gnomon_records::JobRecord;
use gnomon_records::NewRun;
use std::sync::Arc;
use std::time::Duration;

/// What the leader keeps of a job's stored record: its metadata, not its spec.
#[derive(Debug, Clone)]
pub struct JobMeta {
    /// uid, name and namespace, shared with every open run of the job.
    pub key: Arc<JobKey>,
    pub version: u64,
    pub paused: bool,
    pub last_scheduled_at: Option<Millis>,
}

/// What the leader keeps of a job: only what scheduling and dispatch read,
/// not the whole spec (descriptions, the original strings). Entries are
/// boxed so the map's table stays small. With 100,000 jobs this is the bulk
/// of the leader's memory, about 400 bytes a job.
#[derive(Debug)]
pub struct JobEntry {
    pub record: JobMeta,
    pub schedule: Schedule,
    pub executor: Arc<Executor>,
    /// The executor as the `Assign` message carries it, serialised once.
    pub executor_json: Arc<str>,
    pub timeout: Option<Duration>,
    pub max_attempts: u32,
    pub backoff: BackoffPolicy,
    pub catchup_window_ms: i64,
    pub overlap: OverlapPolicy,
    pub misfire: MisfirePolicy,
    pub route: Option<Box<RouteSpec>>,
    pub generation: u64,
    /// Moving average of its attempts' durations (ms), once one has ended.
    pub recent_ms: Option<f64>,
    /// The first `scheduled_at` free for its next manual run.
    pub manual_next: Millis,
    /// Identifies the schedule as written (a change of it is a new version
    /// of the timeline).
    pub schedule_key: u64,
    /// Where this version's timeline starts: instants after it and after
    /// `last_scheduled_at` are due.
    pub from: Millis,
    /// Instants the previous version had due when it was changed, still
    /// to be fired under it (see [`JobTimeline::upsert`]).
    pub carry: Option<Box<Carry>>,
    /// `from` moved past `last_scheduled_at` (a new schedule, a resume) and
    /// is not yet written: the next fire writes it as the job's
    /// `last_scheduled_at`, so a new leader starts there too.
    pub settle: bool,
    /// Who is told of its runs' outcomes.
    pub notify: Option<Box<[super::notify::Target]>>,
    /// The values of a run no trigger set, as a scheduled fire records them.
    pub default_params: Option<Arc<str>>,
    /// The jobs it runs after, and its declared params (for what its
    /// dependency runs inherit); kept for the graph.
    pub after: Box<[gnomon_core::deps::AfterEdge]>,
    pub declared: Option<Arc<std::collections::BTreeMap<String, gnomon_core::params::ParamSpec>>>,
}

/// The previous version's timeline up to the change.
#[derive(Debug, Clone)]
pub struct Carry {
    pub schedule: Schedule,
    /// Its instants after this (and after `last_scheduled_at`)…
    pub after: Millis,
    /// …and up to this are fired under the previous version.
    pub until: Millis,
}

fn schedule_key(s: &gnomon_core::spec::ScheduleSpec) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&s.cron, &s.timezone, &s.every, &s.at, &s.start_at, &s.end_at, &s.jitter).hash(&mut h);
    h.finish()
}

/// A job's identity, shared (not copied) by its entry and its open runs.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct JobKey {
    pub uid: String,
    pub name: String,
    pub namespace: String,
}

/// The scheduled jobs and their timer.
#[derive(Default)]
pub struct JobTimeline {
    jobs: HashMap<String, Box<JobEntry>>,
    /// The next due times, per namespace.
    timer: super::fair::NsTimer,
    next_generation: u64,
    /// How far the store's job change feed has been read.
    feed_seq: u64,
    /// The held jobs' dependency edges.
    graph: super::graph::DepGraph,
    /// While a rebuild loads this timeline: the entries of the one it
    /// replaces (what they learned carries over to the same job).
    earlier: HashMap<String, Box<JobEntry>>,
}

impl JobEntry {
    /// The time after which the job's schedule is considered: its persisted
    /// `last_scheduled_at`, but never before its timeline starts (`from`:
    /// its creation, or the change of its schedule or its resumption).
    pub fn base(&self) -> Millis {
        self.record.last_scheduled_at.map_or(self.from, |last| last.max(self.from))
    }
}

impl JobTimeline {
    pub fn get(&self, uid: &str) -> Option<&JobEntry> {
        self.jobs.get(uid).map(|j| &**j)
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.jobs.contains_key(uid)
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops a job (deleted in the store); its timer entries are skipped.
    pub fn remove(&mut self, uid: &str) {
        self.jobs.remove(uid);
        self.graph.remove(uid);
    }

    /// Every entry, taken out for a rebuild, over the earlier ones not
    /// reached yet (an entry a failed rebuild loaded is newer than those).
    pub fn take_for_rebuild(&mut self) -> HashMap<String, Box<JobEntry>> {
        self.graph = Default::default();
        let mut earlier = std::mem::take(&mut self.earlier);
        earlier.extend(std::mem::take(&mut self.jobs));
        earlier
    }

    /// The entries of the timeline this one replaces, until
    /// [`Self::loaded`].
    pub fn set_earlier(&mut self, earlier: HashMap<String, Box<JobEntry>>) {
        self.earlier = earlier;
    }

    /// Whether this timeline is loaded over an earlier one.
    pub fn has_earlier(&self) -> bool {
        !self.earlier.is_empty()
    }

    /// The earlier entry of job `uid`, taken out.
    pub fn take_earlier(&mut self, uid: &str) -> Option<Box<JobEntry>> {
        self.earlier.remove(uid)
    }

    /// Puts an earlier entry back (its job was not reseated from it).
    pub fn keep_earlier(&mut self, uid: String, entry: Box<JobEntry>) {
        self.earlier.insert(uid, entry);
    }

    /// The rebuild is done: the earlier entries are dropped.
    pub fn loaded(&mut self) {
        self.earlier.clear();
    }

    /// [`Self::upsert`], carrying over from the earlier entries.
    pub fn upsert_record(&mut self, record: JobRecord, now: Millis) {
        let earlier = std::mem::take(&mut self.earlier);
        self.upsert(record, now, &earlier);
        self.earlier = earlier;
    }

    /// Whether no held job runs after another (no run makes dependency runs).
    pub fn has_no_edges(&self) -> bool {
        self.graph.is_empty()
    }

    /// The dependency runs a run of job `uid` at `at` makes (see
    /// [`super::graph::DepGraph::closure`]).
    pub fn closure(&self, uid: &str, at: Millis, made_by: &str, params: Option<&str>, now: Millis) -> Vec<NewRun> {
        self.graph.closure(uid, at, made_by, params, now)
    }

    /// The last instant job `uid`'s timeline will never fire itself: where
    /// it stands (its last fire, or where its timeline starts), or before
    /// what a previous version still has due; while it is paused with
    /// nothing carried, `now` (the times of a pause are never fired); and
    /// once its schedule has no instant left (past its `end_at`), the end
    /// of time. `None` for a job not held.
    pub fn settled_until(&self, uid: &str, now: Millis) -> Option<Millis> {
        let entry = self.jobs.get(uid)?;
        if let Some(c) = &entry.carry {
            return Some(entry.record.last_scheduled_at.map_or(c.after, |l| l.max(c.after)).min(entry.base()));
        }
        let base = if entry.record.paused { entry.base().max(now) } else { entry.base() };
        // A timeline whose schedule has ended never fires again.
        Some(if entry.schedule.next_after(base).is_none() { Millis::MAX } else { base })
    }

    /// Whether job `uid` will still get a run at the instant `at` that it
    /// has none of yet: its timeline (or what a previous version still has
    /// due) includes `at` and has not passed it, or one of its upstreams
    /// will still get one (its dependency run of `at` is then made). A job
    /// not held (deleted), paused at `at`, or whose timeline passed `at`
    /// will not.
    pub fn expects(&self, uid: &str, at: Millis) -> bool {
        self.expects_within(uid, at, 0)
    }

    fn expects_within(&self, uid: &str, at: Millis, depth: usize) -> bool {
        let Some(entry) = self.jobs.get(uid) else { return false };
        if let Some(c) = &entry.carry {
            let after = entry.record.last_scheduled_at.map_or(c.after, |l| l.max(c.after));
            if at > after && at <= c.until && c.schedule.includes(at) {
                return true;
            }
        }
        if !entry.record.paused && at > entry.base() && entry.schedule.includes(at) {
            return true;
        }
        // The graph has no cycle but two writes that raced may leave one.
        depth < 64 && self.graph.upstreams_of(uid).iter().any(|up| self.expects_within(up, at, depth + 1))
    }

    pub fn feed_seq(&self) -> u64 {
        self.feed_seq
    }

    pub fn set_feed_seq(&mut self, seq: u64) {
        self.feed_seq = seq;
    }

    /// The job's shared key (from its entry), or a new one for a run of a
    /// job the leader does not schedule (deleted, or no longer valid).
    pub fn key(&self, uid: &str, name: &str, namespace: &str) -> Arc<JobKey> {
        match self.jobs.get(uid) {
            Some(j) => j.record.key.clone(),
            None => Arc::new(JobKey { uid: uid.into(), name: name.into(), namespace: namespace.into() }),
        }
    }

    /// Takes in a job's stored record: its entry, with its timeline, and
    /// its next due time on the timer. What the version it replaces had
    /// learned carries over, from this timeline or from `earlier` (the
    /// timeline a rebuild dropped). A record that no longer validates
    /// drops the job.
    pub fn upsert(&mut self, record: JobRecord, now: Millis, earlier: &HashMap<String, Box<JobEntry>>) {
        let compiled = match record.spec.compile() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(job = %record.name, error = %e, "stored job no longer validates; not scheduling it");
                self.remove(&record.uid);
                return;
            }
        };
        self.next_generation += 1;
        let generation = self.next_generation;
        // What the previous version learned carries over (from the cache
        // being rebuilt, during a rebuild).
        let previous = self.jobs.get(&record.uid).or_else(|| earlier.get(&record.uid));
        let previous_last = previous.and_then(|j| j.record.last_scheduled_at);
        let recent_ms = previous.and_then(|j| j.recent_ms);
        let manual_next = previous.map_or(0, |j| j.manual_next);
        let key = schedule_key(&compiled.spec.schedule);
        // A change takes effect when it was written, by the writer's clock,
        // but never later than this leader's now (a writer whose clock runs
        // ahead cannot drop instants that are not due yet).
        let cut = record.updated_at.min(now);
        let last = record.last_scheduled_at.max(previous_last);
        let (from, carry, settle) = match previous {
            Some(p) if p.schedule_key == key && p.record.paused == record.paused => (p.from, p.carry.clone(), p.settle),
            Some(p) => {
                // The schedule changed, or the job was paused or resumed.
                // A new schedule, or a resumed job, starts at the change
                // (times that elapsed while paused are not fired); what the
                // previous version had due up to the change still fires
                // under it (a turn a few milliseconds late loses nothing).
                let from = if p.schedule_key != key || (p.record.paused && !record.paused) { cut } else { p.from };
                // A job resumed (or changed) while paused keeps what its
                // pause left to fire: the times due before the pause.
                let carry = if p.record.paused {
                    p.carry.clone()
                } else {
                    Some(Box::new(Carry { schedule: p.schedule.clone(), after: p.from, until: cut }))
                };
                (from, carry, p.settle || from > last.unwrap_or(Millis::MIN))
            }
            // Not in memory (a new term, or the first sight of a job). A
            // first version starts at its creation. A paused job still fires
            // what was due before its pause, and a resumed one starts at its
            // resumption (both recorded by the store), so a leader that
            // never saw the pause or the resume fires the same as one that
            // did; a changed schedule likewise (the store keeps the previous
            // one). Otherwise the schedule is the one the job was created
            // with: its timeline runs from its creation (and resumes at its
            // last fire), whatever other edits were made.
            None => {
                let created = record.created_at;
                let base = last.unwrap_or(created);
                let before_pause =
                    |until: Millis| Box::new(Carry { schedule: compiled.schedule.clone(), after: created, until: until.min(now) });
                if record.paused {
                    let until = record.paused_at.unwrap_or(cut);
                    // Paused again after a resume: only the times between
                    // the resume and this pause were due while active (the
                    // ones before the resume fell in the earlier pause).
                    match record.resumed_at.filter(|r| *r > base && *r <= until) {
                        Some(resumed) => (
                            created,
                            Some(Box::new(Carry { schedule: compiled.schedule.clone(), after: resumed, until: until.min(now) })),
                            false,
                        ),
                        None => (created, (until > base).then(|| before_pause(until)), false),
                    }
                } else if let Some(resumed) = record.resumed_at.filter(|r| *r > base) {
                    let paused = record.paused_at.filter(|p| *p > base && *p <= resumed);
                    (resumed.min(now), paused.map(before_pause), true)
                } else if let Some((changed, previous)) = record
                    .schedule_changed_at
                    .filter(|c| *c > base)
                    .zip(record.previous_schedule.as_ref().and_then(|s| s.compile(Some((&record.namespace, &record.name))).ok()))
                {
                    // The schedule changed after the last fire: the old one's
                    // due times up to the change fire under it, the new one
                    // starts at the change (as a leader that saw it does).
                    (changed.min(now), Some(Box::new(Carry { schedule: previous, after: created, until: changed.min(now) })), true)
                } else {
                    (created, None, false)
                }
            }
        };
        let record = JobMeta {
            last_scheduled_at: last,
            key: Arc::new(JobKey { uid: record.uid, name: record.name, namespace: record.namespace }),
            version: record.version,
            paused: record.paused,
        };
        let entry = Box::new(JobEntry {
            record,
            schedule: compiled.schedule,
            executor_json: serde_json::to_string(&compiled.spec.executor).unwrap_or_default().into(),
            executor: Arc::new(compiled.spec.executor),
            timeout: compiled.timeout,
            max_attempts: compiled.max_attempts,
            backoff: compiled.backoff,
            catchup_window_ms: compiled.catchup_window_ms,
            overlap: compiled.spec.overlap,
            misfire: compiled.spec.misfire,
            route: compiled.spec.route.map(Box::new),
            notify: super::notify::targets(&compiled.spec.notify),
            default_params: compiled.default_params.map(Arc::from),
            after: compiled.spec.after.into_boxed_slice(),
            declared: (!compiled.spec.params.is_empty()).then(|| Arc::new(compiled.spec.params)),
            generation,
            recent_ms,
            manual_next,
            schedule_key: key,
            from,
            carry,
            settle,
        });
        self.seat(entry, now);
    }

    /// Takes back an entry a rebuild kept, for a job still stored at the
    /// same version: a new generation, the stored last fire.
    pub fn reseat(&mut self, mut entry: Box<JobEntry>, last_scheduled_at: Option<Millis>, now: Millis) {
        self.next_generation += 1;
        entry.generation = self.next_generation;
        entry.record.last_scheduled_at = last_scheduled_at.max(entry.record.last_scheduled_at);
        self.seat(entry, now);
    }

    /// Puts a job's entry in and its next due time on the timer.
    fn seat(&mut self, entry: Box<JobEntry>, now: Millis) {
        let generation = entry.generation;
        let key = &entry.record.key;
        self.graph.set(&key.uid, &key.namespace, &key.name, &entry.after, entry.declared.clone());
        let due = if entry.carry.is_some() || (entry.settle && !entry.record.paused) {
            Some(now)
        } else if !entry.record.paused {
            entry.schedule.next_after(entry.base()).map(|at| entry.schedule.fire_at(at))
        } else {
            None
        };
        if let Some(due) = due {
            self.timer.push(&entry.record.key.namespace, (due, entry.record.key.uid.clone(), generation));
        }
        self.jobs.insert(entry.record.key.uid.clone(), entry);
    }

    /// When the timer next comes due for a namespace not deferred (an
    /// entry may be stale).
    pub fn next_due(&self, defers: impl Fn(&str) -> bool) -> Option<Millis> {
        self.timer.next_due(defers)
    }

    /// Up to `limit` jobs due by `now`, taken off the timer from the
    /// namespaces not deferred, in turn (stale entries and paused jobs with
    /// nothing carried are dropped).
    pub fn take_due(&mut self, now: Millis, limit: usize, defers: impl Fn(&str) -> bool) -> Vec<String> {
        let jobs = &self.jobs;
        let valid = |uid: &str, generation: u64| {
            jobs.get(uid).is_some_and(|j| j.generation == generation && (!j.record.paused || j.carry.is_some()))
        };
        self.timer.take_due(now, limit, defers, valid)
    }

    /// A fire of the job is committed: `last` is its last instant fired,
    /// `more` whether more are due now, `carried` whether they were the
    /// previous version's. Schedules its next due time.
    pub fn fired(&mut self, uid: &str, last: Option<Millis>, more: bool, carried: bool, now: Millis) {
        let Some(entry) = self.jobs.get_mut(uid) else { return };
        if let Some(last) = last {
            entry.record.last_scheduled_at = Some(entry.record.last_scheduled_at.map_or(last, |l| l.max(last)));
        }
        if !carried {
            entry.settle = false;
        }
        let generation = entry.generation;
        let next = if more {
            Some(now)
        } else if carried {
            // The previous version is done: plan this one's now.
            entry.carry = None;
            (!entry.record.paused).then_some(now)
        } else {
            // Every instant up to `now` whose (jittered) fire time has come
            // was planned; one after a jitter's reach before `now` may not
            // have.
            let schedule = &entry.schedule;
            let after = entry.record.last_scheduled_at.unwrap_or(now).max(now - schedule.max_jitter_ms());
            schedule.next_after(after).map(|at| schedule.fire_at(at))
        };
        if let Some(next) = next {
            self.timer.push(&entry.record.key.namespace, (next, uid.to_string(), generation));
        }
    }

    /// An attempt of the job took `ms`: its moving average.
    pub fn record_duration(&mut self, uid: &str, ms: f64) {
        if let Some(j) = self.jobs.get_mut(uid) {
            j.recent_ms = with_duration(j.recent_ms, ms);
        }
    }

    /// The job's manual runs took instants up to `next`.
    pub fn manual_taken(&mut self, uid: &str, next: Millis) {
        if let Some(j) = self.jobs.get_mut(uid) {
            j.manual_next = j.manual_next.max(next);
        }
    }
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
