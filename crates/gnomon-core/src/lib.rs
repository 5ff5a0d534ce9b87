//! gnomon-core: the domain of gnomon and its pure logic.
//!
//! This crate does no I/O and has no async runtime. Everything here can be
//! tested with an injected [`clock::Clock`] and without sleeping.

#![warn(missing_docs)]

pub mod backpressure;
pub mod clock;
pub mod deps;
pub mod duration;
pub mod error;
pub mod fence;
pub mod int;
pub mod jitter;
pub mod notify;
pub mod outcome;
pub mod params;
pub mod policy;
pub mod preview;
pub mod quota;
pub mod retry;
pub mod routing;
pub mod run;
pub mod schedule;
#[cfg(feature = "openapi")]
pub mod schema;
pub mod spec;
pub mod triggers;

pub use chrono;
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::SpecError;
pub use run::{AttemptState, RunState};
pub use schedule::Schedule;
pub use spec::{Executor, JobSpec};

/// Timestamps are carried as milliseconds since the Unix epoch (UTC) across
/// every boundary (store, wire, policies), so that comparisons are exact.
pub type Millis = i64;

/// Converts milliseconds since the epoch to a UTC date-time. Out-of-range
/// values saturate at the epoch instead of panicking.
pub fn millis_to_datetime(ms: Millis) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// RFC 3339 rendering with millisecond precision and a `Z` suffix.
pub fn format_millis(ms: Millis) -> String {
    millis_to_datetime(ms).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
