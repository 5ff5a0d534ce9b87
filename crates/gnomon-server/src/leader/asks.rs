//! Asks: the API's requests for runs (triggers, keyed triggers, webhook
//! calls) and for backfills, as planners of the turn. An ask is queued in
//! the [`Inbox`](gnomon_engine::inbox::Inbox) when it arrives; the next turn reads
//! what it needs (its job, and the run its key names), plans its runs into
//! the turn's one write, and replies once that write is applied.
//!
//! - Ids come from what a run is for: a key's run from (job, key), a
//!   manual run from its job and an instant no schedule uses, dependency
//!   runs from their upstream run's instant. A call that creates nothing
//!   (a key's repeat) writes nothing.
//! - Admission counts what the turn already planned, so two asks in one
//!   turn cannot pass a quota together that each alone would not.
//! - Two asks of one key in one turn: the second waits for the next turn,
//!   where it reads the run the first made.

use gnomon_backend::{BackfillRecord, NewBackfill};

use super::admission::Ask as Quantity;
use super::plan::TurnPlan;
use super::*;

/// How many turns a trigger may take to find free instants for its runs.
const MAX_TRIGGER_TURNS: u32 = 100;

type TriggerReply = oneshot::Sender<std::result::Result<Triggered, TriggerError>>;
type BackfillReply = oneshot::Sender<std::result::Result<BackfillRecord, TriggerError>>;

/// A request waiting for a turn.
pub(super) enum Ask {
    Trigger(PendingTrigger),
    Backfill { new: NewBackfill, reply: BackfillReply },
}

impl Ask {
    /// Answers the ask with `e`, having made nothing (the inbox had no
    /// room for it).
    pub(super) fn refuse(self, e: StoreError, bound: &'static str) {
        metrics::counter!("gnomon_leader_inbox_refused_total", "bound" => bound).increment(1);
        match self {
            Ask::Trigger(pending) => {
                let _ = pending.reply.send(Err(e.into()));
            }
            Ask::Backfill { reply, .. } => {
                let _ = reply.send(Err(e.into()));
            }
        }
    }
}

/// A trigger, with what earlier turns made of it.
pub(super) struct PendingTrigger {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) request: TriggerRequest,
    pub(super) reply: TriggerReply,
    /// Runs created by earlier turns (an instant it chose was taken).
    pub(super) created: Vec<String>,
    pub(super) turns: u32,
}

impl PendingTrigger {
    pub(super) fn new(namespace: String, name: String, request: TriggerRequest, reply: TriggerReply) -> Self {
        Self { namespace, name, request, reply, created: Vec::new(), turns: 0 }
    }
}

/// What a trigger's reads came to.
enum Read {
    /// Answered by the reads alone: nothing to write.
    Answer(std::result::Result<Triggered, TriggerError>),
    /// Its job as stored, and its params resolved against the job's
    /// declaration.
    Plan(Box<JobRecord>, Option<String>),
}

/// A trigger read and ready to plan: its job as stored, and its params
/// resolved against the job's declaration.
pub(super) struct ReadTrigger {
    pending: PendingTrigger,
    job: Box<JobRecord>,
    params: Option<String>,
}

/// What a turn plans for one ask.
pub(super) enum PlannedAsk {
    /// Manual runs: the first `roots` are the trigger's own, the rest
    /// their dependency runs.
    Trigger {
        pending: PendingTrigger,
        keyed: bool,
        roots: usize,
        runs: Vec<NewRun>,
    },
    Backfill {
        new: NewBackfill,
        reply: BackfillReply,
    },
}

