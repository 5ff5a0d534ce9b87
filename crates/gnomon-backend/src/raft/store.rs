//! [`RaftStore`] as a [`Store`]: writes proposed to the log (through
//! the leader) and applied by every member's state machine; reads from the
//! local state machine's SQLite, after a read barrier unless stale reads
//! were asked for.

use std::sync::Arc;

use async_trait::async_trait;
use gnomon_core::spec::JobSpec;
use gnomon_core::Millis;

use super::types::{Command, Reply};
use super::{Member, RaftStore};
use crate::*;

impl RaftStore {
    pub fn new(member: Arc<Member>) -> RaftStore {
        RaftStore { member, stale: false }
    }

    /// Proposes a command and takes the value out of the reply it must
    /// give (`take` hands any other reply back).
    pub(super) async fn ask<T>(&self, command: Command, take: impl FnOnce(Reply) -> Result<T, Reply> + Send) -> Result<T, StoreError> {
        take(self.member.propose(command).await?).map_err(|r| r.unexpected())
    }

    pub(super) async fn read(&self) -> Result<Arc<crate::sqlite::SqliteStore>, StoreError> {
        if !self.stale {
            self.member.read_barrier().await?;
        }
        Ok(self.member.current.store())
    }
}

#[async_trait]
impl JobStore for RaftStore {
    async fn put_job(&self, spec: &JobSpec, precondition: Precondition, now: Millis) -> Result<JobRecord, StoreError> {
        let uid = format!("{:016x}", rand::random::<u64>());
        let spec = Box::new(spec.clone());
        // The check is made as the entry applies; a job without edges has
        // none to make, and its entry stays readable by older members.
        let command = match spec.after.is_empty() {
            true => Command::PutJob { spec, precondition, now, uid },
            false => Command::PutJobChecked { spec, precondition, now, uid },
        };
        self.ask(command, |r| match r {
            Reply::Job(j) => Ok(*j),
            r => Err(r),
        })
        .await
    }

    async fn set_job_paused(&self, namespace: &str, name: &str, paused: bool, now: Millis) -> Result<JobRecord, StoreError> {
        self.ask(Command::SetJobPaused { namespace: namespace.into(), name: name.into(), paused, now }, |r| match r {
            Reply::Job(j) => Ok(*j),
            r => Err(r),
        })
        .await
    }

    async fn delete_job(&self, namespace: &str, name: &str, precondition: Precondition) -> Result<(), StoreError> {
        self.ask(Command::DeleteJobChecked { namespace: namespace.into(), name: name.into(), precondition }, |r| match r {
            Reply::Done => Ok(()),
            r => Err(r),
        })
        .await
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>, StoreError> {
        self.read().await?.get_job(namespace, name).await
    }

    async fn list_jobs(&self, namespace: Option<&str>) -> Result<Vec<JobRecord>, StoreError> {
        self.read().await?.list_jobs(namespace).await
    }

    async fn dependents(&self, namespace: &str, name: &str) -> Result<Vec<JobRecord>, StoreError> {
        self.read().await?.dependents(namespace, name).await
    }

    async fn job_changes(&self, since: u64) -> Result<JobChanges, StoreError> {
        self.read().await?.job_changes(since).await
    }

    async fn job_heads(&self) -> Result<JobHeads, StoreError> {
        self.read().await?.job_heads().await
    }

    async fn jobs_by_uid(&self, uids: &[String]) -> Result<Vec<JobRecord>, StoreError> {
        self.read().await?.jobs_by_uid(uids).await
    }
}

#[async_trait]
impl LeadershipStore for RaftStore {
    async fn next_epoch(&self, scope: &str) -> Result<u64, StoreError> {
        self.ask(Command::NextEpoch { scope: scope.into() }, |r| match r {
            Reply::Epoch(n) => Ok(n),
            r => Err(r),
        })
        .await
    }

    async fn fence(&self, fence: &Fence, holder: &LeaderInfo, now: Millis) -> Result<(), StoreError> {
        self.ask(Command::Fence { fence: fence.clone(), holder: holder.clone(), now }, |r| match r {
            Reply::Done => Ok(()),
            r => Err(r),
        })
        .await
    }

    async fn leadership(&self, scope: &str) -> Result<Option<LeadershipRecord>, StoreError> {
        self.read().await?.leadership(scope).await
    }

    async fn advance_leader_time(&self, fence: &Fence, at: Millis) -> Result<Millis, StoreError> {
        self.ask(Command::LeaderTime { fence: fence.clone(), at }, |r| match r {
            Reply::LeaderTime(t) => Ok(t),
            r => Err(r),
        })
        .await
    }
}

#[async_trait]
impl RunStore for RaftStore {
    async fn request_cancel(&self, run_id: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
        self.ask(Command::RequestCancel { run_id: run_id.into(), now }, |r| match r {
            Reply::Cancel(c) => Ok(c),
            r => Err(r),
        })
        .await
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<RunDetail>, StoreError> {
        self.read().await?.get_run(run_id).await
    }

    async fn list_runs(&self, filter: &RunFilter, limit: u32, cursor: Option<i64>) -> Result<RunPage, StoreError> {
        self.read().await?.list_runs(filter, limit, cursor).await
    }

    async fn open_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.read().await?.open_runs().await
    }

