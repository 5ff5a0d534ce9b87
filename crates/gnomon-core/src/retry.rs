//! Retry backoff: exponential with a multiplier, a cap and symmetric jitter.

use std::time::Duration;

/// How long to wait before each retry of a run: `initial × multiplier^(n-1)`
/// after the `n`-th failed attempt, capped at `max`, then spread by
/// `jitter`. The default is 1s, doubling, up to 60s, ±20 %.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffPolicy {
    /// The delay after the first failed attempt (before jitter).
    pub initial: Duration,
    /// The longest delay, jitter included.
    pub max: Duration,
    /// The factor by which each delay grows over the one before (1.0 keeps
    /// it constant).
    pub multiplier: f64,
    /// Fraction in `[0, 1]`: the delay is spread uniformly over `base × (1 ± jitter)`.
    pub jitter: f64,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self { initial: Duration::from_secs(1), max: Duration::from_secs(60), multiplier: 2.0, jitter: 0.2 }
    }
}

impl BackoffPolicy {
    /// The delay before the attempt after `failed_attempt` (1-based).
    /// `sample` is a uniform random number in `[0, 1)`; passing it in keeps
    /// this function deterministic for tests. The result never exceeds `max`.
    pub fn delay(&self, failed_attempt: u32, sample: f64) -> Duration {
        let exponent = failed_attempt.saturating_sub(1).min(64) as i32;
        let base = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = base.min(self.max.as_secs_f64());
        let spread = 1.0 + self.jitter * (2.0 * sample.clamp(0.0, 1.0) - 1.0);
        let with_jitter = (capped * spread).clamp(0.0, self.max.as_secs_f64());
        Duration::try_from_secs_f64(with_jitter).unwrap_or(self.max)
    }

    /// [`delay`](Self::delay) with a thread-local random sample.
    pub fn delay_random(&self, failed_attempt: u32) -> Duration {
        self.delay(failed_attempt, rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn grows_and_caps() {
        let p = BackoffPolicy { initial: Duration::from_secs(1), max: Duration::from_secs(10), multiplier: 2.0, jitter: 0.0 };
        let delays: Vec<u64> = (1..=6).map(|a| p.delay(a, 0.5).as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 10, 10]);
    }

    proptest! {
        #[test]
        fn never_exceeds_max_and_stays_in_jitter_band(
            initial_ms in 1u64..10_000, extra_ms in 0u64..100_000, mult in 1.0f64..10.0,
            jitter in 0.0f64..=1.0, attempt in 1u32..200, sample in 0.0f64..1.0,
        ) {
            let p = BackoffPolicy { initial: Duration::from_millis(initial_ms), max: Duration::from_millis(initial_ms + extra_ms), multiplier: mult, jitter };
            let d = p.delay(attempt, sample).as_secs_f64();
            prop_assert!(d <= p.max.as_secs_f64() + 1e-9);
            let nominal = p.delay(attempt, 0.5).as_secs_f64();
            prop_assert!(d >= nominal * (1.0 - jitter) - 1e-6);
        }

        #[test]
        fn without_jitter_is_monotonic(initial_ms in 1u64..5_000, mult in 1.0f64..5.0, attempt in 1u32..100) {
            let p = BackoffPolicy { initial: Duration::from_millis(initial_ms), max: Duration::from_secs(3600), multiplier: mult, jitter: 0.0 };
            prop_assert!(p.delay(attempt + 1, 0.3) >= p.delay(attempt, 0.3));
        }
    }
}
