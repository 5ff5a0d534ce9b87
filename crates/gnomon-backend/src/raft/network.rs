//! Members talking to each other: the `gnomon.raft.v1` gRPC service (server
//! side, mounted on the gnomon listener) and the client Raft uses to reach
//! the other members, plus the calls a member makes to its leader
//! (forwarded writes, read index, hand-over).

// The error types are tonic's and openraft's.
#![allow(clippy::result_large_err)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gnomon_proto::raft::raft_client::RaftClient;
use gnomon_proto::raft::{Payload, SnapshotChunk};
use openraft::error::{Fatal, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use openraft::{BasicNode, OptionalSend, Snapshot};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use super::types::{to_binary, NodeId, SnapshotFile, SnapshotMeta, TypeConfig, Vote};
use super::wall_ms;

/// Opens a channel to a member's address (`host:port`): plain HTTP/2 by
/// default; the server passes one that speaks TLS when it has a CA.
pub type Connect = Arc<dyn Fn(&str) -> Result<Channel, String> + Send + Sync>;

/// What every client of one member shares.
pub struct Net {
    connect: Connect,
    /// Sent as `authorization: Bearer …` when set.
    token: Option<String>,
    channels: Mutex<HashMap<String, Channel>>,
    /// Members this one neither sends to nor hears from (fault injection:
    /// a network partition in tests).
    cut: Mutex<HashSet<NodeId>>,
    /// Each member's clock minus this one's (ms), measured on replication
    /// round trips, and when.
    offsets: Mutex<HashMap<NodeId, (i64, std::time::Instant)>>,
    /// Whether each member answered its last call, and since when.
    reach: Mutex<HashMap<NodeId, Reach>>,
}

/// A member's reachability as this one sees it (for the log: openraft's
/// own lines about it are off by default).
struct Reach {
    answered: bool,
    since: std::time::Instant,
    said: bool,
}

/// How long a member that was never reached may stay so before the log
/// says it (members start at different times).
const UNREACHED_GRACE: Duration = Duration::from_secs(5);

/// A failed call to another member.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("member {0} is cut off")]
    Cut(NodeId),
    #[error("cannot reach {addr}: {why}")]
    Unreachable { addr: String, why: String },
    #[error("{addr} answered {why}")]
    Status { addr: String, why: String },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("a message could not be encoded or decoded: {0}")]
    Codec(String),
}

impl CallError {
    /// The member could not be reached (Raft backs off and retries).
    fn unreachable(&self) -> bool {
        matches!(self, CallError::Timeout(_) | CallError::Cut(_) | CallError::Unreachable { .. })
    }
}

impl Net {
    pub fn new(connect: Option<Connect>, token: Option<String>) -> Net {
        let connect = connect.unwrap_or_else(|| {
            Arc::new(|addr: &str| {
                Channel::from_shared(format!("http://{addr}"))
                    .map(|e| e.connect_timeout(Duration::from_secs(2)).tcp_nodelay(true).connect_lazy())
                    .map_err(|e| e.to_string())
            })
        });
        Net {
            connect,
            token,
            channels: Mutex::new(HashMap::new()),
            cut: Mutex::new(HashSet::new()),
            offsets: Mutex::default(),
            reach: Mutex::default(),
        }
    }

    /// Records whether `target` answered; logs when that changes: at once
    /// for a member that answered before, after [`UNREACHED_GRACE`] for one
    /// never reached yet (it may still be starting).
    fn reached(&self, target: NodeId, addr: &str, failure: Option<&CallError>) {
        let now = std::time::Instant::now();
        let mut all = self.reach.lock().unwrap_or_else(|e| e.into_inner());
        let r = all.entry(target).or_insert(Reach { answered: false, since: now, said: false });
        match failure {
            None => {
                if !r.answered && r.said {
                    tracing::info!(member = target, addr, "raft: member reachable again");
                }
                *r = Reach { answered: true, since: now, said: false };
            }
            Some(e) => {
                let was_answering = r.answered;
                if was_answering {
                    *r = Reach { answered: false, since: now, said: false };
                }
                if !r.said && (was_answering || r.since.elapsed() >= UNREACHED_GRACE) {
                    r.said = true;
                    tracing::warn!(member = target, addr, error = %e, "raft: member unreachable");
                }
            }
        }
    }

