//! The leader's flags, shared by `dev` and `server`.

use anyhow::{anyhow, bail};
use clap::Args;
use gnomon_server::leader::LeaderConfig;
use gnomon_server::leader_time::SkewLimits;
use gnomon_server::NodeConfig;

#[derive(Args, Debug)]
pub struct LeaderArgs {
    /// How late a scheduled time may be reached and still count as on time.
    #[arg(long, default_value = "1s", env = "GNOMON_MISFIRE_GRACE", value_parser = crate::leader_args::duration_arg)]
    misfire_grace: String,
    /// Worker session lease: a worker silent for this long loses its
    /// attempts (default 10s; 15s on the etcd store).
    #[arg(long, env = "GNOMON_LEASE_TTL", value_parser = crate::leader_args::duration_arg)]
    lease_ttl: Option<String>,
    /// Backpressure: pending runs at which dispatch is paced (70 %) and new
    /// fires are deferred (90 %).
    #[arg(long, default_value_t = 10_000, env = "GNOMON_MAX_PENDING")]
    max_pending: usize,
    /// A quota, `[NAMESPACE:]NAME=VALUE` (repeat it, or separate with
    /// commas): `request_bytes`, `open_runs`, `open_bytes`, `backfills` or
    /// `downstream_runs`; without a namespace, every namespace's default.
    #[arg(long = "quota", env = "GNOMON_QUOTA", value_delimiter = ',', value_parser = quota_arg)]
    quotas: Vec<String>,
    /// Retention (every store): terminal runs kept per job, with the
    /// newest first…
    #[arg(long, default_value_t = 1000, env = "GNOMON_RETAIN_RUNS")]
    retain_runs: usize,
    /// …and for how long after they fired.
    #[arg(long, default_value = "7d", env = "GNOMON_RETAIN_FOR", value_parser = crate::leader_args::duration_arg)]
    retain_for: String,
    /// How far this server's clock may be from the leader time before it
    /// says so (log, `gnomon_clock_skew_seconds`).
    #[arg(long, default_value = "1s", env = "GNOMON_MAX_CLOCK_SKEW", value_parser = crate::leader_args::duration_arg)]
    max_clock_skew: String,
    /// How far it may be before this server gives up leadership (and does
    /// not take it) rather than fire at a wrong time.
    #[arg(long, default_value = "5s", env = "GNOMON_CLOCK_SKEW_STEP_DOWN", value_parser = crate::leader_args::duration_arg)]
    clock_skew_step_down: String,
}

impl LeaderArgs {
    pub fn node_config(&self, node_id: String, advertise: String, default_lease: &str) -> anyhow::Result<NodeConfig> {
        if self.max_pending == 0 {
            bail!("--max-pending must be at least 1");
        }
        let grace = gnomon_core::duration::parse_duration(&self.misfire_grace).map_err(|e| anyhow!("--misfire-grace: {e}"))?;
        let ttl = gnomon_core::duration::parse_duration(self.lease_ttl.as_deref().unwrap_or(default_lease))
            .map_err(|e| anyhow!("--lease-ttl: {e}"))?;
        let retain = gnomon_core::duration::parse_duration(&self.retain_for).map_err(|e| anyhow!("--retain-for: {e}"))?;
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        if !(1_000..=600_000).contains(&ttl_ms) {
            bail!("--lease-ttl must be between 1s and 10m");
        }
        let warn = gnomon_core::duration::parse_duration(&self.max_clock_skew).map_err(|e| anyhow!("--max-clock-skew: {e}"))?;
        let step_down =
            gnomon_core::duration::parse_duration(&self.clock_skew_step_down).map_err(|e| anyhow!("--clock-skew-step-down: {e}"))?;
        if warn.is_zero() || step_down < warn {
            bail!("--max-clock-skew must be above zero and --clock-skew-step-down at least as large");
        }
        Ok(NodeConfig {
            node_id,
            advertise,
            leader: LeaderConfig {
                misfire_grace_ms: i64::try_from(grace.as_millis()).unwrap_or(1000),
                lease_ttl_ms: ttl_ms,
                heartbeat_ms: (ttl_ms / 5).max(200),
                backpressure: gnomon_core::backpressure::BackpressureConfig { max_pending: self.max_pending, ..Default::default() },
                quotas: gnomon_core::quota::Quotas::parse(&self.quotas).map_err(|e| anyhow!("--quota: {e}"))?,
                retain_runs: self.retain_runs,
                retain_ms: i64::try_from(retain.as_millis()).unwrap_or(i64::MAX),
            },
            clock: SkewLimits { warn, step_down },
        })
    }
}

/// Checks a duration flag (`500ms`, `5s`, `10m`, `7d`) when the command line
/// is parsed, so a bad one is refused with the flag's name before anything
/// starts.
pub(crate) fn duration_arg(text: &str) -> Result<String, String> {
    gnomon_core::duration::parse_duration(text).map(|_| text.to_string())
}

/// Checks one `--quota` value when the command line is parsed.
pub(crate) fn quota_arg(text: &str) -> Result<String, String> {
    gnomon_core::quota::Quotas::parse(&[text]).map(|_| text.to_string())
}