impl LeaderRuntime {
    /// Gathers what the queued asks need from the store: their jobs (with
    /// the job feed caught up, so a downstream job written just before the
    /// trigger gets its run) and the runs their keys name. Asks answered
    /// by the reads alone (no such job, bad params, a key's repeat) are
    /// answered here and write nothing. Should a read fail, nothing was
    /// written: every ask goes back to the inbox, for the rebuilt state.
    pub(super) async fn gather_asks(&mut self) -> Result<(Vec<ReadTrigger>, Vec<(NewBackfill, BackfillReply)>)> {
        let asks = self.inbox.take_asks();
        if asks.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        if asks.iter().any(|a| matches!(a, Ask::Trigger(_))) {
            if let Err(e) = self.sync_jobs().await {
                self.inbox.put_back_asks(asks);
                return Err(e);
            }
        }
        let (mut triggers, mut backfills) = (Vec::new(), Vec::new());
        let mut asks = asks.into_iter();
        while let Some(ask) = asks.next() {
            let pending = match ask {
                Ask::Backfill { new, reply } => {
                    backfills.push((new, reply));
                    continue;
                }
                Ask::Trigger(pending) => pending,
            };
            // A caller that stopped waiting (it answered an error, or went
            // away) takes its ask back: nothing of it is written.
            if pending.reply.is_closed() {
                pending.request.claim.withdraw();
            }
            if pending.request.claim.is_withdrawn() {
                metrics::counter!("gnomon_asks_withdrawn_total").increment(1);
                continue;
            }
            match self.read_trigger(&pending).await {
                Ok(Read::Answer(answer)) => {
                    let _ = pending.reply.send(answer);
                }
                Ok(Read::Plan(job, params)) => triggers.push(ReadTrigger { pending, job, params }),
                Err(e) => {
                    let mut back: Vec<Ask> = triggers.into_iter().map(|t: ReadTrigger| Ask::Trigger(t.pending)).collect();
                    back.extend(backfills.into_iter().map(|(new, reply)| Ask::Backfill { new, reply }));
                    back.push(Ask::Trigger(pending));
                    back.extend(asks);
                    self.inbox.put_back_asks(back);
                    return Err(e);
                }
            }
        }
        Ok((triggers, backfills))
    }

    /// What the store says of a trigger: its answer already, or its job
    /// and resolved params to plan with.
    async fn read_trigger(&mut self, pending: &PendingTrigger) -> Result<Read> {
        let Some(job) = self.store.get_job(&pending.namespace, &pending.name).await? else {
            let e = StoreError::NotFound(format!("job {}/{}", pending.namespace, pending.name));
            return Ok(Read::Answer(Err(e.into())));
        };
        let request = &pending.request;
        if request.origin == Origin::Webhook && job.spec.triggers.webhook.is_none() {
            return Ok(Read::Answer(Err(TriggerError::NoWebhook)));
        }
        let params = match gnomon_core::params::resolve(&job.spec.params, &request.params) {
            Ok(p) => p.map(|p| serde_json::to_string(&p).unwrap_or_default()),
            Err(e) => return Ok(Read::Answer(Err(TriggerError::Params(e)))),
        };
        if let Some(key) = &request.key {
            // What the store holds decides, before anything is planned: a
            // repeat writes nothing, its downstream runs included (they
            // were made with the key's run, at its instant as stored).
            let id = gnomon_backend::keyed_run_id(&job.uid, &stored_key(request.origin, key.clone()));
            if let Some(stored) = self.store.get_run(&id).await? {
                let run = stored.run;
                // The same key with other values, or with another payload,
                // is another request.
                let other_params = !request.params.is_empty() && !sets_the_same(run.params.as_deref(), &request.params);
                let other_payload = request.payload.is_some() && run.payload != request.payload;
                return Ok(Read::Answer(if other_params || other_payload {
                    Err(TriggerError::KeyReused { id })
                } else {
                    Ok(Triggered { ids: vec![id], existed: true })
                }));
            }
        }
        Ok(Read::Plan(Box::new(job), params))
    }

