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
        let now = self.clock.now_millis();
        // Gather.
        if self.cadence.poll_due(now) {
            self.poll_store().await?;
            self.cadence.polled(now);
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
        self.plan_cancels(now, &mut plan);
        self.plan_retries(now, &mut plan);
        self.plan_releases(undecided, &upstreams, now, &mut plan);
        self.plan_backfills(now, &mut plan);
        self.plan_asks(now, triggers, backfills, &mut plan);
        // A namespace under red backpressure has its due jobs wait (they
        // are not dropped); the others fire, one chunk a turn: a herd spans
        // several turns, each with its results and assignments, so the
        // workers run chunk N while the store writes chunk N+1.
        self.plan_fire(now, &mut plan);
        plan.events = self.prepare_worker_events();
        plan.dispatch = self.prepare_dispatch(now);
        // One write, then apply.
        self.write_plan(plan, now).await
    }

    pub(super) async fn poll_store(&mut self) -> Result<()> {
        self.sync_jobs().await?;
        self.load_backfills().await?;
        for run in self.store.cancel_requests().await? {
            if self.cache.runs.holder(&run.id).is_some() && !self.cache.runs.cancel_sent(&run.id, run.attempt) {
                self.send_cancel(&run.id, run.attempt);
            }
        }
        Ok(())
    }

    /// Takes in the job writes since the feed position the cache has read.
    pub(super) async fn sync_jobs(&mut self) -> Result<()> {
        let changes = self.store.job_changes(self.cache.jobs.feed_seq()).await?;
        // An upstream deleted, paused or changed may no longer make the
        // runs some waiting run expects of it: those runs are decided again.
        let mut touched: HashSet<String> = HashSet::default();
        for uid in changes.deleted {
            self.cache.jobs.remove(&uid);
            touched.insert(uid);
        }
        for job in changes.upserted {
            let changed = self.cache.jobs.get(&job.uid).is_none_or(|j| j.record.version != job.version);
            if changed {
                touched.insert(job.uid.clone());
                self.upsert_job(job);
            }
        }
        self.cache.runs.reconsider_waiting_on(&touched);
        self.cache.jobs.set_feed_seq(changes.seq);
        Ok(())
    }

    pub(super) async fn handle_commands(&mut self) -> Result<()> {
        while let Some(cmd) = self.inbox.next_deferred() {
            self.on_command(cmd).await?;
        }
        while let Ok(cmd) = self.commands.try_recv() {
            self.on_command(cmd).await?;
        }
        let now = self.clock.now_millis();
        if self.cadence.poll_due(now) {
            self.poll_store().await?;
            self.cadence.polled(now);
        }
        Ok(())
    }

    pub(super) async fn on_command(&mut self, cmd: LeaderCommand) -> Result<()> {
        // While the cache is stale, what needs it waits for the rebuild;
        // heartbeats are still acked (the worker's lease does not depend on
        // the store) and reports queue in the inbox.
        if self.freshness.is_stale()
            && matches!(
                cmd,
                LeaderCommand::Trigger { .. }
                    | LeaderCommand::Backfill { .. }
                    | LeaderCommand::SessionOpen { .. }
                    | LeaderCommand::RunChanged { .. }
            )
        {
            self.inbox.defer(cmd);
            return Ok(());
        }
        match cmd {
            LeaderCommand::Nudge => self.cadence.poll_now(),
            LeaderCommand::RunChanged { run_id } => {
                self.cadence.poll_now();
                if self.cache.runs.contains(run_id.as_str()) {
                    self.reload_run(&run_id).await?;
                }
            }
            // Planned by the next turn, and answered once its write is
            // applied.
            LeaderCommand::Trigger { namespace, name, request, reply } => {
                self.inbox.ask(asks::Ask::Trigger(asks::PendingTrigger::new(namespace, name, request, reply)));
            }
            LeaderCommand::Backfill { new, reply } => self.inbox.ask(asks::Ask::Backfill { new, reply }),
            LeaderCommand::SessionOpen { hello, namespaces, outbound, reply } => {
                let worker = hello.worker_id.clone();
                let old_lease = self.sessions.store_lease(&worker);
                let result = self.open_session(*hello, namespaces, outbound);
                if result.is_ok() {
                    if let Some(leases) = self.leases.clone() {
                        let ttl = Duration::from_millis(u64::try_from(self.config.lease_ttl_ms).unwrap_or(10_000));
                        match leases.register(&self.fence, &worker, ttl).await {
                            Ok(lease) => {
                                self.sessions.set_store_lease(&worker, lease, self.clock.now_millis());
                                if let Some(old) = old_lease.filter(|o| *o != lease) {
                                    tokio::spawn(async move { leases.release(old).await });
                                }
                            }
                            Err(e @ StoreError::Fenced { .. }) => {
                                let _ = reply.send(Err(tonic::Status::unavailable("leadership changed; reconnect")));
                                return Err(e);
                            }
                            Err(e) => {
                                tracing::warn!(worker = %worker, error = %e, "cannot register the session lease in the store; the in-memory lease still applies")
                            }
                        }
                    }
                }
                let _ = reply.send(result);
            }
            LeaderCommand::FromWorker { session, msg } => self.on_worker_message(&session, msg),
            LeaderCommand::SessionClosed { session } => {
                if let Some(worker) = self.sessions.stream_closed(&session) {
                    tracing::info!(worker = %worker, "worker session stream closed; its lease keeps running");
                }
            }
        }
        Ok(())
    }

    pub(super) async fn wait_for_work(&mut self) -> Option<LeaderExit> {
        self.publish_view();
        if !self.inbox.reports().is_empty()
            || self.inbox.has_asks()
            || self.cache.runs.has_undecided()
            || (self.cache.runs.ready_len() > 0 && self.dispatch_room() > 0 && self.ready_has_dispatchable())
        {
            tokio::task::yield_now().await;
            return self.should_stop();
        }
        let now = self.clock.now_millis();
        let mut wake = now + MAX_TURN.as_millis() as i64;
        let admission = &self.admission;
        if let Some(due) = self.cache.jobs.next_due(|ns| admission.defers(ns)) {
            wake = wake.min(due);
        }
        if let Some(due) = self.cache.runs.next_retry_at() {
            wake = wake.min(due);
        }
        let sleep = Duration::from_millis(u64::try_from(wake - now).unwrap_or(0));
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            Some(cmd) = self.commands.recv() => {
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
            Some((worker, lease)) = next_from(&mut self.lease_deletions) => self.on_lease_deleted(&worker, lease),
            Some(()) = next_from(&mut self.job_signal) => self.cadence.poll_now(),
            _ = self.lost.changed() => {}
            _ = self.shutdown.changed() => {}
        }
        self.should_stop()
    }
}
