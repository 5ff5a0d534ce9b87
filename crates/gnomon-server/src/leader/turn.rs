//! One turn of the leader loop, in three steps:
//!
//! 1. **gather**: poll the store when due, take in the commands waiting
//!    (sessions, worker reports, API asks), and read what the plan will
//!    need (the asks' jobs and keyed runs, the upstream runs of the waiting
//!    runs to decide);
//! 2. **plan**, reading nothing: attempts ended, replaced runs cancelled,
//!    retries due, waiting runs decided, backfill chunks, asks, one chunk
//!    of due fires, worker results and dispatch;
//! 3. **one fenced write** of the whole plan, then apply what it committed
//!    and send the replies, acks and assignments ([`super::plan`]).

use super::plan::TurnPlan;
use super::*;

impl LeaderRuntime {
    pub(super) async fn turn(&mut self) -> Result<()> {
        let result = self.turn_inner().await;
        self.stats.end_turn();
        result
    }

    async fn turn_inner(&mut self) -> Result<()> {
        let now = self.engine.now;
        // Gather.
        if self.engine.cadence.poll_due(now) {
            self.poll_store().await?;
            self.engine.cadence.polled(now);
        }
        self.handle_commands().await?;
        self.update_pressure();
        let (triggers, backfills) = self.gather_asks().await?;
        let (undecided, upstreams) = self.gather_releases().await?;
        // Plan. The order is the order of the write: attempts ended first,
        // then what frees or fills the ready queue, then results and
        // dispatch (which may place the fire's pending runs).
        let mut plan = TurnPlan::default();
        self.plan_expiries(now, &mut plan);
        self.engine.plan_cancels(now, &mut plan);
        self.engine.plan_retries(now, &mut plan);
        self.engine.plan_releases(undecided, &upstreams, now, &mut plan);
        self.engine.plan_backfills(now, &mut plan);
        self.plan_asks(now, triggers, backfills, &mut plan);
        // A namespace under red backpressure has its due jobs wait (they
        // are not dropped); the others fire, one chunk a turn: a herd spans
        // several turns, each with its results and assignments, so the
        // workers run chunk N while the store writes chunk N+1.
        self.engine.plan_fire(now, self.engine.reports.reports().len(), &mut plan);
        plan.events = self.engine.prepare_worker_events();
        plan.dispatch = self.engine.prepare_dispatch(now);
        // One write, then apply.
        self.write_plan(plan, now).await
    }

    pub(super) async fn poll_store(&mut self) -> Result<()> {
        self.sync_jobs().await?;
        self.load_backfills().await?;
        for run in self.store.cancel_requests().await? {
            if self.engine.cache.runs.holder(&run.id).is_some() && !self.engine.cache.runs.cancel_sent(&run.id, run.attempt) {
                self.send_cancel(&run.id, run.attempt);
            }
        }
        Ok(())
    }

    /// Takes in the job writes since the feed position the cache has read.
    pub(super) async fn sync_jobs(&mut self) -> Result<()> {
        let changes = self.store.job_changes(self.engine.cache.jobs.feed_seq()).await?;
        // An upstream deleted, paused or changed may no longer make the
        // runs some waiting run expects of it: those runs are decided again.
        let mut touched: HashSet<String> = HashSet::default();
        for uid in changes.deleted {
            self.engine.cache.jobs.remove(&uid);
            touched.insert(uid);
        }
        for job in changes.upserted {
            let changed = self.engine.cache.jobs.get(&job.uid).is_none_or(|j| j.record.version != job.version);
            if changed {
                touched.insert(job.uid.clone());
                self.engine.upsert_job(job);
            }
        }
        self.engine.cache.runs.reconsider_waiting_on(&touched);
        self.engine.cache.jobs.set_feed_seq(changes.seq);
        Ok(())
    }

