//! What goes through the replicated log: one [`Command`] per store write,
//! and the [`Reply`] its application gives on every member.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gnomon_core::spec::JobSpec;
use gnomon_core::Millis;
use serde::{Deserialize, Serialize};

use crate::{
    CancelOutcome, Delivery, Fence, FireOutcome, JobAdvance, JobRecord, LeaderInfo, NewRun, Precondition, StoreError, Transition, TurnWrite,
};

openraft::declare_raft_types!(
    /// The Raft types of the `raft` store.
    pub TypeConfig:
        D = Command,
        R = Applied,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = SnapshotFile,
);

/// A snapshot's data: a copy of the state database, as a file kept open
/// (a newer snapshot may take its place on disk while this one is sent; the
/// open file still reads the old one). Never held in memory whole.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    pub path: PathBuf,
    pub file: Arc<std::fs::File>,
}

impl SnapshotFile {
    pub fn open(path: &Path) -> std::io::Result<SnapshotFile> {
        Ok(SnapshotFile { path: path.to_path_buf(), file: Arc::new(std::fs::File::open(path)?) })
    }

    pub fn size(&self) -> std::io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
}

/// A member's id within its cluster.
pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;

/// One store write. Everything a member needs to apply it the same way as
/// every other member is in it: times, the uid of a new job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Command {
    /// A job write, applied without the dependency check (entries written
    /// before the check existed apply as they did then); a job without
    /// edges, which has nothing to check, is still written so.
    PutJob {
        #[serde(with = "spec_field")]
        spec: Box<JobSpec>,
        precondition: Precondition,
        now: Millis,
        uid: String,
    },
    SetJobPaused {
        namespace: String,
        name: String,
        paused: bool,
        now: Millis,
    },
    /// A delete, applied without the dependents check (as `PutJob`).
    DeleteJob {
        namespace: String,
        name: String,
        precondition: Precondition,
    },
    NextEpoch {
        scope: String,
    },
    /// A new scheduling term's fence (the elector's tokens carry the Raft
    /// term, see [`super::term_token`]).
    Fence {
        fence: Fence,
        holder: LeaderInfo,
        now: Millis,
    },
    /// Runs none of which has an idempotency key (the entry's shape from
    /// before keys: `legacy_runs`).
    Fire {
        fence: Fence,
        #[serde(with = "legacy_runs")]
        runs: Vec<NewRun>,
        advances: Vec<JobAdvance>,
    },
    Transition {
        fence: Fence,
        transitions: Vec<Transition>,
    },
    Turn {
        fence: Fence,
        #[serde(with = "legacy_runs")]
        runs: Vec<NewRun>,
        advances: Vec<JobAdvance>,
        transitions: Vec<Transition>,
    },
    RequestCancel {
        run_id: String,
        now: Millis,
    },
    /// Retention, with the cut-off time the leader computed.
    Prune {
        fence: Fence,
        keep_per_job: usize,
        before: Millis,
        /// Keyed runs fired at or after this are kept (absent in entries
        /// of an older version: none held).
        #[serde(default = "no_hold")]
        keep_keyed_after: Millis,
        max: usize,
    },
    /// The leader's clock, committed (the leader time never runs backwards).
    LeaderTime {
        fence: Fence,
        at: Millis,
    },
    /// A notification's delivery, recorded.
    SettleNotification {
        fence: Fence,
        delivery: Delivery,
    },
    /// A new backfill (a client write).
    CreateBackfill {
        backfill: crate::NewBackfill,
        now: Millis,
    },
    /// A backfill cancelled (a client write).
    CancelBackfill {
        id: String,
        now: Millis,
    },
    /// A backfill's progress (a leader write).
    AdvanceBackfill {
        fence: Fence,
        progress: crate::BackfillProgress,
    },
    /// [`Command::Fire`] with a run that is not plain ([`NewRun::is_plain`]:
    /// an idempotency key, params, a payload). Its runs are JSON inside the entry
    /// (`json_runs`), so a field added to a run later is read as absent
    /// from entries written before. New variants go last: an entry's
    /// variant is its index in the binary form.
    FireExt {
        fence: Fence,
        #[serde(with = "json_runs")]
        runs: Vec<NewRun>,
        advances: Vec<JobAdvance>,
    },
    /// [`Command::Turn`] with a run that is not plain.
    TurnExt {
        fence: Fence,
        #[serde(with = "json_runs")]
        runs: Vec<NewRun>,
        advances: Vec<JobAdvance>,
        transitions: Vec<Transition>,
    },
    /// A job write with edges, checked as it is applied against the
    /// namespace's jobs then (every upstream exists, no cycle): entries
    /// apply in log order, so no two checks race.
    PutJobChecked {
        #[serde(with = "spec_field")]
        spec: Box<JobSpec>,
        precondition: Precondition,
        now: Millis,
        uid: String,
    },
    /// A delete refused as it is applied while other jobs of the namespace
    /// run after the job.
    DeleteJobChecked {
        namespace: String,
        name: String,
        precondition: Precondition,
    },
    /// A turn with backfill work besides its runs: the whole batch as JSON
    /// text (`json_batch`), so fields added later read as absent from
    /// entries written before.
    TurnBatch {
        fence: Fence,
        #[serde(with = "json_batch")]
        batch: Box<crate::TurnBatch>,
    },
    /// A worker id bound to the credential that opened a session with it,
    /// if the id has no owner yet (the worker service's write, made after
    /// it authenticated the session): answered with the owner.
    BindWorker {
        worker: String,
        credential: String,
        now: Millis,
    },
    /// A worker id released (a client write).
    UnbindWorker {
        worker: String,
    },
}