    /// Plans the runs of each trigger read (refused whole when a quota
    /// would be passed) and each backfill asked for into the turn.
    pub(super) fn plan_asks(
        &mut self,
        now: Millis,
        triggers: Vec<ReadTrigger>,
        backfills: Vec<(NewBackfill, BackfillReply)>,
        plan: &mut TurnPlan,
    ) {
        for read in triggers {
            self.plan_trigger(now, read, plan);
        }
        for (new, reply) in backfills {
            let ns = new.namespace.clone();
            let (running, reserved) = self.engine.cache.backfills.of_namespace(&ns);
            let (planned_backfills, planned_instants) = plan.backfills_planned(&ns);
            let admitted = self
                .engine
                .admission
                .admit_backfill(
                    &ns,
                    self.engine.cache.runs.ns_counts(&ns),
                    reserved + planned_instants + plan.runs_planned(&ns),
                    running + planned_backfills,
                    new.total,
                )
                .inspect_err(admission::count_refusal);
            match admitted {
                Err(e) => {
                    let _ = reply.send(Err(e.into()));
                }
                Ok(()) => {
                    plan.count_backfill(&ns, new.total);
                    plan.ask(PlannedAsk::Backfill { new, reply });
                }
            }
        }
    }

    fn plan_trigger(&mut self, now: Millis, read: ReadTrigger, plan: &mut TurnPlan) {
        let ReadTrigger { pending, job, params } = read;
        let template = ManualRun { origin: pending.request.origin, params, payload: pending.request.payload.clone() };
        let at = self.engine.manual_start(&job, now);
        let (roots, keyed) = match &pending.request.key {
            Some(key) => {
                let run = template.run(&job, at, now, Some(stored_key(pending.request.origin, key.clone())));
                if !plan.claim_key(run.id()) {
                    // The same key twice in one turn: the second reads the
                    // first's run next turn.
                    self.inbox.ask_again(Ask::Trigger(pending));
                    return;
                }
                (vec![run], true)
            }
            None => {
                let want = (pending.request.count as usize).saturating_sub(pending.created.len());
                // Consecutive instants, 1 ms apart: a manual run's id is apart
                // from the scheduled runs' (`manual_run_id`), so no schedule,
                // now or after a change, can take one.
                ((at..at + want as Millis).map(|t| template.run(&job, t, now, None)).collect(), false)
            }
        };
        let mut all = roots.clone();
        all.extend(self.engine.dependency_runs(&roots, now, &mut plan.seen));
        // Refused whole, before anything of it is written; what this turn
        // planned already counts.
        let (_, reserved) = self.engine.cache.backfills.of_namespace(&job.namespace);
        let mut counts = self.engine.cache.runs.ns_counts(&job.namespace);
        counts.bytes += plan.bytes_planned(&job.namespace);
        let asked = Quantity::of(&all, roots.len());
        let refused = self
            .engine
            .admission
            .admit(&job.namespace, counts, reserved + plan.runs_planned(&job.namespace), asked)
            .inspect_err(admission::count_refusal);
        if let Err(e) = refused {
            let _ = pending.reply.send(Err(e.into()));
            return;
        }
        // The leader claims the ask before planning it; one its caller
        // withdrew meanwhile is dropped.
        if pending.reply.is_closed() {
            pending.request.claim.withdraw();
        }
        if !pending.request.claim.plan(roots.iter().map(NewRun::id)) {
            metrics::counter!("gnomon_asks_withdrawn_total").increment(1);
            return;
        }
        // Taken now, so a later ask of this turn starts past them.
        self.engine.cache.jobs.manual_taken(&job.uid, at + roots.len() as Millis);
        plan.count_runs(&job.namespace, all.len());
        plan.count_bytes(&job.namespace, asked.bytes);
        plan.ask(PlannedAsk::Trigger { pending, keyed, roots: roots.len(), runs: all });
    }

