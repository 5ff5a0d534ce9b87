//! Deterministic jitter: each instant of a jittered schedule fires a
//! little after it, by an amount derived from the job and the instant
//! alone, so that every leader (and the preview) computes the same fire
//! time, and jobs that share an instant (`0 * * * *`) spread over the
//! jitter instead of landing together.

use crate::Millis;

/// A schedule's jitter: at most `max_ms`, seeded by the job's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Jitter {
    /// The longest delay of a fire, in milliseconds.
    pub max_ms: Millis,
    /// Derived from the job's namespace and name ([`Jitter::seed_of`]).
    pub seed: u64,
}

impl Jitter {
    /// The seed of job `name` in `namespace`: FNV-1a over `namespace/name`,
    /// fixed here (not a std hasher, whose output may change between
    /// releases), so the delays survive upgrades.
    pub fn seed_of(namespace: &str, name: &str) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in namespace.bytes().chain(std::iter::once(b'/')).chain(name.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    /// How long after the instant `at` its fire comes: uniform over
    /// `[0, max_ms]` by a hash of (seed, `at`), and always less than the
    /// time to the schedule's `next` instant, so the instants of one
    /// schedule fire in their order.
    pub fn offset_ms(&self, at: Millis, next: Option<Millis>) -> Millis {
        let cap = match next {
            Some(next) => self.max_ms.min(next.saturating_sub(at).saturating_sub(1)),
            None => self.max_ms,
        };
        if cap <= 0 {
            return 0;
        }
        let draw = mix(self.seed ^ (at as u64));
        (draw % (cap as u64 + 1)) as Millis
    }
}

/// splitmix64's finaliser: a well-spread 64-bit hash of `x`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Rule, Schedule};
    use proptest::prelude::*;

    const PINNED: Millis = 18_079;

    #[test]
    fn the_same_job_and_instant_give_the_same_delay() {
        let j = Jitter { max_ms: 30_000, seed: Jitter::seed_of("default", "report") };
        assert_eq!(j.offset_ms(3_600_000, None), j.offset_ms(3_600_000, None));
        // Fixed values: a change of the hash would move every fire of
        // every jittered job at an upgrade.
        assert_eq!(j.offset_ms(3_600_000, None), PINNED);
        let other = Jitter { max_ms: 30_000, seed: Jitter::seed_of("ops", "report") };
        let delays: Vec<Millis> = (0..50).map(|i| j.offset_ms(i * 3_600_000, None)).collect();
        let others: Vec<Millis> = (0..50).map(|i| other.offset_ms(i * 3_600_000, None)).collect();
        assert_ne!(delays, others);
    }

    #[test]
    fn many_jobs_at_one_instant_spread_over_the_jitter() {
        let at = 1_800_000_000_000;
        let mut buckets = [0usize; 10];
        for i in 0..10_000 {
            let j = Jitter { max_ms: 10_000, seed: Jitter::seed_of("default", &format!("job-{i}")) };
            let d = j.offset_ms(at, Some(at + 3_600_000));
            assert!((0..=10_000).contains(&d));
            buckets[(d / 1_001) as usize] += 1;
        }
        // Each tenth of the range holds about a tenth of the jobs.
        assert!(buckets.iter().all(|n| (800..=1_200).contains(n)), "{buckets:?}");
    }

    proptest! {
        #[test]
        fn fires_stay_in_instant_order(every in 100i64..10_000, max in 0i64..100_000, seed: u64, k in 0i64..1_000_000) {
            let s = Schedule::from(Rule::Every { every_ms: every }).jittered(Some(Jitter { max_ms: max, seed }));
            let t = k * every;
            let next = s.next_after(t).unwrap();
            let fire = s.fire_at(t);
            prop_assert!(fire >= t && fire - t <= max);
            prop_assert!(fire < next && fire < s.fire_at(next));
        }
    }
}
