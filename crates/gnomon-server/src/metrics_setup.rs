//! Prometheus exporter setup and metric descriptions.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Installs the global recorder once per process and returns its handle.
pub fn install() -> Option<PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<PrometheusHandle>> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full("gnomon_fire_lateness_seconds".into()), &buckets)
                .ok()?
                .set_buckets_for_metric(Matcher::Full("gnomon_dispatch_latency_seconds".into()), &buckets)
                .ok()?
                .set_buckets_for_metric(Matcher::Full("gnomon_store_turn_write_seconds".into()), &buckets)
                .ok()?
                .set_buckets_for_metric(Matcher::Full("gnomon_leader_write_seconds".into()), &buckets)
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full("gnomon_leader_turn_writes".into()),
                    &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 32.0],
                )
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full("gnomon_leader_turn_rows".into()),
                    &[1.0, 10.0, 100.0, 500.0, 1_000.0, 2_500.0, 5_000.0, 10_000.0],
                )
                .ok()?;
            let handle = builder.install_recorder().ok()?;
            describe();
            Some(handle)
        })
        .clone()
}

/// A metric's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric gnomon records: its name, kind and HELP text. The
/// dashboards and alert rules under `deploy/` may only name these (a test
/// checks).
pub const METRICS: &[(&str, Kind, &str)] = &[
    ("gnomon_is_leader", Kind::Gauge, "1 while this node leads the scheduler scope, else 0"),
    ("gnomon_leader_election_total", Kind::Counter, "Leader election outcomes by backend and result (acquired, lost, error, refused)"),
    ("gnomon_fencing_rejections_total", Kind::Counter, "Leader writes the store rejected for carrying a stale fencing token"),
    (
        "gnomon_connections_closed_total",
        Kind::Counter,
        "Connections the listener closed by reason: shed (idle, to make room), refused (at once, every one busy), idle (no request within its deadline)",
    ),
    (
        "gnomon_leader_rebuilds_total",
        Kind::Counter,
        "Times the leader rebuilt its state from the store after an error it could not classify",
    ),
    ("gnomon_leader_rebuild_seconds", Kind::Histogram, "Duration of a leader state rebuild from the store"),
    (
        "gnomon_leader_inbox_refused_total",
        Kind::Counter,
        "Requests and worker reports the leader refused because its inbox was full, by bound (held, asks, reports)",
    ),
    ("gnomon_runs_total", Kind::Counter, "Run state transitions written by the leader, by target state"),
    ("gnomon_fire_lateness_seconds", Kind::Histogram, "Scheduled time to run creation"),
    ("gnomon_dispatch_latency_seconds", Kind::Histogram, "Run ready to attempt assigned"),
    (
        "gnomon_store_turn_write_seconds",
        Kind::Histogram,
        "Duration of the leader's per-turn store write (fire, results and assignments in one commit)",
    ),
    ("gnomon_store_fire_seconds", Kind::Histogram, "Decision to commit of a fire write"),
    ("gnomon_leader_write_seconds", Kind::Histogram, "Duration of each fenced store write the leader makes"),
    ("gnomon_leader_turn_writes", Kind::Histogram, "Fenced store writes per leader turn (turns that wrote)"),
    ("gnomon_leader_turn_rows", Kind::Histogram, "Runs, advances, transitions and backfill records written per leader turn"),
    ("gnomon_namespace_open_runs", Kind::Gauge, "A namespace's open runs and held keyed runs plus its running backfills' instants to come (its open_runs usage)"),
    ("gnomon_namespace_open_bytes", Kind::Gauge, "The params and payload bytes of a namespace's open runs and held keyed runs (its open_bytes usage)"),
    ("gnomon_namespace_backlog", Kind::Gauge, "A namespace's pending and waiting runs (what its backpressure counts)"),
    ("gnomon_namespace_backfills", Kind::Gauge, "A namespace's running backfills"),
    ("gnomon_namespace_backpressure_state", Kind::Gauge, "A namespace's own backpressure: 0 green, 1 yellow, 2 red (red defers its fires)"),
    ("gnomon_namespace_quota", Kind::Gauge, "A namespace's quotas, by quota"),
    ("gnomon_quota_refusals_total", Kind::Counter, "Requests refused by a namespace's quota (429), by namespace and quota"),
    ("gnomon_etcd_watch_opened_total", Kind::Counter, "etcd watch streams opened (first and after a cut)"),
    ("gnomon_etcd_watch_reloads_total", Kind::Counter, "etcd watches that re-read their keys in full after a compaction"),
    ("gnomon_store_size_bytes", Kind::Gauge, "Size of the store where it can tell, by backend"),
    ("gnomon_runs_pruned_total", Kind::Counter, "Terminal runs deleted by retention"),
    (
        "gnomon_notifications_total",
        Kind::Counter,
        "Notification deliveries, by target kind and result (sent, retry, failed: given up, skipped)",
    ),
    ("gnomon_notifications_due", Kind::Gauge, "Notifications due at the deliverer's last read (capped at one batch)"),
    ("gnomon_pending_runs", Kind::Gauge, "Runs waiting for a worker (on the leader)"),
    ("gnomon_backpressure_state", Kind::Gauge, "The leader's admission state: 0 green, 1 yellow, 2 red"),
    ("gnomon_workers", Kind::Gauge, "Worker sessions by state (on the leader)"),
    ("gnomon_worker_leases_expired_total", Kind::Counter, "Worker sessions whose lease expired: their attempts were declared lost"),
    ("gnomon_worker_lease_deletions_total", Kind::Counter, "Store-side worker leases the leader deleted after their TTL"),
    ("gnomon_attempts_unheld_total", Kind::Counter, "Attempts a live worker's heartbeats left out twice in a row, declared lost"),
    ("gnomon_asks_withdrawn_total", Kind::Counter, "Trigger asks withdrawn by their caller (it stopped waiting) before the leader planned them; nothing of them is written"),
    ("gnomon_reclaims_refused_total", Kind::Counter, "Attempts a worker session listed but may not reclaim (its credential does not cover their namespace); left alone"),
    (
        "gnomon_attempts_overrun_total",
        Kind::Counter,
        "Attempts past their timeout plus grace with no result, ended timed_out by the leader",
    ),
    ("gnomon_session_acks_coalesced_total", Kind::Counter, "Heartbeat acknowledgements merged into a newer one on a slow session"),
    ("gnomon_sessions_overflowed_total", Kind::Counter, "Worker sessions closed because their send queue overflowed"),
    ("gnomon_clock_skew_seconds", Kind::Gauge, "This node's wall clock minus the leader time, in seconds"),
    ("gnomon_clock_skew_warnings_total", Kind::Counter, "Times this node's clock skew went past --max-clock-skew"),
    ("gnomon_clock_skew_step_downs_total", Kind::Counter, "Terms given up or refused for a clock skew past --clock-skew-step-down"),
    ("gnomon_api_forwarded_total", Kind::Counter, "Leader-only API calls this node forwarded to the leader"),
];

fn describe() {
    for (name, kind, help) in METRICS {
        match kind {
            Kind::Counter => {
                metrics::describe_counter!(*name, *help);
                // Rendered from the start (at 0), so rates and alerts see them.
                if !["gnomon_runs_total", "gnomon_leader_election_total", "gnomon_quota_refusals_total"].contains(name) {
                    metrics::counter!(*name).increment(0);
                }
            }
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
            Kind::Histogram => metrics::describe_histogram!(*name, *help),
        }
    }
}