    pub(super) async fn handle_commands(&mut self) -> Result<()> {
        while let Some(cmd) = self.inbox.next_deferred() {
            self.on_command(cmd).await?;
        }
        while let Ok(cmd) = self.commands.try_recv() {
            self.on_command(cmd).await?;
        }
        while let Ok(registered) = self.lease_events.1.try_recv() {
            self.on_lease_registered(registered)?;
        }
        let now = self.engine.now;
        if self.engine.cadence.poll_due(now) {
            self.poll_store().await?;
            self.engine.cadence.polled(now);
        }
        Ok(())
    }

    pub(super) async fn on_command(&mut self, cmd: LeaderCommand) -> Result<()> {
        // While the cache is stale, what needs it waits for the rebuild;
        // heartbeats are still acked (the worker's lease does not depend on
        // the store) and reports queue in the inbox.
        if self.engine.freshness.is_stale() {
            match cmd {
                // The rebuild loads every run as the store has it.
                LeaderCommand::RunChanged { .. } => self.engine.cadence.poll_now(),
                LeaderCommand::Trigger { .. } | LeaderCommand::Backfill { .. } | LeaderCommand::SessionOpen { .. } => {
                    if let Err(cmd) = self.inbox.defer(cmd) {
                        refuse(*cmd, "held");
                    }
                }
                cmd => return self.on_fresh_command(cmd).await,
            }
            return Ok(());
        }
        self.on_fresh_command(cmd).await
    }

    async fn on_fresh_command(&mut self, cmd: LeaderCommand) -> Result<()> {
        match cmd {
            LeaderCommand::Nudge => self.engine.cadence.poll_now(),
            LeaderCommand::RunChanged { run_id } => {
                self.engine.cadence.poll_now();
                if self.engine.cache.runs.contains(run_id.as_str()) {
                    self.reload_run(&run_id).await?;
                }
            }
            // Planned by the next turn, and answered once its write is
            // applied.
            LeaderCommand::Trigger { namespace, name, request, reply } => {
                let ask = asks::Ask::Trigger(asks::PendingTrigger::new(namespace, name, request, reply));
                if let Err(ask) = self.inbox.ask(ask) {
                    ask.refuse(StoreError::Unavailable(BUSY.into()), "asks");
                }
            }
            LeaderCommand::Backfill { new, reply } => {
                if let Err(ask) = self.inbox.ask(asks::Ask::Backfill { new, reply }) {
                    ask.refuse(StoreError::Unavailable(BUSY.into()), "asks");
                }
            }
            LeaderCommand::SessionOpen { hello, namespaces, outbound, reply } => {
                let worker = hello.worker_id.clone();
                let old = self.engine.sessions.store_lease(&worker);
                let result = self.open_session(*hello, namespaces, outbound);
                // The store lease (etcd) is registered off the turn: the
                // answer comes back as a lease event. Meanwhile the
                // in-memory lease applies.
                if let (Ok(session), Some(leases)) = (&result, self.leases.clone()) {
                    let ttl = Duration::from_millis(u64::try_from(self.engine.config.lease_ttl_ms).unwrap_or(10_000));
                    let (fence, events, session) = (self.engine.fence.clone(), self.lease_events.0.clone(), session.clone());
                    tokio::spawn(async move {
                        let result = leases.register(&fence, &worker, ttl).await;
                        let _ = events.send(LeaseRegistered { worker, session, old, result });
                    });
                }
                let _ = reply.send(result);
            }
            LeaderCommand::FromWorker { session, msg } => self.on_worker_message(&session, msg),
            LeaderCommand::SessionClosed { session } => {
                self.outlets.remove(&session);
                if let Some(worker) = self.engine.sessions.stream_closed(&session) {
                    tracing::info!(worker = %worker, "worker session stream closed; its lease keeps running");
                }
            }
        }
        Ok(())
    }