/// The batch of a `TurnBatch` entry, as JSON text.
mod json_batch {
    use serde::{de::Error as _, ser::Error as _, Deserialize, Deserializer, Serializer};

    use crate::TurnBatch;

    pub fn serialize<S: Serializer>(batch: &TurnBatch, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&serde_json::to_string(batch).map_err(S::Error::custom)?)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Box<TurnBatch>, D::Error> {
        let text = String::deserialize(d)?;
        serde_json::from_str(&text).map(Box::new).map_err(D::Error::custom)
    }
}

/// The runs of a `FireExt` or `TurnExt` entry, as JSON text: the binary
/// form reads fields by position, JSON by name, so later fields with a
/// default keep old entries readable.
mod json_runs {
    use serde::{de::Error as _, ser::Error as _, Deserialize, Deserializer, Serializer};

    use crate::model::NewRun;

    pub fn serialize<S: Serializer>(runs: &[NewRun], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&serde_json::to_string(runs).map_err(S::Error::custom)?)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<NewRun>, D::Error> {
        let text = String::deserialize(d)?;
        serde_json::from_str(&text).map_err(D::Error::custom)
    }
}

/// The runs of a `Fire` or `Turn` entry in the shape they had before runs
/// could carry an idempotency key, so that entries written before still
/// read, and members that do not know keys read the entries of plain runs.
/// Other runs go in `FireExt`/`TurnExt` ([`Command::fire`]).
mod legacy_runs {
    use gnomon_core::Millis;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::model::NewRun;
    use gnomon_core::RunState;

    #[derive(Serialize, Deserialize)]
    struct Run {
        job_uid: String,
        namespace: String,
        job: String,
        scheduled_at: Millis,
        fired_at: Millis,
        state: RunState,
        reason: Option<String>,
        manual: bool,
    }

