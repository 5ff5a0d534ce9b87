//! The gnomon worker protocol, `gnomon.worker.v1`: one bidirectional
//! `Session` stream per worker. The `.proto` file under `proto/` is the
//! reference (it documents the session life cycle, leases, self-fencing and
//! tokens) for workers written in any language.

#![allow(clippy::all, clippy::pedantic)]

pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/gnomon.worker.v1.rs"));
}

/// `gnomon.raft.v1`: what the members of a `raft://` cluster say to each other.
pub mod raft {
    include!(concat!(env!("OUT_DIR"), "/gnomon.raft.v1.rs"));
}

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = v1::ProtocolVersion::ProtocolVersion1 as u32;

/// The limits both ends of a session hold to: a server refuses a `Hello`
/// over them, a worker refuses to start with them.
pub mod limits {
    /// The most attempts a worker may run at once (`Hello.capacity`).
    pub const MAX_CAPACITY: u32 = 65_536;
    /// The most attempts a worker may hold queued beyond its capacity
    /// (`Hello.prefetch`).
    pub const MAX_PREFETCH: u32 = 65_536;
    /// The most output an attempt reports: the last this many bytes of its
    /// stdout and stderr.
    pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;
}
