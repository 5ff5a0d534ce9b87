//! What every conformance test builds with: unique names, a valid job, a
//! new run, a transition, a fresh term.

use gnomon_core::spec::{parse_job_json, JobSpec};
use gnomon_core::RunState;

use crate::*;

pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// A valid job spec (`every: 1s`, `shell: true`) named `name`.
pub fn job_spec(name: &str) -> JobSpec {
    parse_job_json(format!(r#"{{"name":"{name}","schedule":{{"every":"1s"}},"executor":{{"shell":{{"command":"true"}}}}}}"#).as_bytes())
        .and_then(|s| s.compile())
        .map(|c| c.spec)
        .expect("suite job spec is valid")
}

pub(crate) fn new_run(job: &JobRecord, t: i64) -> NewRun {
    NewRun {
        job_uid: job.uid.clone(),
        namespace: job.namespace.clone(),
        job: job.name.clone(),
        scheduled_at: t,
        fired_at: t + 1,
        state: RunState::Pending,
        reason: None,
        manual: false,
        key: None,
        params: None,
        payload: None,
        upstream: None,
    }
}

/// A turn of runs, advances and transitions only.
pub(crate) fn turn(runs: &[NewRun], advances: &[JobAdvance], transitions: &[Transition]) -> TurnBatch {
    TurnBatch { runs: runs.to_vec(), advances: advances.to_vec(), transitions: transitions.to_vec(), ..TurnBatch::default() }
}

pub(crate) fn tr(run: &str, from: RunState, fa: u32, to: RunState, ta: u32, attempt: Option<AttemptChange>) -> Transition {
    Transition {
        run_id: run.into(),
        from,
        from_attempt: fa,
        to,
        to_attempt: ta,
        reason: None,
        next_attempt_at: None,
        attempt,
        at: 5,
        notify: Vec::new(),
    }
}

/// Takes a fresh term on `scope` and returns its fence.
pub(crate) async fn lead(store: &dyn Store, scope: &str) -> Fence {
    let token = store.next_epoch(scope).await.expect("next_epoch");
    let fence = Fence { scope: scope.into(), token };
    store
        .fence(&fence, &LeaderInfo { holder: "suite".into(), address: "127.0.0.1:0".into(), backend: "test".into() }, 1)
        .await
        .expect("fence");
    fence
}
