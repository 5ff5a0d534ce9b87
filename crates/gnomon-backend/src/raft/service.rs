//! The `gnomon.raft.v1` service of one member: what it answers to the
//! others (append, vote, pre-vote, snapshots, forwarded writes, read index,
//! membership, take-over), and the check of the client a forwarded write
//! names.

// tonic::Status is what the service answers with.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use gnomon_proto::raft::raft_server;
use gnomon_proto::raft::{Payload, SnapshotChunk};
use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest};
use openraft::Snapshot;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::network::{SnapshotHeader, CALLER_HEADER};
use super::types::{from_bytes, NodeId, SnapshotFile, TypeConfig};
use super::{wall_ms, Member};

/// The `gnomon.raft.v1` service of one member.
#[derive(Clone)]
pub struct Service {
    pub member: Arc<Member>,
}

fn decode<T: DeserializeOwned>(p: &Payload) -> Result<T, tonic::Status> {
    from_bytes(&p.json).map_err(|e| tonic::Status::invalid_argument(format!("not a raft message of this version: {e}")))
}

/// A stopped member answers unavailable (not a Raft error), so callers
/// reconnect and find its successor at the same address.
fn stopped<T, E: std::error::Error>(r: Result<T, RaftError<NodeId, E>>) -> Result<Result<T, RaftError<NodeId, E>>, tonic::Status> {
    match r {
        Err(RaftError::Fatal(f)) => Err(tonic::Status::unavailable(format!("this member stopped: {f}"))),
        r => Ok(r),
    }
}

fn encode<T: Serialize>(v: &T) -> Result<tonic::Response<Payload>, tonic::Status> {
    serde_json::to_vec(v)
        .map(|json| tonic::Response::new(Payload { json, wall_ms: wall_ms() }))
        .map_err(|e| tonic::Status::internal(e.to_string()))
}

impl Service {
    /// Refuses a message from a member this one is cut off from.
    fn heard(&self, from: Option<NodeId>) -> Result<(), tonic::Status> {
        match from {
            Some(id) if self.member.net.is_cut(id) => Err(tonic::Status::unavailable(format!("member {id} is cut off"))),
            _ => Ok(()),
        }
    }
}

#[tonic::async_trait]
impl raft_server::Raft for Service {
    async fn append_entries(&self, request: tonic::Request<Payload>) -> Result<tonic::Response<Payload>, tonic::Status> {
        let req: AppendEntriesRequest<TypeConfig> = decode(request.get_ref())?;
        self.heard(Some(req.vote.leader_id().voted_for().unwrap_or_default()))?;
        let r = stopped(self.member.raft.append_entries(req).await)?;
        if matches!(&r, Ok(a) if !matches!(a, AppendEntriesResponse::HigherVote(_))) {
            self.member.heard.now();
        }
        encode(&r)
    }

    async fn pre_vote(&self, request: tonic::Request<Payload>) -> Result<tonic::Response<Payload>, tonic::Status> {
        let (from, last): (NodeId, Option<super::types::LogId>) = decode(request.get_ref())?;
        self.heard(Some(from))?;
        encode(&self.member.pre_vote(last))
    }