    async fn cancel_requests(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.read().await?.cancel_requests().await
    }

    async fn live_attempts(&self) -> Result<Vec<LiveAttempt>, StoreError> {
        self.read().await?.live_attempts().await
    }

    async fn kept_keyed_runs(&self, since: Millis) -> Result<Vec<KeptRun>, StoreError> {
        self.read().await?.kept_keyed_runs(since).await
    }
}

#[async_trait]
impl NotificationStore for RaftStore {
    async fn due_notifications(&self, now: Millis, limit: u32) -> Result<Vec<Notification>, StoreError> {
        self.read().await?.due_notifications(now, limit).await
    }

    async fn settle_notification(&self, fence: &Fence, delivery: &Delivery) -> Result<bool, StoreError> {
        self.ask(Command::SettleNotification { fence: fence.clone(), delivery: delivery.clone() }, |r| match r {
            Reply::Settled(b) => Ok(b),
            r => Err(r),
        })
        .await
    }

    async fn run_notifications(&self, run_id: &str) -> Result<Vec<Notification>, StoreError> {
        self.read().await?.run_notifications(run_id).await
    }
}

#[async_trait]
impl RetentionStore for RaftStore {
    async fn prune(
        &self,
        fence: &Fence,
        keep_per_job: usize,
        before: Millis,
        keep_keyed_after: Millis,
        max: usize,
    ) -> Result<u64, StoreError> {
        self.ask(Command::Prune { fence: fence.clone(), keep_per_job, before, keep_keyed_after, max }, |r| match r {
            Reply::Pruned(n) => Ok(n),
            r => Err(r),
        })
        .await
    }

    async fn size_bytes(&self) -> Option<u64> {
        self.member.current.store().size_bytes().await
    }
}

#[async_trait]
impl StoreProbes for RaftStore {
    fn backend(&self) -> &'static str {
        "raft"
    }

    fn cluster_clock_skew(&self) -> Option<i64> {
        self.member.cluster_clock_skew()
    }

    fn measures_cluster_clocks(&self) -> bool {
        self.member.measures_clocks()
    }

    fn stale_reads(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(RaftStore { member: self.member.clone(), stale: true }))
    }
}

#[async_trait]
impl BackfillStore for RaftStore {
    async fn create_backfill(&self, b: &NewBackfill, now: Millis) -> Result<BackfillRecord, StoreError> {
        self.ask(Command::CreateBackfill { backfill: b.clone(), now }, |r| match r {
            Reply::Backfill(b) => Ok(*b),
            r => Err(r),
        })
        .await
    }

    async fn get_backfill(&self, id: &str) -> Result<Option<BackfillRecord>, StoreError> {
        self.read().await?.get_backfill(id).await
    }

    async fn list_backfills(&self, namespace: Option<&str>) -> Result<Vec<BackfillRecord>, StoreError> {
        self.read().await?.list_backfills(namespace).await
    }

    async fn cancel_backfill(&self, id: &str, now: Millis) -> Result<BackfillRecord, StoreError> {
        self.ask(Command::CancelBackfill { id: id.into(), now }, |r| match r {
            Reply::Backfill(b) => Ok(*b),
            r => Err(r),
        })
        .await
    }

    async fn running_backfills(&self) -> Result<Vec<BackfillRecord>, StoreError> {
        self.read().await?.running_backfills().await
    }

    async fn advance_backfill(&self, fence: &Fence, progress: &BackfillProgress) -> Result<bool, StoreError> {
        self.ask(Command::AdvanceBackfill { fence: fence.clone(), progress: progress.clone() }, |r| match r {
            Reply::Settled(b) => Ok(b),
            r => Err(r),
        })
        .await
    }
}

/// A bind reads first (a read barrier, no log entry): a bound id, the
/// usual case, costs nothing in the log. An unbound one is one entry, which
/// binds it as it is applied only if it is still unbound then.
#[async_trait]
impl WorkerStore for RaftStore {
    async fn bind_worker(&self, worker: &str, credential: &str, now: Millis) -> Result<String, StoreError> {
        if let Some(owner) = self.worker_owner(worker).await? {
            return Ok(owner);
        }
        let command = Command::BindWorker { worker: worker.into(), credential: credential.into(), now };
        self.ask(command, |r| match r {
            Reply::Owner(o) => Ok(o),
            r => Err(r),
        })
        .await
    }

    async fn unbind_worker(&self, worker: &str) -> Result<bool, StoreError> {
        self.ask(Command::UnbindWorker { worker: worker.into() }, |r| match r {
            Reply::Settled(b) => Ok(b),
            r => Err(r),
        })
        .await
    }

    async fn worker_owner(&self, worker: &str) -> Result<Option<String>, StoreError> {
        self.read().await?.worker_owner(worker).await
    }
}
