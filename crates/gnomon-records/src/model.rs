//! Records that cross the store boundary.

use std::sync::Arc;

use gnomon_core::deps::RunAfter;
use gnomon_core::spec::JobSpec;
use gnomon_core::{AttemptState, Millis, RunState};
use serde::{Deserialize, Serialize};

/// The token a leader's writes carry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fence {
    pub scope: String,
    pub token: u64,
}

/// Who leads, as recorded with the fence.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LeaderInfo {
    pub holder: String,
    pub address: String,
    pub backend: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeadershipRecord {
    pub scope: String,
    pub token: u64,
    pub holder: String,
    pub address: String,
    pub backend: String,
    pub since: Millis,
    /// The committed leader time: the highest time a leader of the scope
    /// has written with `gnomon_backend::LeadershipStore::advance_leader_time` (0: none yet).
    /// A new leader's clock never runs below it.
    pub leader_time: Millis,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Internal identity; a job deleted and created again gets a new uid.
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub spec: JobSpec,
    pub version: u64,
    pub paused: bool,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub last_scheduled_at: Option<Millis>,
    /// When it was last paused, and last resumed (each set by the write
    /// that changed `paused`).
    pub paused_at: Option<Millis>,
    pub resumed_at: Option<Millis>,
    /// When the schedule last changed, and what it was before (set only by
    /// a write that changes the schedule): a leader that never saw the old
    /// schedule still fires what it had due before the change.
    pub schedule_changed_at: Option<Millis>,
    pub previous_schedule: Option<gnomon_core::spec::ScheduleSpec>,
    pub change_seq: u64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobChanges {
    pub upserted: Vec<JobRecord>,
    pub deleted: Vec<String>,
    /// Pass this to the next `job_changes` call.
    pub seq: u64,
}

/// What names a job's version, and what the leader's fires advance: enough
/// to tell whether a job held in memory is still the stored one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobHead {
    pub uid: String,
    pub version: u64,
    pub last_scheduled_at: Option<Millis>,
}

/// Every job's head, read at one point of the job change feed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobHeads {
    pub heads: Vec<JobHead>,
    /// Every job write up to this feed position is reflected (pass it to
    /// `job_changes` to follow on).
    pub seq: u64,
}

/// What a resume writes as the job's last fire, or `None` to keep it: a
/// paused job whose timeline has no instant between its last fire (or its
/// creation) and its pause has nothing left to fire from before the pause,
/// and the times of the pause are never fired, so its timeline is settled
/// up to the resume at once. A leader that loads the job later (after it is
/// paused and resumed again, say) then starts there, instead of at a last
/// fire from before an earlier pause. With times before the pause still to
/// fire (or a schedule change not yet fired), it is left to the leader.
pub fn settled_on_resume(job: &JobRecord, now: Millis) -> Option<Millis> {
    if !job.paused {
        return None;
    }
    let paused_at = job.paused_at?;
    let base = job.last_scheduled_at.unwrap_or(job.created_at);
    if job.schedule_changed_at.is_some_and(|c| c > base) {
        return None;
    }
    let schedule = job.spec.compile().ok()?.schedule;
    if schedule.next_after(base).is_some_and(|next| next <= paused_at) {
        return None;
    }
    Some(base.max(now - 1))
}

/// The deterministic id of the run of `job_uid` at `scheduled_at`.
pub fn run_id(job_uid: &str, scheduled_at: Millis) -> String {
    format!("{job_uid}-{scheduled_at}")
}

/// The id of a manual run of `job_uid` given the instant `scheduled_at`:
/// apart from the scheduled runs' ids, so that no schedule (a later
/// version's included) can ever take a manual run's id, or the reverse.
pub fn manual_run_id(job_uid: &str, scheduled_at: Millis) -> String {
    format!("{job_uid}-m{scheduled_at}")
}

/// The id of the manual run of `job_uid` that the idempotency key `key`
/// names: the same for every call with that key, whichever leader answers
/// it, so inserting it by id creates one run per key. Apart from the
/// scheduled (`<uid>-<instant>`) and the unkeyed manual (`<uid>-m<instant>`)
/// ids; the key is hashed, so any text a caller sends makes a plain id.
pub fn keyed_run_id(job_uid: &str, key: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_bytes());
    format!("{job_uid}-k{}", hex::encode(&digest[..16]))
}

