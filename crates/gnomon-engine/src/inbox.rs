//! [`Inbox`]: what came in that the store does not have yet, kept across
//! a rebuild (it is the callers' and the workers' words, not a copy of the
//! store): commands held while the cache is stale, asks for runs and
//! backfills waiting for a turn, worker reports not yet written, and
//! attempts a live worker's heartbeats say it does not hold.
//!
//! Invariants (checked by the tests below):
//! - it is bounded: past [`MAX_HELD`] held commands, [`MAX_ASKS`] new asks
//!   or [`MAX_REPORTS`] reports, what comes in is handed back to be
//!   refused (a caller hears 503, a worker keeps its unacknowledged report
//!   spooled and sends it again);
//! - held commands come out in the order they went in;
//! - reports whose write failed go back ahead of those that came since,
//!   so a worker's reports are written in the order it sent them.

use std::collections::VecDeque;

use gnomon_core::outcome::ExecOutcome;
use gnomon_core::Millis;

use crate::runbook::RunId;

/// What workers report, as the leader batches it.
#[derive(Debug, Clone)]
pub enum WorkerEvent {
    Started { worker: String, run_id: String, attempt: u32, at: Millis },
    Finished { worker: String, run_id: String, attempt: u32, outcome: ExecOutcome, started_at: Millis, at: Millis },
}

/// The most commands held while the cache is stale.
pub const MAX_HELD: usize = 10_000;
/// The most new asks waiting for a turn.
pub const MAX_ASKS: usize = 10_000;
/// The most worker reports waiting to be written.
pub const MAX_REPORTS: usize = 100_000;

/// The inbox of a leader whose commands are `C` and whose asks (for runs
/// and backfills) are `A`.
pub struct Inbox<C, A> {
    /// Commands that need the cache, held while it is stale.
    deferred: VecDeque<C>,
    /// Asks for runs and backfills, planned by the next turn.
    asks: Vec<A>,
}

/// The workers' side of the inbox, which the engine plans over: reports
/// not yet written, and attempts a live worker's heartbeats say it does
/// not hold.
#[derive(Default)]
pub struct Reports {
    /// Worker reports not yet written.
    events: Vec<WorkerEvent>,
    /// Attempts a live worker's heartbeats say it does not hold: (worker,
    /// run), ended `lost` at the next turn.
    unheld: Vec<(String, RunId)>,
}

impl<C, A> Default for Inbox<C, A> {
    fn default() -> Self {
        Inbox { deferred: VecDeque::new(), asks: Vec::new() }
    }
}

impl<C, A> Inbox<C, A> {
    /// Holds a command until the cache is rebuilt; hands it back when
    /// [`MAX_HELD`] are held.
    pub fn defer(&mut self, cmd: C) -> Result<(), Box<C>> {
        if self.deferred.len() >= MAX_HELD {
            return Err(Box::new(cmd));
        }
        self.deferred.push_back(cmd);
        Ok(())
    }

    /// The next held command.
    pub fn next_deferred(&mut self) -> Option<C> {
        self.deferred.pop_front()
    }

    /// A new ask, for the next turn to plan; handed back when
    /// [`MAX_ASKS`] wait.
    pub fn ask(&mut self, ask: A) -> Result<(), Box<A>> {
        if self.asks.len() >= MAX_ASKS {
            return Err(Box::new(ask));
        }
        self.asks.push(ask);
        Ok(())
    }

    /// An ask a turn took and goes on with next turn (it was counted when
    /// it came in).
    pub fn ask_again(&mut self, ask: A) {
        self.asks.push(ask);
    }

    /// The asks to plan now, in the order they came, taken out.
    pub fn take_asks(&mut self) -> Vec<A> {
        std::mem::take(&mut self.asks)
    }

    /// Asks a turn took and could not plan (a read failed): back in, ahead
    /// of those that came since.
    pub fn put_back_asks(&mut self, mut asks: Vec<A>) {
        asks.append(&mut self.asks);
        self.asks = asks;
    }

