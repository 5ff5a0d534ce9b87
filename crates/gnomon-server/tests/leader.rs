//! Leader runtime, with an injected clock and a real SQLite store: step-down
//! on loss and on being fenced, store faults, triggers and job edits,
//! one write per turn, and worker sessions (one module each, their shared harness in
//! `leader/harness.rs`).

#[path = "sim/store.rs"]
#[allow(dead_code)]
mod faulty;
#[path = "leader/harness.rs"]
mod harness;
#[path = "leader/hints.rs"]
mod hints;
#[path = "leader/stepdown.rs"]
mod stepdown;
#[path = "leader/turn.rs"]
mod turn;
#[path = "leader/workers.rs"]
mod workers;
#[path = "leader/writes.rs"]
mod writes;
