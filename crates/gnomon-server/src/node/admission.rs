//! Before a term starts: campaign until elected, then admit the term only
//! if this node's clock agrees with the committed leader time (and, where
//! the store measures them, with the members' clocks), waiting for a clock
//! that is a little behind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gnomon_backend::{LeaderInfo, Leadership};
use gnomon_core::Millis;
use tokio::sync::watch;

use super::{Node, FIRST_MEASURE, SCOPE};
use crate::leader_time::{self, Meters};

/// What the admission of a new term decided.
pub(super) enum Admission {
    /// The term starts.
    Start(TermStart),
    /// The term was given back; campaign again after this pause.
    Refused(Duration),
    /// The node is shutting down (the term was given back).
    Shutdown,
}

/// Where an admitted term starts from.
pub(super) struct TermStart {
    /// The leader time the term starts at (the committed one, or this
    /// node's clock when a wrong clock left the committed one ahead).
    pub(super) committed: Millis,
    /// This node's skew against its reference, when known at the start.
    pub(super) start_skew: Option<i64>,
    /// The store server's clock as the centre of the skew, where it has one.
    pub(super) server_center: Option<i64>,
}

impl Node {
    /// Campaigns until this node is elected (`None`: shutting down). A
    /// failed campaign is retried after a second.
    pub(super) async fn campaign(&self, me: &LeaderInfo, shutdown: &mut watch::Receiver<bool>) -> Option<Leadership> {
        let backend = self.elector.backend();
        while !*shutdown.borrow() {
            let leadership = tokio::select! {
                r = self.elector.campaign(SCOPE, me) => r,
                _ = shutdown.changed() => return None,
            };
            match leadership {
                Ok(l) => return Some(l),
                Err(e) => {
                    metrics::counter!("gnomon_leader_election_total", "backend" => backend, "result" => "error").increment(1);
                    tracing::warn!(error = %e, "campaign failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = shutdown.changed() => {}
                    }
                }
            }
        }
        None
    }

    /// Decides whether the term `leadership` starts, from the committed
    /// leader time and this node's clock.
    pub(super) async fn admit(&self, leadership: &Leadership, meters: &Arc<Meters>, shutdown: &mut watch::Receiver<bool>) -> Admission {
        let backend = self.elector.backend();
        let limits = self.handle.config.clock;
        // The term starts from the committed leader time, and not at all
        // if this node's clock is too far from it.
        let Some(committed) = self.committed_leader_time().await else {
            tracing::warn!("cannot read the committed leader time; giving the term back");
            let _ = self.elector.resign(leadership).await;
            return Admission::Refused(Duration::from_secs(1));
        };
        // Where the store measures the members' clocks (raft), their
        // median is the better reference. A cluster's first leader has
        // no committed time and no readings to judge itself by: it
        // waits (briefly) for the first round trips to measure the
        // members, so that a wrong clock never commits the first
        // leader time, which every later leader would start from.
        let mut cluster_skew = self.handle.store.cluster_clock_skew();
        if committed == 0 && cluster_skew.is_none() && self.handle.store.measures_cluster_clocks() {
            let until = Instant::now() + FIRST_MEASURE;
            while cluster_skew.is_none() && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(50)).await;
                cluster_skew = self.handle.store.cluster_clock_skew();
            }
        }
        // Where the store server has a clock: this node against the
        // median of it, this node and the last leader.
        let mut server_center = None;
        if cluster_skew.is_none() {
            if let Some(me) = leader_time::server_offset(&*self.handle.store, &*self.handle.clock, 3).await {
                let leader = meters.leader_vs_server.lock().unwrap_or_else(|p| p.into_inner()).estimate(Instant::now()).map(|e| -e);
                cluster_skew = Some(leader_time::server_skew(me, leader));
                server_center = cluster_skew.map(|s| me - s);
            }
        }
        let wall = self.handle.clock.now_millis();
        let estimate = meters.leader.lock().unwrap_or_else(|p| p.into_inner()).estimate(Instant::now());
        let takeover = leader_time::Takeover { committed, wall, cluster_skew, estimate };
        let (committed, start_skew) = match leader_time::admission(takeover, limits) {
            leader_time::Admission::StepDown { skew } => {
                leader_time::report(&self.handle.clock_status, Some(skew), limits, "new leader");
                leader_time::stepped_down(&self.handle.clock_status, skew, limits, wall, "taking over");
                metrics::counter!("gnomon_leader_election_total", "backend" => backend, "result" => "refused").increment(1);
                if let Err(e) = self.elector.resign(leadership).await {
                    tracing::warn!(error = %e, "resign failed");
                }
                return Admission::Refused(leader_time::HOLD_OFF);
            }
            leader_time::Admission::Start { at, skew, reset_ahead } => {
                leader_time::report(&self.handle.clock_status, skew, limits, "new leader");
                if let Some(ahead_ms) = reset_ahead {
                    metrics::counter!("gnomon_clock_skew_warnings_total").increment(1);
                    tracing::error!(
                        ahead_ms,
                        "the committed leader time is ahead of this node's clock, which agrees with the cluster's, by more than --clock-skew-step-down: a wrong clock set it; this term starts from this node's clock"
                    );
                }
                (at, skew)
            }
        };
        if !self.wait_for_committed_time(committed, &limits, leadership, shutdown).await {
            let _ = self.elector.resign(leadership).await;
            if *shutdown.borrow() {
                return Admission::Shutdown;
            }
            return Admission::Refused(Duration::from_secs(1));
        }
        Admission::Start(TermStart { committed, start_skew, server_center })
    }
}
