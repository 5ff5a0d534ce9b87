//! The gnomon worker protocol, `gnomon.worker.v1`: one bidirectional
//! `Session` stream per worker. The `.proto` file under `proto/` is the
//! reference (it documents the session life cycle, leases, self-fencing and
//! tokens) for workers written in any language.

#![allow(clippy::all, clippy::pedantic)]

pub mod v1 {
    tonic::include_proto!("gnomon.worker.v1");
}

/// `gnomon.raft.v1`: what the members of a `raft://` cluster say to each other.
pub mod raft {
    tonic::include_proto!("gnomon.raft.v1");
}

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = v1::ProtocolVersion::ProtocolVersion1 as u32;