    pub fn serialize<S: Serializer>(runs: &[NewRun], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(runs.iter().map(|r| Run {
            job_uid: r.job_uid.clone(),
            namespace: r.namespace.clone(),
            job: r.job.clone(),
            scheduled_at: r.scheduled_at,
            fired_at: r.fired_at,
            state: r.state,
            reason: r.reason.clone(),
            manual: r.manual,
        }))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<NewRun>, D::Error> {
        let runs = Vec::<Run>::deserialize(d)?;
        Ok(runs
            .into_iter()
            .map(|r| NewRun {
                job_uid: r.job_uid,
                namespace: r.namespace,
                job: r.job,
                scheduled_at: r.scheduled_at,
                fired_at: r.fired_at,
                state: r.state,
                reason: r.reason,
                manual: r.manual,
                key: None,
                params: None,
                payload: None,
                upstream: None,
            })
            .collect())
    }
}

impl Command {
    /// The entry that fires `runs`: `Fire`, or `FireExt` when one of them
    /// is not plain.
    pub fn fire(fence: Fence, runs: Vec<NewRun>, advances: Vec<JobAdvance>) -> Command {
        if runs.iter().all(NewRun::is_plain) {
            Command::Fire { fence, runs, advances }
        } else {
            Command::FireExt { fence, runs, advances }
        }
    }

    /// The entry of a turn: `Turn`, or `TurnExt` when a run is not plain.
    pub fn turn(fence: Fence, runs: Vec<NewRun>, advances: Vec<JobAdvance>, transitions: Vec<Transition>) -> Command {
        if runs.iter().all(NewRun::is_plain) {
            Command::Turn { fence, runs, advances, transitions }
        } else {
            Command::TurnExt { fence, runs, advances, transitions }
        }
    }

    /// What a client write needs of the caller it is made for: the same
    /// as the API operation that makes it. `None`: not a client's write
    /// (the scheduler's own, fenced by its term).
    pub fn need(&self) -> Option<crate::caller::Need> {
        use crate::caller::Need;
        let need = |what, role, namespace: &str| Need { what, role, namespace: Some(namespace.to_string()), unrestricted: false };
        match self {
            Command::PutJob { spec, .. } | Command::PutJobChecked { spec, .. } => {
                Some(need("creating or updating a job", "admin", spec.namespace()))
            }
            Command::DeleteJob { namespace, .. } | Command::DeleteJobChecked { namespace, .. } => {
                Some(need("deleting a job", "admin", namespace))
            }
            Command::SetJobPaused { namespace, paused: true, .. } => Some(need("pausing a job", "operator", namespace)),
            Command::SetJobPaused { namespace, paused: false, .. } => Some(need("resuming a job", "operator", namespace)),
            // The run's namespace was checked where the run was looked up.
            Command::RequestCancel { .. } => {
                Some(Need { what: "cancelling a run", role: "operator", namespace: None, unrestricted: false })
            }
            Command::CreateBackfill { backfill, .. } => Some(need("backfilling a job", "operator", &backfill.namespace)),
            // The backfill's namespace was checked where it was looked up.
            Command::CancelBackfill { .. } => {
                Some(Need { what: "cancelling a backfill", role: "operator", namespace: None, unrestricted: false })
            }
            // A worker id's binding spans namespaces: only an admin limited
            // to none releases one.
            Command::UnbindWorker { .. } => {
                Some(Need { what: "releasing a worker id", role: "admin", namespace: None, unrestricted: true })
            }
            // `BindWorker` is made for a worker the sending member
            // authenticated (no client's write), as the scheduler's are.
            _ => None,
        }
    }
}

/// What applying a command gave (the same on every member).
pub type Applied = Result<Reply, StoreError>;

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    /// Blank and membership entries.
    None,
    Job(Box<JobRecord>),
    Done,
    Epoch(u64),
    Fired(Vec<FireOutcome>),
    Transitioned(Vec<bool>),
    Turn(Box<TurnWrite>),
    Cancel(CancelOutcome),
    Pruned(u64),
    LeaderTime(Millis),
    Settled(bool),
    Backfill(Box<crate::BackfillRecord>),
    /// A worker id's owner (`BindWorker`). New replies go last, as commands.
    Owner(String),
}

impl Reply {
    pub(crate) fn unexpected(&self) -> StoreError {
        StoreError::Backend(format!("the replicated store answered {self:?} to a write it did not expect it for"))
    }
}