/// Whether `id` is a keyed run's ([`keyed_run_id`]: an idempotency key's
/// or a webhook call's): the record that refuses a repeat or a replay.
pub fn is_keyed_run_id(id: &str) -> bool {
    id.contains("-k")
}

/// How long retention keeps a keyed run at least, from its fire: a webhook
/// call's timestamp is at most the widest tolerance (3,600 s) from the
/// fire, and its replay must be refused until that timestamp plus the
/// widest tolerance.
pub const KEYED_RUN_HOLD_MS: Millis = 2 * 3_600_000;

/// A keyed run that has ended and is still held ([`KEYED_RUN_HOLD_MS`]):
/// retention keeps it, so the leader counts it in its namespace's
/// `open_runs` and `open_bytes` until its hold ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptRun {
    pub namespace: String,
    pub fired_at: Millis,
    /// Its params' and payload's bytes.
    pub bytes: u64,
}

impl KeptRun {
    /// The kept record of run `id`, if it is a keyed run held at `since`.
    pub fn of(id: &str, namespace: &str, fired_at: Millis, params: Option<&str>, payload: Option<&str>, since: Millis) -> Option<KeptRun> {
        (is_keyed_run_id(id) && fired_at >= since).then(|| KeptRun {
            namespace: namespace.to_string(),
            fired_at,
            bytes: (params.map_or(0, str::len) + payload.map_or(0, str::len)) as u64,
        })
    }
}

/// The id of the dependency run of `job_uid` at the upstream instant
/// `scheduled_at`: one per (job, instant), however many upstream runs of
/// that instant make it, and apart from the job's scheduled and manual ids
/// (a job with a schedule and upstreams has both).
pub fn dep_run_id(job_uid: &str, scheduled_at: Millis) -> String {
    format!("{job_uid}-d{scheduled_at}")
}

/// The runs that may decide a dependency run of the instant `at`, per
/// edge in edge order: the upstream's scheduled run and its own dependency
/// run of the instant, and the run that made this one if it is the
/// upstream's (a manual or keyed run).
pub fn upstream_candidates(after: &gnomon_core::deps::RunAfter, at: Millis) -> Vec<Vec<String>> {
    after
        .edges
        .iter()
        .map(|e| {
            let mut ids = vec![run_id(&e.uid, at), dep_run_id(&e.uid, at)];
            if e.uid == after.of_uid && !ids.contains(&after.of) {
                ids.push(after.of.clone());
            }
            ids
        })
        .collect()
}

/// A run's upstream record read from its stored JSON text: text that is
/// not one is a corrupt record, never "no upstream".
pub fn decode_upstream(text: &str) -> Result<Arc<RunAfter>, crate::StoreError> {
    serde_json::from_str(text).map(Arc::new).map_err(|e| crate::StoreError::Corrupt(format!("run upstream {text:?}: {e}")))
}

/// A run's upstream record as serde writes and reads it: the same JSON
/// text the stores keep (a string, or none), so an encoded [`NewRun`]
/// (the Raft log's) is what it was when the field was that text.
pub mod upstream_json {
    use std::sync::Arc;

    use gnomon_core::deps::RunAfter;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Arc<RunAfter>>, s: S) -> Result<S::Ok, S::Error> {
        v.as_deref().map(RunAfter::to_json).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Arc<RunAfter>>, D::Error> {
        Option::<String>::deserialize(d)?.map(|t| super::decode_upstream(&t).map_err(serde::de::Error::custom)).transpose()
    }
}

/// A run's live attempt and the worker it was assigned to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveAttempt {
    pub run_id: String,
    pub attempt: u32,
    pub worker: String,
    /// When the leader assigned it (the leader's clock).
    pub assigned_at: Millis,
    /// When its worker reported it started (the worker's clock), once it has.
    pub started_at: Option<Millis>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewRun {
    pub job_uid: String,
    pub namespace: String,
    pub job: String,
    pub scheduled_at: Millis,
    pub fired_at: Millis,
    /// `Pending` for a fire, `Skipped` for a recorded misfire or overlap skip.
    pub state: RunState,
    pub reason: Option<String>,
    pub manual: bool,
    /// The idempotency key of a manual run started with one: its id comes
    /// from the key, not the instant ([`keyed_run_id`]).
    #[serde(default)]
    pub key: Option<String>,
    /// The values of the run's parameters, a JSON object (the job's
    /// defaults with what its trigger set); `None` for a job without
    /// params.
    #[serde(default)]
    pub params: Option<String>,
    /// What started the run handed it: a webhook call's body (UTF-8, at
    /// most 64 KiB); `None` for every other run.
    #[serde(default)]
    pub payload: Option<String>,
    /// A dependency run's record of the run that made it and the edges
    /// that decide it; its id is then [`dep_run_id`]. `None` for every
    /// other run. Stored, and encoded in the Raft log, as its JSON text
    /// ([`upstream_json`]).
    #[serde(default, with = "upstream_json")]
    pub upstream: Option<Arc<RunAfter>>,
}