    async fn vote(&self, request: tonic::Request<Payload>) -> Result<tonic::Response<Payload>, tonic::Status> {
        let req: VoteRequest<NodeId> = decode(request.get_ref())?;
        self.heard(req.vote.leader_id().voted_for())?;
        encode(&stopped(self.member.raft.vote(req).await)?)
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<tonic::Streaming<SnapshotChunk>>,
    ) -> Result<tonic::Response<Payload>, tonic::Status> {
        let mut chunks = request.into_inner();
        let first = chunks.message().await?.ok_or_else(|| tonic::Status::invalid_argument("an empty snapshot stream"))?;
        let header: SnapshotHeader = serde_json::from_slice(&first.header)
            .map_err(|e| tonic::Status::invalid_argument(format!("not a snapshot header of this version: {e}")))?;
        self.heard(header.vote.leader_id().voted_for())?;
        // Received into a file of its own; the state machine makes it the
        // latest snapshot when it installs it.
        let path = self.member.config.dir.join(format!("incoming-{:016x}.db", rand::random::<u64>()));
        let received = receive_file(&path, first.data, &mut chunks).await;
        let file = match received.and_then(|()| SnapshotFile::open(&path)) {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(tonic::Status::internal(format!("cannot receive the snapshot: {e}")));
            }
        };
        let snapshot = Snapshot { meta: header.meta, snapshot: Box::new(file) };
        let r = self.member.raft.install_full_snapshot(header.vote, snapshot).await;
        if matches!(&r, Ok(a) if a.vote <= header.vote) {
            self.member.heard.now();
        }
        // Installed: renamed away; refused (an older snapshot or a newer
        // vote): still here.
        let _ = std::fs::remove_file(&path);
        match r {
            Err(e) => Err(tonic::Status::unavailable(format!("this member stopped: {e}"))),
            Ok(r) => encode(&Ok::<_, String>(r)),
        }
    }

    async fn forward(&self, request: tonic::Request<Payload>) -> Result<tonic::Response<Payload>, tonic::Status> {
        let msg: super::Forwarded = decode(request.get_ref())?;
        self.heard(Some(msg.from))?;
        if let Some(need) = msg.command.need() {
            authorize(Some(msg.from), &caller_of(&request)?, &need)?;
        }
        encode(&self.member.propose_here(msg.command).await)
    }

    async fn read_index(&self, request: tonic::Request<Payload>) -> Result<tonic::Response<Payload>, tonic::Status> {
        let from: NodeId = decode(request.get_ref())?;
        self.heard(Some(from))?;
        let r: Result<Option<u64>, String> = match self.member.raft.get_read_log_id().await {
            Ok((read, _)) => Ok(read.map(|l| l.index)),
            Err(e) => Err(e.to_string()),
        };
        encode(&r)
    }

    async fn membership(&self, request: tonic::Request<Payload>) -> Result<tonic::Response<Payload>, tonic::Status> {
        let change: super::Change = decode(request.get_ref())?;
        let need = crate::caller::Need { what: "changing the cluster's members", role: "admin", namespace: None, unrestricted: true };
        authorize(None, &caller_of(&request)?, &need)?;
        tracing::info!(target: "gnomon::audit", ?change, "raft membership change received");
        encode(&self.member.change_here(change).await)
    }

    async fn take_over(&self, request: tonic::Request<Payload>) -> Result<tonic::Response<Payload>, tonic::Status> {
        let (from, last): (NodeId, Option<u64>) = decode(request.get_ref())?;
        self.heard(Some(from))?;
        encode(&self.member.take_over(last).await)
    }
}

/// The client a forwarded write is made for, if the sender named one.
#[allow(clippy::result_large_err)] // tonic::Status is what the service returns
fn caller_of<T>(request: &tonic::Request<T>) -> Result<Option<crate::caller::Caller>, tonic::Status> {
    let Some(v) = request.metadata().get_bin(CALLER_HEADER) else {
        return Ok(None);
    };
    let bytes = v.to_bytes().map_err(|e| tonic::Status::invalid_argument(format!("{CALLER_HEADER}: {e}")))?;
    serde_json::from_slice(&bytes).map(Some).map_err(|e| tonic::Status::invalid_argument(format!("{CALLER_HEADER}: {e}")))
}

/// Checks a client write another member sent here against the caller it
/// was made for, as the API operation would, and audits it. Without a
/// caller the write is the sending member's own (the member credential
/// that the interceptor checked answers for it).
#[allow(clippy::result_large_err)] // tonic::Status is what the service returns
fn authorize(from: Option<NodeId>, caller: &Option<crate::caller::Caller>, need: &crate::caller::Need) -> Result<(), tonic::Status> {
    let ns = need.namespace.as_deref().unwrap_or("-");
    match caller {
        None => {
            tracing::info!(target: "gnomon::audit", member = ?from, caller = "-", namespace = ns, "forwarded {}: the member's own", need.what);
            Ok(())
        }
        Some(c) => match c.may(need) {
            Ok(()) => {
                tracing::info!(target: "gnomon::audit", member = ?from, caller = %c, namespace = ns, "forwarded {}", need.what);
                Ok(())
            }
            Err(why) => {
                tracing::warn!(target: "gnomon::audit", member = ?from, caller = %c, namespace = ns, "forwarded write refused: {why}");
                Err(tonic::Status::permission_denied(why))
            }
        },
    }
}

/// Writes a streamed snapshot's data to `path` and syncs it.
async fn receive_file(path: &std::path::Path, first: Vec<u8>, chunks: &mut tonic::Streaming<SnapshotChunk>) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut f = tokio::fs::File::create(path).await?;
    f.write_all(&first).await?;
    while let Some(chunk) = chunks.message().await.map_err(|s| std::io::Error::other(s.message().to_string()))? {
        f.write_all(&chunk.data).await?;
    }
    f.flush().await?;
    f.sync_all().await
}