    /// The fresh clock offsets (member's clock minus this one's, ms) of
    /// `members`.
    pub fn clock_offsets(&self, members: &[NodeId]) -> Vec<i64> {
        let offsets = self.offsets.lock().unwrap_or_else(|e| e.into_inner());
        members.iter().filter_map(|m| offsets.get(m).filter(|(_, at)| at.elapsed() <= CLOCK_FRESH).map(|(o, _)| *o)).collect()
    }

    /// Cuts (or restores) the link to `peer` in both directions.
    pub fn set_cut(&self, peer: NodeId, cut: bool) {
        let mut c = self.cut.lock().unwrap_or_else(|e| e.into_inner());
        if cut {
            c.insert(peer);
        } else {
            c.remove(&peer);
        }
    }

    pub fn is_cut(&self, peer: NodeId) -> bool {
        self.cut.lock().unwrap_or_else(|e| e.into_inner()).contains(&peer)
    }

    fn channel(&self, addr: &str) -> Result<Channel, CallError> {
        let mut chans = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = chans.get(addr) {
            return Ok(c.clone());
        }
        let c = (self.connect)(addr).map_err(|why| CallError::Unreachable { addr: addr.to_string(), why })?;
        chans.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    /// Calls `rpc` on the member `target` at `addr` with `req` as JSON.
    pub async fn call<Q: Serialize, A: DeserializeOwned>(
        &self,
        target: NodeId,
        addr: &str,
        rpc: Rpc,
        req: &Q,
        timeout: Duration,
    ) -> Result<A, CallError> {
        if self.is_cut(target) {
            return Err(CallError::Cut(target));
        }
        // Replication (the bulk of the traffic) goes in binary; the rest,
        // which carries job specs and errors, in JSON.
        let json = match rpc {
            Rpc::AppendEntries => to_binary(req).map_err(CallError::Codec)?,
            _ => serde_json::to_vec(req).map_err(|e| CallError::Codec(e.to_string()))?,
        };
        let mut request = self.request(Payload { json, wall_ms: 0 }, timeout)?;
        if matches!(rpc, Rpc::Forward | Rpc::Membership) {
            if let Some(c) = crate::caller::current() {
                let json = serde_json::to_vec(&c).map_err(|e| CallError::Codec(e.to_string()))?;
                request.metadata_mut().insert_bin(CALLER_HEADER, tonic::metadata::MetadataValue::from_bytes(&json));
            }
        }
        let sent = wall_ms();
        let mut client = self.client(addr)?;
        let call = async {
            match rpc {
                Rpc::AppendEntries => client.append_entries(request).await,
                Rpc::Vote => client.vote(request).await,
                Rpc::PreVote => client.pre_vote(request).await,
                Rpc::Forward => client.forward(request).await,
                Rpc::ReadIndex => client.read_index(request).await,
                Rpc::TakeOver => client.take_over(request).await,
                Rpc::Membership => client.membership(request).await,
            }
        };
        let answer = self.answer(addr, timeout, tokio::time::timeout(timeout, call).await);
        match &answer {
            Err(e) if e.unreachable() => self.reached(target, addr, Some(e)),
            Err(_) => {}
            Ok(_) => self.reached(target, addr, None),
        }
        let answer = answer?;
        if matches!(rpc, Rpc::AppendEntries) && answer.wall_ms > 0 {
            let back = wall_ms();
            // A round trip this short bounds the error by half of it.
            if back - sent <= MAX_CLOCK_RTT_MS {
                let offset = answer.wall_ms - (sent + back) / 2;
                self.offsets.lock().unwrap_or_else(|e| e.into_inner()).insert(target, (offset, std::time::Instant::now()));
            }
        }
        serde_json::from_slice(&answer.json).map_err(|e| CallError::Codec(e.to_string()))
    }

    /// A request with the deadline and this member's credential.
    fn request<T>(&self, body: T, timeout: Duration) -> Result<tonic::Request<T>, CallError> {
        let mut request = tonic::Request::new(body);
        request.set_timeout(timeout);
        if let Some(t) = &self.token {
            let v = format!("Bearer {t}").parse().map_err(|_| CallError::Codec("the token is not a valid header value".into()))?;
            request.metadata_mut().insert("authorization", v);
        }
        Ok(request)
    }

    fn client(&self, addr: &str) -> Result<RaftClient<Channel>, CallError> {
        Ok(RaftClient::new(self.channel(addr)?).max_decoding_message_size(usize::MAX).max_encoding_message_size(usize::MAX))
    }

    /// A call's answer, or what its failure means.
    fn answer(
        &self,
        addr: &str,
        timeout: Duration,
        r: Result<Result<tonic::Response<Payload>, tonic::Status>, tokio::time::error::Elapsed>,
    ) -> Result<Payload, CallError> {
        match r {
            Err(_) => Err(CallError::Timeout(timeout)),
            Ok(Err(s)) if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown) => {
                // The next call opens a new connection (the member may have
                // restarted at the same address).
                self.channels.lock().unwrap_or_else(|e| e.into_inner()).remove(addr);
                Err(CallError::Unreachable { addr: addr.to_string(), why: s.message().to_string() })
            }
            Ok(Err(s)) if s.code() == tonic::Code::DeadlineExceeded => Err(CallError::Timeout(timeout)),
            Ok(Err(s)) => Err(CallError::Status { addr: addr.to_string(), why: format!("{:?}: {}", s.code(), s.message()) }),
            Ok(Ok(a)) => Ok(a.into_inner()),
        }
    }

