//! [`Inbox`]: what came in that the store does not have yet, kept across
//! a rebuild (it is the callers' and the workers' words, not a copy of the
//! store): commands held while the cache is stale, asks for runs and
//! backfills waiting for a turn, worker reports not yet written, and
//! attempts a live worker's heartbeats say it does not hold.
//!
//! Invariants (checked by the tests below):
//! - held commands come out in the order they went in;
//! - reports whose write failed go back ahead of those that came since,
//!   so a worker's reports are written in the order it sent them.

use std::collections::VecDeque;

use super::asks::Ask;
use super::results::WorkerEvent;
use super::runbook::RunId;
use super::LeaderCommand;

#[derive(Default)]
pub(super) struct Inbox {
    /// Commands that need the cache, held while it is stale.
    deferred: VecDeque<LeaderCommand>,
    /// Asks for runs and backfills, planned by the next turn.
    asks: Vec<Ask>,
    /// Worker reports not yet written.
    events: Vec<WorkerEvent>,
    /// Attempts a live worker's heartbeats say it does not hold: (worker,
    /// run), ended `lost` at the next turn.
    unheld: Vec<(String, RunId)>,
}

impl Inbox {
    /// Holds a command until the cache is rebuilt.
    pub(super) fn defer(&mut self, cmd: LeaderCommand) {
        self.deferred.push_back(cmd);
    }

    /// The next held command.
    pub(super) fn next_deferred(&mut self) -> Option<LeaderCommand> {
        self.deferred.pop_front()
    }

    /// An ask, for the next turn to plan.
    pub(super) fn ask(&mut self, ask: Ask) {
        self.asks.push(ask);
    }

    /// The asks to plan now, in the order they came, taken out.
    pub(super) fn take_asks(&mut self) -> Vec<Ask> {
        std::mem::take(&mut self.asks)
    }

    /// Asks a turn took and could not plan (a read failed): back in, ahead
    /// of those that came since.
    pub(super) fn put_back_asks(&mut self, mut asks: Vec<Ask>) {
        asks.append(&mut self.asks);
        self.asks = asks;
    }

    /// Whether asks wait for a turn.
    pub(super) fn has_asks(&self) -> bool {
        !self.asks.is_empty()
    }

    /// A worker's report, to be written.
    pub(super) fn report(&mut self, event: WorkerEvent) {
        self.events.push(event);
    }

    /// The reports to write now, taken out.
    pub(super) fn take_reports(&mut self) -> Vec<WorkerEvent> {
        std::mem::take(&mut self.events)
    }

    /// Reports whose write failed: back in, ahead of those that came since.
    pub(super) fn put_back(&mut self, mut events: Vec<WorkerEvent>) {
        events.append(&mut self.events);
        self.events = events;
    }

    /// The reports not yet written.
    pub(super) fn reports(&self) -> &[WorkerEvent] {
        &self.events
    }

    /// Attempts found not held by their worker.
    pub(super) fn unheld(&mut self, gone: impl IntoIterator<Item = (String, RunId)>) {
        self.unheld.extend(gone);
    }

    /// The attempts found not held, taken out.
    pub(super) fn take_unheld(&mut self) -> Vec<(String, RunId)> {
        std::mem::take(&mut self.unheld)
    }

    /// Forgets the attempts found not held (a rebuild finds them again).
    pub(super) fn forget_unheld(&mut self) {
        self.unheld.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut inbox = Inbox::default();
        inbox.report(started("a"));
        inbox.report(started("b"));
        let taken = inbox.take_reports();
        inbox.report(started("c"));
        inbox.put_back(taken);
        assert_eq!(inbox.reports().iter().map(run_of).collect::<Vec<_>>(), ["a", "b", "c"]);
    }

    #[test]
    fn held_commands_come_out_in_order() {
        let mut inbox = Inbox::default();
        inbox.defer(LeaderCommand::Nudge);
        inbox.defer(LeaderCommand::RunChanged { run_id: "r".into() });
        assert!(matches!(inbox.next_deferred(), Some(LeaderCommand::Nudge)));
        assert!(matches!(inbox.next_deferred(), Some(LeaderCommand::RunChanged { .. })));
        assert!(inbox.next_deferred().is_none());
        inbox.unheld([("w".to_string(), RunId::from("r"))]);
        assert_eq!(inbox.take_unheld().len(), 1);
        inbox.unheld([("w".to_string(), RunId::from("r"))]);
        inbox.forget_unheld();
        assert!(inbox.take_unheld().is_empty());
    }
}