impl NewRun {
    /// A run with no field beyond the first shape of a fire (no key, no
    /// params, no payload, no edges): how the Raft log has always encoded it.
    pub fn is_plain(&self) -> bool {
        self.key.is_none() && self.params.is_none() && self.payload.is_none() && self.upstream.is_none()
    }

    pub fn id(&self) -> String {
        if self.upstream.is_some() {
            dep_run_id(&self.job_uid, self.scheduled_at)
        } else if let (true, Some(key)) = (self.manual, &self.key) {
            keyed_run_id(&self.job_uid, key)
        } else if self.manual {
            manual_run_id(&self.job_uid, self.scheduled_at)
        } else {
            run_id(&self.job_uid, self.scheduled_at)
        }
    }
}

/// Moves a job's `last_scheduled_at` forward (never backwards).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobAdvance {
    pub job_uid: String,
    pub last_scheduled_at: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FireOutcome {
    Created,
    /// A run for that `(job, scheduled_at)` already existed; nothing changed.
    Existed,
}

/// A compare-and-swap on a run's `(state, attempt)`, with the attempt record
/// change that goes with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub run_id: String,
    pub from: RunState,
    pub from_attempt: u32,
    pub to: RunState,
    pub to_attempt: u32,
    pub reason: Option<String>,
    pub next_attempt_at: Option<Millis>,
    pub attempt: Option<AttemptChange>,
    pub at: Millis,
    /// Notifications written with the transition, only if it applies
    /// (insert-or-ignore by id).
    #[serde(default)]
    pub notify: Vec<NewNotification>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AttemptChange {
    /// A new attempt was assigned to a worker under a token.
    Assign { attempt: u32, worker: String, token: u64 },
    /// The worker started it.
    Start { attempt: u32 },
    /// It ended. `started_at` is when the worker started it, for an end
    /// recorded without a separate `Start` (a short attempt whose start and
    /// end reach the leader together); an attempt with no start time gets
    /// this one, or else the end time.
    End { attempt: u32, state: AttemptState, exit_code: Option<i32>, output: String, started_at: Option<Millis> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CancelOutcome {
    /// The run had not started and is now `cancelled`.
    Cancelled,
    /// The run has a live attempt; the leader will stop it.
    Requested,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunRecord {
    pub id: String,
    #[serde(skip)]
    pub seq: i64,
    #[serde(skip)]
    pub job_uid: String,
    pub job: String,
    pub namespace: String,
    pub scheduled_at: Millis,
    pub fired_at: Millis,
    pub state: RunState,
    pub attempt: u32,
    pub reason: Option<String>,
    pub next_attempt_at: Option<Millis>,
    pub manual: bool,
    pub cancel_requested: bool,
    pub updated_at: Millis,
    /// The values of the run's parameters, a JSON object; `None` for a run
    /// of a job without params.
    pub params: Option<String>,
    /// The body of the webhook call that started the run; `None` for other
    /// runs.
    pub payload: Option<String>,
    /// A dependency run's origin and edges (see [`NewRun::upstream`]).
    #[serde(with = "upstream_json")]
    pub upstream: Option<Arc<RunAfter>>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptRecord {
    pub attempt: u32,
    pub worker: String,
    pub token: u64,
    pub state: AttemptState,
    pub assigned_at: Millis,
    pub started_at: Option<Millis>,
    pub ended_at: Option<Millis>,
    pub exit_code: Option<i32>,
    pub output: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunDetail {
    pub run: RunRecord,
    pub attempts: Vec<AttemptRecord>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFilter {
    pub namespace: Option<String>,
    pub job: Option<String>,
    pub state: Option<RunState>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunPage {
    pub runs: Vec<RunRecord>,
    pub next_cursor: Option<i64>,
}

/// The run fields a [`Transition`] changes, borrowed from a store's own
/// record type, so every store applies a transition by the same rules.
pub struct RunCas<'a> {
    pub state: &'a mut RunState,
    pub attempt: &'a mut u32,
    pub reason: &'a mut Option<String>,
    pub next_attempt_at: &'a mut Option<Millis>,
    pub updated_at: &'a mut Millis,
    pub cancel_requested: &'a mut bool,
}

/// A store's own run record, whose transition fields a [`Transition`]
/// changes: each store's record type lends them as a [`RunCas`].
pub trait RunCasFields {
    fn cas(&mut self) -> RunCas<'_>;
}

impl Transition {
    /// Refuses a batch holding a move the run lifecycle does not allow
    /// (every store checks this before writing anything).
    pub fn check_lifecycle(batch: &[Transition]) -> Result<(), crate::StoreError> {
        match batch.iter().find(|t| !t.from.can_become(t.to)) {
            Some(t) => Err(crate::StoreError::InvalidTransition { run: t.run_id.clone(), from: t.from.to_string(), to: t.to.to_string() }),
            None => Ok(()),
        }
    }

    /// The compare-and-swap: applies this transition if the run is in
    /// `(from, from_attempt)` and says whether it did.
    pub fn apply_to(&self, run: &mut impl RunCasFields) -> bool {
        let r = run.cas();
        if *r.state != self.from || *r.attempt != self.from_attempt {
            return false;
        }
        *r.state = self.to;
        *r.attempt = self.to_attempt;
        if self.reason.is_some() {
            *r.reason = self.reason.clone();
        }
        *r.next_attempt_at = self.next_attempt_at;
        *r.updated_at = self.at;
        if self.to.is_terminal() {
            *r.cancel_requested = false;
        }
        true
    }
}

/// A notification to deliver, as the leader writes it with the outcome it
/// tells of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewNotification {
    /// `<run id>/<outcome>/<target index>` ([`gnomon_core::notify::notification_id`]).
    pub id: String,
    pub run_id: String,
    pub namespace: String,
    pub job: String,
    /// `failed`, `succeeded`, `late` or `recovered`.
    pub outcome: String,
    /// The target as the job named it then (JSON of a `NotifyTarget`).
    pub target: String,
    pub created_at: Millis,
}

/// Where a notification's delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NotificationState {
    /// To be sent (again) at `next_at`.
    Pending,
    /// Delivered (the receiver answered 2xx).
    Sent,
    /// Given up on: attempts used up, or the receiver refused it for good.
    Failed,
    /// Not sent, and rightly so (a success that was no recovery).
    Skipped,
}

impl NotificationState {
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationState::Pending => "pending",
            NotificationState::Sent => "sent",
            NotificationState::Failed => "failed",
            NotificationState::Skipped => "skipped",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Pending, Self::Sent, Self::Failed, Self::Skipped].into_iter().find(|x| x.as_str() == s)
    }
}

/// A stored notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notification {
    pub id: String,
    pub run_id: String,
    pub namespace: String,
    pub job: String,
    pub outcome: String,
    pub target: String,
    pub state: NotificationState,
    /// Deliveries tried so far.
    pub attempts: u32,
    /// When the next delivery is due (pending ones).
    pub next_at: Millis,
    pub last_error: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

impl Notification {
    pub fn new(n: &NewNotification) -> Notification {
        Notification {
            id: n.id.clone(),
            run_id: n.run_id.clone(),
            namespace: n.namespace.clone(),
            job: n.job.clone(),
            outcome: n.outcome.clone(),
            target: n.target.clone(),
            state: NotificationState::Pending,
            attempts: 0,
            next_at: n.created_at,
            last_error: None,
            created_at: n.created_at,
            updated_at: n.created_at,
        }
    }
}

/// What one delivery came to: the notification's new state, attempts and
/// due time, written with a compare on the attempts it had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: String,
    /// The attempts it had when this delivery began (the compare).
    pub attempts_before: u32,
    pub state: NotificationState,
    pub attempts: u32,
    pub next_at: Millis,
    pub error: Option<String>,
    pub at: Millis,
}
