//! gnomon-worker: executes attempts, and is the worker side of the
//! `gnomon.worker.v1` protocol.
//!
//! [`execute`] runs one attempt with the `shell`, `http` or `handler`
//! executor and always returns an [`ExecOutcome`]; it never panics on job
//! input. [`WorkerRuntime`] is the worker process: sessions to the leader,
//! leases and self-fencing, the report spool, drain. `gnomon worker`,
//! `gnomon dev`'s embedded worker and Rust programs with their own handlers
//! (see `examples/custom_handler.rs`) all run it.

pub mod cgroup;
pub mod executor;
pub mod isolation;
pub mod live;
pub mod session;
mod spool;
mod tail;

pub use executor::{execute, ExecOutcome, ExecRequest, Fence, Handler, HandlerContext, HandlerError, HandlerLog, HandlerRegistry};
pub use gnomon_core::outcome::RetryHint;
/// Where HTTP jobs may connect (the `gnomon-egress` crate).
pub use gnomon_egress as egress;
pub use session::{WorkerConfig, WorkerRuntime, WorkerTls};
pub use tail::{OutputTail, MAX_OUTPUT_BYTES};

/// An error with its causes ("transport error" alone says nothing).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        cur = c.source();
    }
    text
}