    /// A session's store lease is registered (or could not be): it becomes
    /// the session's if the session is still the one it was asked for, and
    /// is released otherwise; the worker's lease before it is released.
    /// A fenced registration means a newer leader: the error says so.
    pub(super) fn on_lease_registered(&mut self, r: LeaseRegistered) -> Result<()> {
        let LeaseRegistered { worker, session, old, result } = r;
        let lease = match result {
            Ok(lease) => lease,
            Err(e @ StoreError::Fenced { .. }) => return Err(e),
            Err(e) => {
                tracing::warn!(worker = %worker, error = %e, "cannot register the session lease in the store; the in-memory lease still applies");
                return Ok(());
            }
        };
        let Some(leases) = self.leases.clone() else { return Ok(()) };
        let current = self.engine.sessions.get(&worker).is_some_and(|s| s.session_id == session);
        let stale: Vec<i64> = if current {
            self.engine.sessions.set_store_lease(&worker, lease, self.engine.now);
            old.filter(|o| *o != lease).into_iter().collect()
        } else {
            vec![lease]
        };
        if !stale.is_empty() {
            tokio::spawn(async move {
                for lease in stale {
                    let _ = leases.release(lease).await;
                }
            });
        }
        Ok(())
    }

    pub(super) async fn wait_for_work(&mut self) -> Option<LeaderExit> {
        // The wait is a step of its own: how long to sleep counts from now.
        self.tick();
        self.publish_view();
        if !self.engine.reports.reports().is_empty()
            || self.inbox.has_asks()
            || self.engine.cache.runs.has_undecided()
            || (self.engine.cache.runs.ready_len() > 0 && self.engine.dispatch_room() > 0 && self.engine.ready_has_dispatchable())
        {
            tokio::task::yield_now().await;
            return self.should_stop();
        }
        let now = self.engine.now;
        let mut wake = now + MAX_TURN.as_millis() as i64;
        let admission = &self.engine.admission;
        if let Some(due) = self.engine.cache.jobs.next_due(|ns| admission.defers(ns)) {
            wake = wake.min(due);
        }
        if let Some(due) = self.engine.cache.runs.next_retry_at() {
            wake = wake.min(due);
        }
        let sleep = Duration::from_millis(u64::try_from(wake - now).unwrap_or(0));
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            Some(cmd) = self.commands.recv() => {
                self.tick();
                if let Err(e) = self.on_command(cmd).await {
                    self.mark_stale(&e);
                }
                // Group commit without a timer: let the session tasks forward
                // what they have already read, then the turn drains the queue
                // and one store write carries all of it. While that write
                // runs, more results queue up for the next one. (A fixed 2 ms
                // window only added latency: it did not raise throughput.)
                tokio::task::yield_now().await;
            }
            Some((worker, lease)) = next_from(&mut self.lease_deletions) => {
                self.tick();
                self.engine.on_lease_deleted(&worker, lease);
            }
            Some(registered) = self.lease_events.1.recv() => {
                self.tick();
                if let Err(e) = self.on_lease_registered(registered) {
                    self.mark_stale(&e);
                }
            }
            Some(()) = next_from(&mut self.job_signal) => self.engine.cadence.poll_now(),
            _ = self.lost.changed() => {}
            _ = self.shutdown.changed() => {}
        }
        self.should_stop()
    }
}

/// What a caller hears when the leader's inbox is full.
const BUSY: &str = "the leader has too many requests waiting; retry shortly";

/// Refuses a command the inbox has no room for: its caller hears the
/// leader is busy (a trigger's 503 says nothing was made), and nothing
/// else happens.
fn refuse(cmd: LeaderCommand, bound: &'static str) {
    metrics::counter!("gnomon_leader_inbox_refused_total", "bound" => bound).increment(1);
    match cmd {
        LeaderCommand::Trigger { reply, .. } => {
            let _ = reply.send(Err(StoreError::Unavailable(BUSY.into()).into()));
        }
        LeaderCommand::Backfill { reply, .. } => {
            let _ = reply.send(Err(StoreError::Unavailable(BUSY.into()).into()));
        }
        LeaderCommand::SessionOpen { reply, .. } => {
            let _ = reply.send(Err(tonic::Status::unavailable(BUSY)));
        }
        LeaderCommand::Nudge
        | LeaderCommand::RunChanged { .. }
        | LeaderCommand::FromWorker { .. }
        | LeaderCommand::SessionClosed { .. } => {}
    }
}