    /// The ask's write is committed: track what it created, and answer it
    /// (or queue it again for the instants that were taken).
    pub(super) fn apply_ask(&mut self, ask: PlannedAsk, fired: Vec<FireOutcome>, created: Option<bool>, at: Millis) -> Result<()> {
        let now = self.engine.now;
        match ask {
            PlannedAsk::Backfill { new, reply } => {
                if created == Some(true) {
                    let record = BackfillRecord::new(&new, at);
                    self.engine.cache.backfills.add(record.clone(), now);
                    self.update_pressure();
                    let _ = reply.send(Ok(record));
                } else {
                    let _ = reply.send(Err(StoreError::AlreadyExists(format!("backfill {}", new.id)).into()));
                }
                Ok(())
            }
            PlannedAsk::Trigger { mut pending, keyed, roots, mut runs } => {
                let mut fired = fired;
                let first = runs.first().map(NewRun::id).unwrap_or_default();
                let dep_fired = fired.split_off(roots.min(fired.len()));
                self.engine.track_dependency_runs(runs.split_off(roots.min(runs.len())), dep_fired, now);
                let mut taken = false;
                for (run, outcome) in runs.into_iter().zip(fired) {
                    if outcome != FireOutcome::Created {
                        taken = true;
                        continue;
                    }
                    metrics::counter!("gnomon_runs_total", "state" => "pending").increment(1);
                    pending.created.push(self.engine.track_pending(run, now).to_string());
                }
                // What the caller reads next (its namespace's usage) counts
                // what it just made.
                self.update_pressure();
                if keyed && taken {
                    // The store held the run after all, though it read as
                    // absent under this leader's fence: that is not a store
                    // this leader can trust its reads of. Rebuild from it.
                    let e = StoreError::Backend(format!("run {first} was absent when read and present when written"));
                    let _ = pending.reply.send(Err(e.clone().into()));
                    return Err(e);
                }
                if pending.created.len() < pending.request.count as usize && !keyed {
                    pending.turns += 1;
                    if pending.turns >= MAX_TRIGGER_TURNS {
                        let e = StoreError::Backend("could not find free scheduled_at instants for the manual runs".into());
                        let _ = pending.reply.send(Err(e.into()));
                    } else {
                        // Back-to-back triggers may meet an earlier term's
                        // instants: the rest go on in the next turn, past them.
                        self.inbox.ask_again(Ask::Trigger(pending));
                    }
                    return Ok(());
                }
                let ids = std::mem::take(&mut pending.created);
                let _ = pending.reply.send(Ok(Triggered { ids, existed: false }));
                Ok(())
            }
        }
    }
}

/// The key a run is stored under: a manual trigger's as given, a webhook
/// call's in a space of its own that no manual key can name (an
/// `Idempotency-Key` never starts with a space).
fn stored_key(origin: Origin, key: String) -> String {
    match origin {
        Origin::Api => key,
        Origin::Webhook => format!(" hook {key}"),
    }
}

/// Whether a run's params (a JSON object) hold every value `given` sets.
fn sets_the_same(stored: Option<&str>, given: &gnomon_core::params::Params) -> bool {
    let stored: gnomon_core::params::Params = stored.and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default();
    given.iter().all(|(k, v)| stored.get(k) == Some(v))
}

/// What every manual run of one trigger is created with.
struct ManualRun {
    origin: Origin,
    /// The params' values, resolved (JSON).
    params: Option<String>,
    payload: Option<String>,
}

impl ManualRun {
    /// A pending manual run of `job` at the instant `at`, named by the
    /// idempotency key `key` when it has one.
    fn run(&self, job: &JobRecord, at: Millis, now: Millis, key: Option<String>) -> NewRun {
        let reason = match (self.origin, key.is_some()) {
            (Origin::Webhook, _) => "webhook",
            (Origin::Api, true) => "manual trigger (idempotency key)",
            (Origin::Api, false) => "manual trigger",
        };
        NewRun {
            job_uid: job.uid.clone(),
            namespace: job.namespace.clone(),
            job: job.name.clone(),
            scheduled_at: at,
            fired_at: now,
            state: RunState::Pending,
            reason: Some(reason.into()),
            manual: true,
            key,
            params: self.params.clone(),
            payload: self.payload.clone(),
            upstream: None,
        }
    }
}