    /// Streams a snapshot to the member `target`: a header chunk, then the
    /// file in [`SNAPSHOT_CHUNK`] pieces read as they are sent (at most a
    /// few chunks in memory).
    async fn send_snapshot(
        &self,
        target: NodeId,
        addr: &str,
        header: Vec<u8>,
        file: SnapshotFile,
        timeout: Duration,
    ) -> Result<SnapshotResponse<NodeId>, CallError> {
        if self.is_cut(target) {
            return Err(CallError::Cut(target));
        }
        let (tx, rx) = tokio::sync::mpsc::channel::<SnapshotChunk>(4);
        let reader = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::os::unix::fs::FileExt;
            if tx.blocking_send(SnapshotChunk { header, data: Vec::new() }).is_err() {
                return Ok(());
            }
            let mut at = 0u64;
            loop {
                let mut buf = vec![0u8; SNAPSHOT_CHUNK];
                let n = file.file.read_at(&mut buf, at)?;
                if n == 0 {
                    return Ok(());
                }
                buf.truncate(n);
                at += n as u64;
                if tx.blocking_send(SnapshotChunk { header: Vec::new(), data: buf }).is_err() {
                    return Ok(());
                }
            }
        });
        let request = self.request(tokio_stream::wrappers::ReceiverStream::new(rx), timeout)?;
        let mut client = self.client(addr)?;
        let r = tokio::time::timeout(timeout, client.install_snapshot(request)).await;
        let answer = self.answer(addr, timeout, r);
        match reader.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(CallError::Codec(format!("reading the snapshot: {e}"))),
            Err(e) => return Err(CallError::Codec(format!("reading the snapshot: {e}"))),
        }
        let r: Result<SnapshotResponse<NodeId>, String> =
            serde_json::from_slice(&answer?.json).map_err(|e| CallError::Codec(e.to_string()))?;
        r.map_err(|why| CallError::Status { addr: addr.to_string(), why })
    }
}

/// The size of a streamed snapshot's chunks.
const SNAPSHOT_CHUNK: usize = 1 << 20;

#[derive(Debug, Clone, Copy)]
pub enum Rpc {
    AppendEntries,
    Vote,
    PreVote,
    Forward,
    ReadIndex,
    TakeOver,
    Membership,
}

/// The first chunk of a streamed snapshot.
#[derive(Serialize, Deserialize)]
pub(super) struct SnapshotHeader {
    pub(super) vote: Vote,
    pub(super) meta: SnapshotMeta,
}

/// Makes Raft's clients to the other members.
#[derive(Clone)]
pub struct Factory {
    pub net: Arc<Net>,
}