    /// Whether asks wait for a turn.
    pub fn has_asks(&self) -> bool {
        !self.asks.is_empty()
    }
}

impl Reports {
    /// A worker's report, to be written; `false` (not taken) when
    /// [`MAX_REPORTS`] wait.
    pub fn report(&mut self, event: WorkerEvent) -> bool {
        if self.events.len() >= MAX_REPORTS {
            return false;
        }
        self.events.push(event);
        true
    }

    /// The reports to write now, taken out.
    pub fn take_reports(&mut self) -> Vec<WorkerEvent> {
        std::mem::take(&mut self.events)
    }

    /// Reports whose write failed: back in, ahead of those that came since.
    pub fn put_back(&mut self, mut events: Vec<WorkerEvent>) {
        events.append(&mut self.events);
        self.events = events;
    }

    /// The reports not yet written.
    pub fn reports(&self) -> &[WorkerEvent] {
        &self.events
    }

    /// Attempts found not held by their worker.
    pub fn unheld(&mut self, gone: impl IntoIterator<Item = (String, RunId)>) {
        self.unheld.extend(gone);
    }

    /// The attempts found not held, taken out.
    pub fn take_unheld(&mut self) -> Vec<(String, RunId)> {
        std::mem::take(&mut self.unheld)
    }

    /// Forgets the attempts found not held (a rebuild finds them again).
    pub fn forget_unheld(&mut self) {
        self.unheld.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestInbox = Inbox<u32, &'static str>;

    fn started(run: &str) -> WorkerEvent {
        WorkerEvent::Started { worker: "w".into(), run_id: run.into(), attempt: 1, at: 0 }
    }

    fn run_of(e: &WorkerEvent) -> &str {
        match e {
            WorkerEvent::Started { run_id, .. } | WorkerEvent::Finished { run_id, .. } => run_id,
        }
    }

    #[test]
    fn reports_whose_write_failed_go_back_ahead_of_newer_ones() {
        let mut inbox = Reports::default();
        inbox.report(started("a"));
        inbox.report(started("b"));
        let taken = inbox.take_reports();
        assert!(inbox.report(started("c")));
        inbox.put_back(taken);
        assert_eq!(inbox.reports().iter().map(run_of).collect::<Vec<_>>(), ["a", "b", "c"]);
    }

    #[test]
    fn it_hands_back_what_comes_past_its_bounds() {
        let mut inbox = TestInbox::default();
        for i in 0..MAX_HELD {
            assert!(inbox.defer(i as u32).is_ok());
        }
        assert_eq!(inbox.defer(7).map_err(|c| *c), Err(7));
        let mut reports = Reports::default();
        for i in 0..MAX_REPORTS {
            assert!(reports.report(started(&i.to_string())));
        }
        assert!(!reports.report(started("over")), "a report past the bound is not taken");
        let taken = reports.take_reports();
        assert!(reports.report(started("next")), "room again once the reports are taken");
        reports.put_back(taken);
        assert_eq!(reports.reports().len(), MAX_REPORTS + 1, "reports put back are never dropped");
        for _ in 0..MAX_ASKS {
            assert!(inbox.ask("trigger").is_ok());
        }
        assert_eq!(inbox.ask("one too many").map_err(|a| *a), Err("one too many"));
        inbox.ask_again("goes on");
        assert_eq!(inbox.take_asks().len(), MAX_ASKS + 1, "an ask a turn goes on with is never refused");
    }

    #[test]
    fn held_commands_come_out_in_order() {
        let mut inbox = TestInbox::default();
        inbox.defer(1).unwrap();
        inbox.defer(2).unwrap();
        assert_eq!(inbox.next_deferred(), Some(1));
        assert_eq!(inbox.next_deferred(), Some(2));
        assert!(inbox.next_deferred().is_none());
        let mut reports = Reports::default();
        reports.unheld([("w".to_string(), RunId::from("r"))]);
        assert_eq!(reports.take_unheld().len(), 1);
        reports.unheld([("w".to_string(), RunId::from("r"))]);
        reports.forget_unheld();
        assert!(reports.take_unheld().is_empty());
    }
}
