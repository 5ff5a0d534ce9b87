//! The JSON values the etcd store keeps under its keys, and their mapping
//! to the store's records.

use gnomon_core::spec::JobSpec;
use gnomon_core::{AttemptState, Millis, RunState};
use serde::{Deserialize, Serialize};

use crate::{JobRecord, RunRecord, StoreError};

use super::parse;

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct EJob {
    pub(super) uid: String,
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) spec: JobSpec,
    pub(super) version: u64,
    pub(super) paused: bool,
    pub(super) created_at: Millis,
    pub(super) updated_at: Millis,
    pub(super) last_scheduled_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) paused_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) resumed_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) schedule_changed_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) previous_schedule: Option<gnomon_core::spec::ScheduleSpec>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ERun {
    pub(super) id: String,
    pub(super) seq: i64,
    pub(super) job_uid: String,
    pub(super) job: String,
    pub(super) namespace: String,
    pub(super) scheduled_at: Millis,
    pub(super) fired_at: Millis,
    pub(super) state: RunState,
    pub(super) attempt: u32,
    pub(super) reason: Option<String>,
    pub(super) next_attempt_at: Option<Millis>,
    pub(super) manual: bool,
    pub(super) cancel_requested: bool,
    pub(super) updated_at: Millis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) params: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) payload: Option<String>,
    /// Kept as the JSON text every store keeps; text that is not a record
    /// makes the run unreadable (corrupt), never one without upstreams.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "crate::model::upstream_json")]
    pub(super) upstream: Option<std::sync::Arc<gnomon_core::deps::RunAfter>>,
}

impl crate::model::RunCasFields for ERun {
    fn cas(&mut self) -> crate::model::RunCas<'_> {
        crate::model::RunCas {
            state: &mut self.state,
            attempt: &mut self.attempt,
            reason: &mut self.reason,
            next_attempt_at: &mut self.next_attempt_at,
            updated_at: &mut self.updated_at,
            cancel_requested: &mut self.cancel_requested,
        }
    }
}

impl From<ERun> for RunRecord {
    fn from(r: ERun) -> Self {
        RunRecord {
            id: r.id,
            seq: r.seq,
            job_uid: r.job_uid,
            job: r.job,
            namespace: r.namespace,
            scheduled_at: r.scheduled_at,
            fired_at: r.fired_at,
            state: r.state,
            attempt: r.attempt,
            reason: r.reason,
            next_attempt_at: r.next_attempt_at,
            manual: r.manual,
            cancel_requested: r.cancel_requested,
            updated_at: r.updated_at,
            params: r.params,
            payload: r.payload,
            upstream: r.upstream,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct EAttempt {
    pub(super) attempt: u32,
    pub(super) worker: String,
    pub(super) token: u64,
    pub(super) state: AttemptState,
    pub(super) assigned_at: Millis,
    pub(super) started_at: Option<Millis>,
    pub(super) ended_at: Option<Millis>,
    pub(super) exit_code: Option<i32>,
    pub(super) output: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ELeadership {
    pub(super) token: u64,
    pub(super) holder: String,
    pub(super) address: String,
    pub(super) backend: String,
    pub(super) since: Millis,
    /// The etcd election key of the term, when it came from the election.
    pub(super) leader_key: Option<String>,
}

pub(super) fn job_record(kv: &etcd_client::KeyValue) -> Result<JobRecord, StoreError> {
    let j: EJob = parse("job", kv.value())?;
    Ok(JobRecord {
        uid: j.uid,
        namespace: j.namespace,
        name: j.name,
        spec: j.spec,
        version: j.version,
        paused: j.paused,
        created_at: j.created_at,
        updated_at: j.updated_at,
        last_scheduled_at: j.last_scheduled_at,
        paused_at: j.paused_at,
        resumed_at: j.resumed_at,
        schedule_changed_at: j.schedule_changed_at,
        previous_schedule: j.previous_schedule,
        change_seq: u64::try_from(kv.mod_revision()).unwrap_or(0),
    })
}

pub(super) fn ejob(j: &JobRecord) -> EJob {
    EJob {
        uid: j.uid.clone(),
        namespace: j.namespace.clone(),
        name: j.name.clone(),
        spec: j.spec.clone(),
        version: j.version,
        paused: j.paused,
        created_at: j.created_at,
        updated_at: j.updated_at,
        last_scheduled_at: j.last_scheduled_at,
        paused_at: j.paused_at,
        resumed_at: j.resumed_at,
        schedule_changed_at: j.schedule_changed_at,
        previous_schedule: j.previous_schedule.clone(),
    }
}

pub(super) fn seq_key(seq: i64) -> String {
    format!("{:016x}", seq.max(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run's upstream record is kept as the JSON text it always was, and
    /// text that is not a record makes the run corrupt, not upstream-less.
    #[test]
    fn a_run_keeps_its_upstream_as_text_and_one_that_is_not_a_record_is_corrupt() {
        let stored = r#"{"id":"u-d1","seq":1,"job_uid":"u","job":"j","namespace":"default","scheduled_at":1,"fired_at":1,"state":"waiting","attempt":0,"reason":null,"next_attempt_at":null,"manual":false,"cancel_requested":false,"updated_at":1,"upstream":"{\"of\":\"a-1\",\"of_uid\":\"a\",\"edges\":[]}"}"#;
        let run: ERun = parse("run", stored.as_bytes()).expect("reads");
        assert_eq!(run.upstream.as_ref().map(|a| (a.of.as_str(), a.of_uid.as_str())), Some(("a-1", "a")));
        assert_eq!(String::from_utf8(super::super::json(&run)).unwrap(), stored, "written back as it was");
        let bad = stored.replace(r#"{\"of\""#, r#"{\"xx\""#);
        assert!(matches!(parse::<ERun>("run", bad.as_bytes()), Err(StoreError::Corrupt(_))));
        let plain = stored.replace(r#","upstream":"{\"of\":\"a-1\",\"of_uid\":\"a\",\"edges\":[]}""#, "");
        assert!(parse::<ERun>("run", plain.as_bytes()).expect("reads").upstream.is_none(), "absent is none");
    }
}