/// Storage errors from anything displayable.
/// A job spec inside a command: itself in a human-readable format (JSON),
/// its JSON text in a binary one (the spec has optional fields and free
/// JSON values, which need a self-describing format).
mod spec_field {
    use gnomon_core::spec::JobSpec;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(spec: &JobSpec, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            spec.serialize(s)
        } else {
            serde_json::to_string(spec).map_err(serde::ser::Error::custom)?.serialize(s)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Box<JobSpec>, D::Error> {
        if d.is_human_readable() {
            JobSpec::deserialize(d).map(Box::new)
        } else {
            let text = String::deserialize(d)?;
            serde_json::from_str(&text).map(Box::new).map_err(serde::de::Error::custom)
        }
    }
}

/// The first byte of a binary (postcard) message or log entry; JSON never
/// starts with it, so entries and messages in JSON still read.
const BINARY: u8 = 0;

/// `v` in the compact binary form.
pub fn to_binary<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
    let mut out = postcard::to_allocvec(&(BINARY, v)).map_err(|e| e.to_string())?;
    // postcard writes the tuple's first element as the byte itself.
    debug_assert_eq!(out.first(), Some(&BINARY));
    out.shrink_to_fit();
    Ok(out)
}

/// Reads what [`to_binary`] or JSON wrote.
pub fn from_bytes<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, String> {
    match b.split_first() {
        Some((&BINARY, rest)) => postcard::from_bytes(rest).map_err(|e| e.to_string()),
        _ => serde_json::from_slice(b).map_err(|e| e.to_string()),
    }
}

pub mod err {
    use openraft::{AnyError, StorageIOError};

    use super::{NodeId, StorageError};

    fn any(e: impl std::fmt::Display) -> AnyError {
        AnyError::error(e.to_string())
    }

    pub fn read_logs(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::read_logs(any(e)).into()
    }

    pub fn write_logs(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::write_logs(any(e)).into()
    }

    pub fn read_vote(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::read_vote(any(e)).into()
    }

    pub fn write_vote(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::write_vote(any(e)).into()
    }

    pub fn write_state_machine(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::write_state_machine(any(e)).into()
    }

    pub fn write_snapshot(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::<NodeId>::write_snapshot(None, any(e)).into()
    }
}