pub struct Client {
    net: Arc<Net>,
    target: NodeId,
    addr: String,
}

impl RaftNetworkFactory<TypeConfig> for Factory {
    type Network = Client;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Client {
        Client { net: self.net.clone(), target, addr: node.addr.clone() }
    }
}

fn rpc_error<E: std::error::Error>(e: CallError) -> RPCError<NodeId, BasicNode, E> {
    if e.unreachable() {
        RPCError::Unreachable(Unreachable::new(&e))
    } else {
        RPCError::Network(NetworkError::new(&e))
    }
}

impl Client {
    async fn raft_call<Q: Serialize, A: DeserializeOwned, E: std::error::Error + DeserializeOwned>(
        &self,
        rpc: Rpc,
        req: &Q,
        option: &RPCOption,
    ) -> Result<A, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>> {
        let r: Result<A, RaftError<NodeId, E>> =
            self.net.call(self.target, &self.addr, rpc, req, option.hard_ttl()).await.map_err(rpc_error)?;
        r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Client {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.raft_call(Rpc::AppendEntries, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.raft_call(Rpc::Vote, &rpc, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot<TypeConfig>,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let unreachable = |e: CallError| {
            if e.unreachable() {
                StreamingError::Unreachable(Unreachable::new(&e))
            } else {
                StreamingError::Network(NetworkError::new(&e))
            }
        };
        let header =
            serde_json::to_vec(&SnapshotHeader { vote, meta: snapshot.meta }).map_err(|e| unreachable(CallError::Codec(e.to_string())))?;
        let file = *snapshot.snapshot;
        // At least 4 MiB/s: a large snapshot gets the time it needs.
        let len = file.size().unwrap_or(0);
        let timeout = option.hard_ttl().max(Duration::from_secs(len / (4 << 20)));
        self.net.send_snapshot(self.target, &self.addr, header, file, timeout).await.map_err(unreachable)
    }
}

/// Clock readings from round trips longer than this are not used.
const MAX_CLOCK_RTT_MS: i64 = 100;
/// Clock offsets older than this are not used.
const CLOCK_FRESH: Duration = Duration::from_secs(3);

/// This member's clock minus the median of the cluster's (itself
/// included), from the other members' offsets: only with at least three
/// clocks that are a majority of `voters`. Of two middle values the one
/// nearer this member's clock counts, so it is judged off only when it is
/// the odd one out.
pub fn skew_from_offsets(offsets: &[i64], voters: usize) -> Option<i64> {
    let clocks = offsets.len() + 1;
    if clocks < 3 || clocks <= voters / 2 {
        return None;
    }
    let mut all: Vec<i64> = offsets.to_vec();
    all.push(0);
    all.sort_unstable();
    let mid = if clocks % 2 == 1 {
        all[clocks / 2]
    } else {
        let (a, b) = (all[clocks / 2 - 1], all[clocks / 2]);
        if a.abs() <= b.abs() {
            a
        } else {
            b
        }
    };
    Some(-mid)
}

/// The gRPC metadata (binary) that names the client a forwarded write or
/// membership change is made for.
pub(super) const CALLER_HEADER: &str = "gnomon-caller-bin";

#[cfg(test)]
mod tests {
    use super::skew_from_offsets;

    #[test]
    fn a_member_is_off_only_when_it_is_the_odd_one_out() {
        assert_eq!(skew_from_offsets(&[-30_000, -30_050], 3), Some(30_000), "both others are 30 s behind: this one is ahead");
        assert_eq!(skew_from_offsets(&[30_000, 5], 3), Some(-5), "one other is off: this one is fine");
        assert_eq!(skew_from_offsets(&[-20], 3), None, "two clocks decide nothing");
        assert_eq!(skew_from_offsets(&[-9_000, -9_000, 40], 5), Some(0), "of two middle values, the nearer");
        assert_eq!(skew_from_offsets(&[-9_000, -9_000, -9_100, 40], 5), Some(9_000));
        assert_eq!(skew_from_offsets(&[-9_000, -9_000], 7), None, "not a majority of seven");
    }
}
