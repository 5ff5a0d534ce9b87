//! One term: the leader runtime with its neighbours (the clock keeper,
//! retention, the notifier, the watch on the elector's `lost`), and the
//! teardown in order once it ends.

use std::sync::Arc;

use gnomon_backend::{Fence, Leadership};
use tokio::sync::{mpsc, watch};

use super::admission::TermStart;
use super::{retention_loop, Node, KEEPER_STOP, SCOPE};
use crate::leader::{LeaderExit, LeaderParts, LeaderRuntime, WorkersView};
use crate::leader_time::{Keeper, LeaderClock};

impl Node {
    /// Leads the admitted term until it ends; its exit, and whether the
    /// clock stepped this node down meanwhile.
    pub(super) async fn lead(&self, leadership: &Leadership, start: TermStart, shutdown: &watch::Receiver<bool>) -> (LeaderExit, bool) {
        let backend = self.elector.backend();
        let limits = self.handle.config.clock;
        let TermStart { committed, start_skew, server_center } = start;
        metrics::counter!("gnomon_leader_election_total", "backend" => backend, "result" => "acquired").increment(1);
        metrics::gauge!("gnomon_is_leader", "scope" => SCOPE).set(1.0);
        tracing::info!(token = leadership.token, backend, "leading scope {SCOPE}");
        let (cmd_tx, cmd_rx) = mpsc::channel(8192);
        let view = WorkersView::default();
        let live = crate::live::LiveOutputs::default();
        {
            let mut st = self.handle.write();
            st.term = Some((leadership.token, cmd_tx));
            st.workers = view.clone();
            st.live = live.clone();
        }
        let fence = Fence { scope: SCOPE.into(), token: leadership.token };
        let clock = Arc::new(LeaderClock::new(self.handle.clock.clone(), committed, start_skew, limits));
        // The term ends when the elector says so or the keeper does.
        let (step_tx, step_rx) = watch::channel(false);
        let forward = tokio::spawn({
            let (mut lost, step_tx) = (leadership.lost.clone(), step_tx.clone());
            async move {
                if lost.wait_for(|l| *l).await.is_ok() {
                    let _ = step_tx.send(true);
                }
            }
        });
        let stepped_before = self.handle.clock_status().stepped_down_at;
        let (keeper_stop, keeper_stopped) = watch::channel(false);
        let keeper = tokio::spawn(
            Keeper {
                store: self.handle.store.clone(),
                fence: fence.clone(),
                clock: clock.clone(),
                skew_known: start_skew.is_some(),
                server_center,
                limits,
                status: self.handle.clock_status.clone(),
                step_down: step_tx,
            }
            .run(keeper_stopped),
        );
        let runtime = LeaderRuntime::new(LeaderParts {
            store: self.handle.store.clone(),
            fence: fence.clone(),
            clock: clock.clone(),
            config: self.handle.config.leader.clone(),
            commands: cmd_rx,
            lost: step_rx,
            shutdown: shutdown.clone(),
            view,
            live,
            seed: rand::random(),
        });
        let retention =
            tokio::spawn(retention_loop(self.handle.store.clone(), fence.clone(), self.handle.config.leader.clone(), clock.clone()));
        let notifier = tokio::spawn(crate::notifier::notify_loop(self.handle.store.clone(), fence, clock, crate::notifier::env_secrets()));
        let exit = runtime.run().await;
        retention.abort();
        notifier.abort();
        forward.abort();
        // The keeper finishes a commit under way (bounded: the store
        // may be gone), so none lands after the term has ended here.
        let _ = keeper_stop.send(true);
        let keeper_abort = keeper.abort_handle();
        if tokio::time::timeout(KEEPER_STOP, keeper).await.is_err() {
            keeper_abort.abort();
        }
        let clock_fault = self.handle.clock_status().stepped_down_at != stepped_before;
        {
            let mut st = self.handle.write();
            st.term = None;
            st.workers = WorkersView::default();
            st.live = crate::live::LiveOutputs::default();
        }
        metrics::gauge!("gnomon_is_leader", "scope" => SCOPE).set(0.0);
        metrics::gauge!("gnomon_workers", "state" => "live").set(0.0);
        let result = match exit {
            LeaderExit::Shutdown => "resigned",
            LeaderExit::Lost | LeaderExit::Fenced => "lost",
        };
        metrics::counter!("gnomon_leader_election_total", "backend" => backend, "result" => result).increment(1);
        tracing::info!(?exit, "leader loops stopped");
        (exit, clock_fault)
    }
}
