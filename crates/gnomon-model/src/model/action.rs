//! What can happen: [`Action`].

use crate::state::Outcome;

/// What can happen. Workers and runs are named by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The clock moves one tick; every up worker with a stream and a
    /// session to the leader heartbeats and is acked (its lease renewed).
    Tick,
    /// A new term: token + 1, fenced in the store; the leader rebuilds its
    /// cache from the store; a leader still up is deposed (a write of it
    /// may still be on its way); every worker's stream is cut.
    Elect,
    /// The leader's process dies (a new term follows).
    Crash,
    /// The leader rebuilds its cache from the store (a store error),
    /// keeping each worker's session.
    Rebuild,
    /// The leader fires an instant: creates its run, keyed by the instant
    /// (a second fire is refused).
    Fire(u8),
    /// The leader assigns a pending run's next attempt to a worker (a
    /// fenced write, then the `Assign` message).
    Assign {
        /// The run.
        run: u8,
        /// The worker.
        worker: u8,
    },
    /// The leader moves a retrying run back to pending.
    Retry(u8),
    /// The leader ends a session whose lease ran out: its attempts are lost.
    ExpireLease(u8),
    /// The leader ends an orphan past its deadline: lost.
    ExpireOrphan(u8),
    /// The leader's backstop ends an attempt past its timeout: timed out,
    /// and its worker is told to stop it.
    Overrun(u8),
    /// The deposed leader's write creating a run arrives at the store.
    StaleFire(u8),
    /// The deposed leader's write ending a run's attempt lost arrives.
    StaleEnd(u8),
    /// The deposed leader notices and stops.
    DeposedStops,
    /// A worker takes the assignment sent to it and starts it, registering
    /// its fence in the job's database (or drops it: a stale token, a
    /// lapsed fence).
    Receive(u8),
    /// A worker (re)connects to the current leader: its `Hello` lists the
    /// attempt it runs, which it reclaims or is told is superseded.
    Hello(u8),
    /// A worker's stream is cut (a fault).
    Disconnect(u8),
    /// A worker freezes (a fault).
    Pause(u8),
    /// A frozen worker runs again.
    Resume(u8),
    /// A worker's process dies with its attempt (a fault).
    Kill(u8),
    /// A worker whose fence lapsed kills its attempt and spools it `lost`.
    SelfFence(u8),
    /// A worker handles an `Abort`: stops the attempt, does not report it.
    HandleAbort(u8),
    /// A worker's attempt ends; the report is sent on the worker's stream
    /// to the leader, or spooled while it has none.
    Finish(u8, Outcome),
    /// A worker's spooled report reaches the leader, which records it or
    /// refuses it as stale; the report is acked.
    Report(u8),
    /// A worker's attempt commits its step in one transaction (the run's
    /// row lock taken and released).
    Commit(u8),
    /// A worker's attempt opens its step transaction, takes the run's row
    /// lock and freezes inside it (a fault).
    PauseInTx(u8),
    /// A resumed worker's attempt commits the transaction it held.
    TxCommit(u8),
    /// The database's idle-in-transaction timeout aborts the transaction
    /// of a frozen holder of the run's row lock.
    TxTimeout(u8),
}
