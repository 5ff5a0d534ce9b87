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
                .ok()?;
            let handle = builder.install_recorder().ok()?;
            describe();
            Some(handle)
        })
        .clone()
}

fn describe() {
    metrics::describe_counter!("gnomon_leader_election_total", "Leader election outcomes by backend and result");
    metrics::describe_gauge!("gnomon_is_leader", "1 while this node leads the scope");
    metrics::describe_counter!("gnomon_runs_total", "Run state transitions by target state");
    metrics::describe_histogram!("gnomon_fire_lateness_seconds", "Scheduled time to run creation");
    metrics::describe_histogram!("gnomon_dispatch_latency_seconds", "Run ready to attempt assigned");
    metrics::describe_gauge!("gnomon_workers", "Worker sessions by state");
    metrics::describe_histogram!(
        "gnomon_store_turn_write_seconds",
        "Duration of the leader's per-turn store write (fire, results and assignments in one commit)"
    );
    metrics::describe_counter!("gnomon_fencing_rejections_total", "Leader writes rejected for carrying a stale token");
    metrics::counter!("gnomon_fencing_rejections_total").increment(0);
}