/// No keyed run held from pruning (a `Prune` entry from before the hold).
fn no_hold() -> Millis {
    Millis::MAX
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AttemptChange;
    use gnomon_core::spec::parse_job_json;
    use gnomon_core::{AttemptState, RunState};

    fn entry(cmd: Command) -> Entry {
        Entry { log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(3, 1), 42), payload: openraft::EntryPayload::Normal(cmd) }
    }

    #[test]
    fn entries_round_trip_in_binary_and_json_ones_still_read() {
        let json = br#"{"name":"j","schedule":{"cron":"0 * * * * *","timezone":"Europe/Paris"},
            "executor":{"handler":{"name":"noop","payload":{"k":[1,null,"x"],"n":{"deep":true}}}}}"#;
        let spec = parse_job_json(json).unwrap().compile().unwrap().spec;
        let put =
            entry(Command::PutJob { spec: Box::new(spec.clone()), precondition: Precondition::DoesNotExist, now: 7, uid: "u1".into() });
        let turn = entry(Command::Turn {
            fence: Fence { scope: "scheduler".into(), token: 9 << 20 },
            runs: vec![],
            advances: vec![],
            transitions: vec![Transition {
                run_id: "u1-1000".into(),
                from: RunState::Running,
                from_attempt: 1,
                to: RunState::Succeeded,
                to_attempt: 1,
                reason: None,
                next_attempt_at: None,
                attempt: Some(AttemptChange::End {
                    attempt: 1,
                    state: AttemptState::Succeeded,
                    exit_code: Some(0),
                    output: "ok\n".into(),
                    started_at: Some(900),
                }),
                at: 1000,
                notify: Vec::new(),
            }],
        });
        for e in [put, turn] {
            let bin = to_binary(&e).unwrap();
            let json = serde_json::to_vec(&e).unwrap();
            assert!(bin.len() < json.len(), "binary is smaller: {} vs {}", bin.len(), json.len());
            for bytes in [&bin, &json] {
                let back: Entry = from_bytes(bytes).unwrap();
                assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(&e).unwrap());
            }
        }
        match from_bytes::<Entry>(
            &to_binary(&entry(Command::PutJob { spec: Box::new(spec.clone()), precondition: Precondition::None, now: 1, uid: "u".into() }))
                .unwrap(),
        )
        .unwrap()
        .payload
        {
            openraft::EntryPayload::Normal(Command::PutJob { spec: back, .. }) => assert_eq!(*back, spec, "the spec survives exactly"),
            other => panic!("{other:?}"),
        }
        assert!(from_bytes::<Entry>(&[0, 255, 255]).is_err(), "garbage is an error, not a panic");
    }

    #[test]
    fn checked_job_writes_round_trip_and_need_what_the_plain_ones_do() {
        let json = br#"{"name":"r","namespace":"team","after":[{"job":"load"}],"executor":{"handler":{"name":"noop"}}}"#;
        let spec = parse_job_json(json).unwrap().compile().unwrap().spec;
        let put = Command::PutJobChecked { spec: Box::new(spec.clone()), precondition: Precondition::None, now: 1, uid: "u".into() };
        let delete = Command::DeleteJobChecked { namespace: "team".into(), name: "load".into(), precondition: Precondition::None };
        for (cmd, what) in [(put, "creating or updating a job"), (delete, "deleting a job")] {
            let need = cmd.need().expect("a client write");
            assert_eq!((need.what, need.role, need.namespace.as_deref()), (what, "admin", Some("team")));
            let back: Entry = from_bytes(&to_binary(&entry(cmd.clone())).unwrap()).unwrap();
            assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(entry(cmd)).unwrap());
        }
    }

    /// A dependency run's entry as written when `NewRun::upstream` was the
    /// record's JSON text (the bytes that code wrote): it reads back with
    /// the record decoded, and encodes to the same bytes again.
    #[test]
    fn an_entry_written_with_the_upstream_as_text_reads_and_encodes_the_same() {
        let old = hex::decode(HEX).unwrap();
        let entry: Entry = from_bytes(&old).expect("the old entry reads");
        let openraft::EntryPayload::Normal(Command::FireExt { runs, .. }) = &entry.payload else { panic!("{entry:?}") };
        let after = runs[0].upstream.as_deref().expect("the record");
        assert_eq!((after.of.as_str(), after.of_uid.as_str(), after.edges[0].job.as_str()), ("u1-6000", "u1", "extract"));
        assert_eq!(runs[0].id(), crate::dep_run_id("u2", 6000));
        assert_eq!(to_binary(&entry).unwrap(), old, "encoded byte for byte as before");
        // The JSON form of the same entry, as that code wrote it.
        let json = serde_json::to_string(&entry).unwrap();
        assert!(json.contains(r#"\"upstream\":\"{\\\"of\\\":\\\"u1-6000\\\""#), "the record is a string in the JSON: {json}");
        let back: Entry = from_bytes(json.as_bytes()).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
        // Text that is not a record is an error, not a run without one.
        let corrupt = hex::encode(&old).replace(&hex::encode(br#"{\"of\""#), &hex::encode(br#"{\"xx\""#));
        assert!(from_bytes::<Entry>(&hex::decode(corrupt).unwrap()).is_err(), "a corrupt record does not read");
    }

    /// The worker binding entries read back, say what they need of a
    /// caller, and keep the binary form they were released with: their
    /// variants come after every earlier one (an entry's variant is its
    /// index), so entries of the earlier variants read as before.
    #[test]
    fn worker_binding_entries_round_trip_and_keep_their_encoding() {
        let bind = Command::BindWorker { worker: "pool-b-1".into(), credential: "worker-b".into(), now: 7 };
        let unbind = Command::UnbindWorker { worker: "pool-b-1".into() };
        assert!(bind.need().is_none(), "a bind is the worker service's own write");
        let need = unbind.need().expect("a release is a client's write");
        assert_eq!((need.role, need.namespace.as_deref(), need.unrestricted), ("admin", None, true));
        for cmd in [bind.clone(), unbind.clone()] {
            let back: Entry = from_bytes(&to_binary(&entry(cmd.clone())).unwrap()).unwrap();
            assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(entry(cmd)).unwrap());
        }
        // [binary marker, variant, fields]: strings as length and bytes, the
        // time as a zigzag varint.
        let mut want = vec![0u8, 20, 8];
        want.extend(b"pool-b-1");
        want.push(8);
        want.extend(b"worker-b");
        want.push(14);
        assert_eq!(to_binary(&bind).unwrap(), want, "BindWorker is variant 20");
        let mut want = vec![0u8, 21, 8];
        want.extend(b"pool-b-1");
        assert_eq!(to_binary(&unbind).unwrap(), want, "UnbindWorker is variant 21");
        let owner: Applied =
            serde_json::from_slice(&serde_json::to_vec(&Ok::<_, StoreError>(Reply::Owner("worker-b".into()))).unwrap()).unwrap();
        assert!(matches!(owner, Ok(Reply::Owner(o)) if o == "worker-b"));
    }

    const HEX: &str = concat!(
        "0003012a010f097363686564756c657207aa025b7b226a6f625f756964223a227532222c226e616d657370616365223a2264",
        "656661756c74222c226a6f62223a226c6f6164222c227363686564756c65645f6174223a363030302c2266697265645f6174",
        "223a363030312c227374617465223a2277616974696e67222c22726561736f6e223a6e756c6c2c226d616e75616c223a6661",
        "6c73652c226b6579223a6e756c6c2c22706172616d73223a6e756c6c2c227061796c6f6164223a6e756c6c2c227570737472",
        "65616d223a227b5c226f665c223a5c2275312d363030305c222c5c226f665f7569645c223a5c2275315c222c5c2265646765",
        "735c223a5b7b5c226a6f625c223a5c22657874726163745c222c5c227569645c223a5c2275315c222c5c226f6e5c223a5c22",
        "7375636365656465645c227d5d7d227d5d00",
    );

    #[test]
    fn runs_with_a_key_or_params_go_in_the_extended_entries_and_read_back_whole() {
        let plain = NewRun {
            job_uid: "u1".into(),
            namespace: "default".into(),
            job: "j".into(),
            scheduled_at: 1000,
            fired_at: 1001,
            state: RunState::Pending,
            reason: None,
            manual: true,
            key: None,
            params: None,
            payload: None,
            upstream: None,
        };
        let fence = Fence { scope: "scheduler".into(), token: 9 << 20 };
        assert!(matches!(Command::fire(fence.clone(), vec![plain.clone()], vec![]), Command::Fire { .. }));
        let rich = NewRun {
            key: Some("order-1".into()),
            params: Some(r#"{"region":"eu"}"#.into()),
            payload: Some(r#"{"event":"push"}"#.into()),
            ..plain.clone()
        };
        for cmd in [
            Command::fire(fence.clone(), vec![plain.clone(), rich.clone()], vec![]),
            Command::turn(fence.clone(), vec![rich.clone()], vec![], vec![]),
        ] {
            assert!(matches!(cmd, Command::FireExt { .. } | Command::TurnExt { .. }), "{cmd:?}");
            let back: Entry = from_bytes(&to_binary(&entry(cmd)).unwrap()).unwrap();
            let openraft::EntryPayload::Normal(Command::FireExt { runs, .. } | Command::TurnExt { runs, .. }) = back.payload else {
                panic!("{back:?}")
            };
            assert_eq!(runs.last(), Some(&rich), "the key, the params and the payload survive");
        }
        // A run written before a later field existed reads it as absent.
        let older = r#"[{"job_uid":"u1","namespace":"default","job":"j","scheduled_at":1000,"fired_at":1001,
            "state":"pending","reason":null,"manual":true}]"#;
        let runs: Vec<NewRun> = serde_json::from_str(older).unwrap();
        assert_eq!(runs, vec![plain]);
    }
}
