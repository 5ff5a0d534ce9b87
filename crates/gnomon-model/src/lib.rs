//! A model of gnomon's attempt protocol, checked exhaustively with
//! [stateright](https://docs.rs/stateright).
//!
//! This is not gnomon's code: it is a small, abstract copy of the protocol
//! that decides who runs a run's attempts — leader terms and the store's
//! fencing token, assignments, each worker's session and its lease, worker
//! self-fencing, the leader's overrun backstop, retries, the rebuild of
//! the leader's cache and the reclaim of running attempts after a
//! failover — and of the fenced step a job commits in its own database
//! (`gnomon-fence`). The checker visits every state the model can reach
//! within its bound and judges the properties below in each.
//! `cargo test -p gnomon-model` runs it (`tests/check.rs`).
//!
//! # What the model keeps
//!
//! - **The store** ([`state::Store`]) is the truth: one run per scheduled
//!   instant (created once, keyed by the instant), each with its attempts
//!   (worker, the token of the leader that assigned it, state, whether its
//!   start was recorded and how long ago it began), and the current
//!   fencing token. Every leader write carries its token; the store
//!   refuses one that is not the current fence (invariant 2), and the
//!   model records whether a write with an older token ever landed.
//! - **Leaders.** Term 1 leads from the start; [`Action::Elect`] starts the
//!   next term (the model has two): the token goes up by one and is fenced
//!   in the store before the new leader does anything, every worker's
//!   stream is cut, and the new leader rebuilds its cache from the store
//!   (`recover`). A leader still up when the next term starts is *deposed*:
//!   it may still have one write on its way ([`Action::StaleFire`],
//!   [`Action::StaleEnd`]), acks nothing, and stops at its first refusal
//!   (invariant 5). The leader's cache ([`state::Leader`]) holds its
//!   workers' session leases and, per run, the live attempt's holder or
//!   the orphan deadline of an attempt waiting for its worker to reclaim
//!   it. [`Action::Rebuild`] rebuilds it within a term (a store error,
//!   invariant 22), keeping the workers' session leases. A leader fires
//!   what is due before time moves on; it assigns a pending run to a
//!   worker with a session and a free slot, ends a session whose lease ran
//!   out (its attempts `lost`), an orphan past its deadline (`lost`) and
//!   an attempt past its timeout counted from when it began (`timed_out`,
//!   and tells its worker to stop it), records reports from an attempt's
//!   holder only, and moves retrying runs back to pending.
//! - **Workers** (two, each running one attempt at a time): an up worker
//!   with a stream and a session is heartbeated and acked every tick, and
//!   handles what reached it on its stream (an assignment, an abort)
//!   before that ack, as the stream is in order. An assignment reaching an
//!   up worker starts at once (registering the attempt's fence in the
//!   job's database with `begin_attempt`); a frozen worker takes it when
//!   it resumes, and drops it if its fence lapsed meanwhile or its token is
//!   below the highest it has seen. A worker whose fence lapsed (no ack for
//!   `self_fence_after` ticks) kills its attempt and spools it `lost`: an
//!   up worker as the fence lapses, a frozen one once it resumes — where it
//!   may still act before its watchdog does, as a real process can. Its
//!   executor stops an attempt at its timeout. A report goes out at once on
//!   a stream to the leader, or is spooled and sent again after the next
//!   `Hello`, which lists the running attempt: the leader reclaims it if it
//!   is the run's current attempt and waits for its worker, else the
//!   worker stops it (superseded).
//! - **The job's database** ([`state::JobDb`]): one step `s` per run, done
//!   in one transaction under the run's row lock. [`StepRule::Record`] is
//!   `gnomon-fence`'s rule (invariant 47): the first attempt to commit the
//!   `(run, s)` record wins, any other attempt finds the record and writes
//!   nothing, and an attempt older than the run's newest started attempt
//!   commits no step without a record. An attempt may freeze inside its
//!   transaction ([`Action::PauseInTx`]); the database's idle-transaction
//!   timeout aborts a frozen holder's transaction ([`Action::TxTimeout`]),
//!   so the lock is never held for ever; a resumed holder whose
//!   transaction survived may still commit.
//! - **Faults**: a worker paused (also inside its step transaction), killed
//!   or cut off, a leader crash, a store error (a rebuild); a new term may
//!   also depose a leader that is still up.
//!
//! # Time
//!
//! Time moves by [`Action::Tick`], and every timer is kept relative and
//! capped where the rules stop telling values apart: a worker's ticks
//! since its last ack, a session's and an orphan's ticks left, an
//! attempt's age. There is no horizon: the state graph is finite and
//! closed, so the check covers behaviours of any length. The lease is 2
//! ticks (a session ends when a full lease has passed since its last
//! heartbeat), a worker's fence lapses after 2 ticks without an ack
//! (`self_fence_fraction` 0.7 × 2, rounded up), and the timeout is 3 ticks.
//! The real leader's grace before the overrun backstop
//! (`OVERRUN_GRACE_MS` plus a lease) and reconnect slack are 0 here, which
//! only makes the leader quicker to end attempts.
//!
//! # The bound
//!
//! The exhaustive check (`tests/check.rs`) runs the fixed protocol with one
//! scheduled instant, two workers (states that differ only by the
//! workers' names are explored once), two leader terms, `max_attempts` 2,
//! and at most one fault per behaviour besides the failover: 874,831
//! states, about 12 s in a debug build. `GNOMON_MODEL_FAULTS=2` checks
//! two faults (10,092,704 states, about 3 minutes) and
//! `GNOMON_MODEL_TIMEOUT` a longer timeout. Two instants (the second due a
//! tick after the first) are checked for every behaviour of up to 12
//! steps (`GNOMON_MODEL_DEPTH`), about 1.5 million states. A state where
//! every run has ended, no worker holds or is sent anything and no deposed
//! leader has a write on its way has no successor.
//!
//! # Properties
//!
//! Each is a stateright property of [`AttemptModel`] ([`properties`]):
//!
//! | property | holds because (in gnomon) |
//! | --- | --- |
//! | `at_most_one_live_attempt_per_run`: in the store only the run's current attempt is assigned or running; of the workers, at most one runs an attempt of the run that it would keep running (up, fence not lapsed, within its timeout) | CAS transitions in the store (invariant 3); one holder per attempt (`RunBook`, invariant 24); leases end a session only a full lease after its last heartbeat (`leader/workers.rs` `plan_expiries`, invariant 25), and orphans wait a lease from the term's start (`leader/runs.rs` `recover`), and another from their worker's `Hello` if it does not list them (its report may be spooled: `RunBook::await_reports_of`) while the worker fences itself within 0.7 × the lease (`gnomon-worker/src/session/mod.rs` `fence_lapsed`, `fence_self`, the watchdog in `connect.rs`, invariant 32); a `Hello` reclaims only the current attempt (`leader/workers.rs` `open_session`) |
//! | `no_stale_token_write_lands`: no write lands with a token below the fence | every leader write is fenced in its transaction (`gnomon-backend` `LeaderWrites`, invariant 2); tokens only grow and are fenced before a term starts (invariant 5) |
//! | `live_worker_attempt_never_ended_early`: an attempt whose worker, since it started, was never paused, killed or cut off and kept its acks is never ended `lost` or `timed_out` by the leader before its timeout counted from its start | the overrun backstop counts from `OpenRun::began_at` (`leader/workers.rs` `expire_overruns`), which `recover` restores from the store (`RunBook::restore_attempt_times`, invariant 24); leases and orphan deadlines as above |
//! | `step_commits_at_most_once`: each run's step commits its effect at most once | `gnomon-fence`'s step record, `begin_attempt` and the row lock (invariant 47) |
//! | `every_due_instant_gets_exactly_one_run`: an instant's run is created at most once, and a leader that has led across a tick has fired every instant due before it | `fire` is insert-or-ignore on `(job_uid, scheduled_at)` (invariant 1); `plan_fires` leaves no gap (invariant 4) |
//!
//! and `sometimes` properties that show the model is not vacuous: a run
//! succeeds on an attempt reclaimed after a failover, a step commits, a
//! retry happens, a run fails after its last attempt, an attempt takes
//! another's recorded step result, a superseded attempt is refused its
//! step, a frozen holder's transaction is aborted while another attempt
//! commits, the store refuses a deposed leader's write, the backstop ends
//! an overrun, a worker fences itself, an attempt is lost.
//!
//! # Defects put back
//!
//! [`Config`] can put back what the protocol once did, and the checker
//! finds each (the tests print the trace):
//!
//! - [`Config::rebuild_forgets_start`]: `recover` loaded live attempts with
//!   `assigned_at = 0`, so a new leader's backstop ended a reclaimed,
//!   healthy attempt `timed_out` on its first pass and the run ran again —
//!   `live_worker_attempt_never_ended_early` fails.
//! - [`StepRule::LaterAttemptOnly`]: the old guard, refusing only when a
//!   later attempt had written, with no step record —
//!   `step_commits_at_most_once` fails.
//! - [`Config::store_checks_tokens`] off: a deposed leader's write lands —
//!   `no_stale_token_write_lands` fails.
//! - [`Config::self_fence_after`] past the lease: a worker cut off keeps
//!   running the attempt the leader retried elsewhere —
//!   `at_most_one_live_attempt_per_run` fails.
//!
//! # What it leaves out
//!
//! Message loss other than a cut stream, a worker's capacity above one and
//! prefetch, reconciliation of attempts a live worker does not list,
//! cancels, retry backoff, more than one step per run, namespaces and
//! credentials, store-kept session leases (etcd), writes of unknown
//! outcome other than a rebuild, and the leader's own clock.

pub mod model;
pub mod properties;
pub mod state;
pub mod trace;

pub use model::{Action, AttemptModel, Config, StepRule};
