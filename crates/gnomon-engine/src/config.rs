//! [`LeaderConfig`]: the leader's settings.

use gnomon_core::backpressure::BackpressureConfig;

#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// How late a scheduled time may be reached and still count as on time.
    pub misfire_grace_ms: i64,
    /// A worker session's lease: it is alive while heartbeats arrive within
    /// this time; after it, its attempts are `lost` and retried elsewhere.
    pub lease_ttl_ms: i64,
    /// How often workers heartbeat (told in `Welcome`).
    pub heartbeat_ms: i64,
    pub backpressure: BackpressureConfig,
    /// What each namespace may ask for (see [`gnomon_core::quota`]).
    pub quotas: gnomon_core::quota::Quotas,
    /// Retention, on stores that prune (etcd): terminal runs kept per job…
    pub retain_runs: usize,
    /// …and for how long.
    pub retain_ms: i64,
}

impl Default for LeaderConfig {
    fn default() -> Self {
        Self {
            misfire_grace_ms: 1000,
            lease_ttl_ms: 10_000,
            heartbeat_ms: 2_000,
            backpressure: BackpressureConfig::default(),
            quotas: gnomon_core::quota::Quotas::default(),
            retain_runs: 1000,
            retain_ms: 7 * 24 * 3600 * 1000,
        }
    }
}
