//! Choosing a worker for an attempt: `least_loaded` (running relative to
//! capacity), `round_robin` and `consistent_hash` (rendezvous hashing on the
//! job name, so only about 1/N of jobs move when a worker joins or leaves).
//!
//! The leader filters candidates first (connected, not draining, the job's
//! executor kind and handler, the job's label selector); this module only
//! ranks them. Pure and deterministic.

use crate::spec::RouteStrategy;

/// A worker the leader found eligible for an attempt, with what it holds.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// The worker's id (stable across its sessions); `consistent_hash`
    /// hashes it with the job name.
    pub id: &'a str,
    /// Attempts it holds (executing or queued).
    pub running: usize,
    /// Attempts it executes at once: load is `running / capacity`.
    pub capacity: usize,
    /// Attempts it may hold: `capacity`, plus its prefetch queue when the
    /// leader allows queueing on it now.
    pub limit: usize,
}

impl<'a> Candidate<'a> {
    /// A candidate that holds at most `capacity` attempts (no queue).
    pub fn new(id: &'a str, running: usize, capacity: usize) -> Self {
        Self { id, running, capacity, limit: capacity }
    }

    /// Whether it may take one more attempt (`running < limit`).
    pub fn has_room(&self) -> bool {
        self.running < self.limit
    }
}

/// FNV-1a: stable across builds and platforms, unlike `DefaultHasher`.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.as_bytes().iter().chain(std::iter::once(&0xffu8)) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    // Final avalanche (from SplitMix64) so similar ids spread evenly.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The index of the chosen candidate, or `None` when the run must wait
/// (nobody has room, or — for `consistent_hash` — its worker has none).
/// `candidates` must be sorted by id; `rr` is the round-robin cursor.
pub fn pick_worker(strategy: RouteStrategy, key: &str, candidates: &[Candidate<'_>], rr: &mut usize) -> Option<usize> {
    match strategy {
        RouteStrategy::LeastLoaded => {
            // The lowest load relative to capacity; ties rotate, so a burst
            // of short runs on idle workers is spread instead of piling onto
            // the first id.
            let load = |c: &Candidate<'_>| c.running as f64 / c.capacity.max(1) as f64;
            let best = candidates.iter().filter(|c| c.has_room()).map(load).min_by(|a, b| a.total_cmp(b))?;
            let tied: Vec<usize> = (0..candidates.len()).filter(|i| candidates[*i].has_room() && load(&candidates[*i]) == best).collect();
            let i = tied[*rr % tied.len()];
            *rr = rr.wrapping_add(1);
            Some(i)
        }
        RouteStrategy::RoundRobin => {
            let open: Vec<usize> = (0..candidates.len()).filter(|i| candidates[*i].has_room()).collect();
            if open.is_empty() {
                return None;
            }
            let i = open[*rr % open.len()];
            *rr = rr.wrapping_add(1);
            Some(i)
        }
        RouteStrategy::ConsistentHash => {
            let (i, c) = candidates.iter().enumerate().max_by_key(|(_, c)| fnv1a(&[key, c.id]))?;
            c.has_room().then_some(i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands<'a>(ids: &'a [String], running: &[usize]) -> Vec<Candidate<'a>> {
        ids.iter().zip(running).map(|(id, r)| Candidate::new(id, *r, 10)).collect()
    }

    #[test]
    fn least_loaded_prefers_relative_load() {
        let ids: Vec<String> = vec!["a".into(), "b".into()];
        let c = vec![Candidate::new(&ids[0], 5, 10), Candidate::new(&ids[1], 6, 20)];
        assert_eq!(pick_worker(RouteStrategy::LeastLoaded, "j", &c, &mut 0), Some(1));
        let full = cands(&ids, &[10, 10]);
        assert_eq!(pick_worker(RouteStrategy::LeastLoaded, "j", &full, &mut 0), None);
        let idle = cands(&ids, &[0, 0]);
        let mut rr = 0;
        let picks: Vec<usize> = (0..4).map(|_| pick_worker(RouteStrategy::LeastLoaded, "j", &idle, &mut rr).unwrap()).collect();
        assert_eq!(picks, vec![0, 1, 0, 1], "ties rotate");
    }

    #[test]
    fn a_queue_is_used_only_past_every_free_slot() {
        let ids: Vec<String> = vec!["a".into(), "b".into()];
        // a: full but may queue 10 more; b: one free slot, no queue.
        let c = vec![Candidate { limit: 20, ..Candidate::new(&ids[0], 10, 10) }, Candidate::new(&ids[1], 9, 10)];
        assert_eq!(pick_worker(RouteStrategy::LeastLoaded, "j", &c, &mut 0), Some(1), "a free slot beats a queue");
        let c = vec![Candidate { limit: 20, ..Candidate::new(&ids[0], 10, 10) }, Candidate::new(&ids[1], 10, 10)];
        assert_eq!(pick_worker(RouteStrategy::LeastLoaded, "j", &c, &mut 0), Some(0), "then the queue");
        let c = vec![Candidate { limit: 20, ..Candidate::new(&ids[0], 20, 10) }, Candidate::new(&ids[1], 10, 10)];
        assert_eq!(pick_worker(RouteStrategy::LeastLoaded, "j", &c, &mut 0), None, "the queue is bounded");
    }

    #[test]
    fn round_robin_cycles_over_workers_with_room() {
        let ids: Vec<String> = vec!["a".into(), "b".into(), "c".into()];
        let c = cands(&ids, &[0, 10, 0]);
        let mut rr = 0;
        let picks: Vec<usize> = (0..4).map(|_| pick_worker(RouteStrategy::RoundRobin, "j", &c, &mut rr).unwrap()).collect();
        assert_eq!(picks, vec![0, 2, 0, 2]);
    }

    #[test]
    fn consistent_hash_is_sticky_and_moves_about_one_nth() {
        let ids: Vec<String> = (0..4).map(|i| format!("worker-{i}")).collect();
        let four = cands(&ids, &[0, 0, 0, 0]);
        let five_ids: Vec<String> = (0..5).map(|i| format!("worker-{i}")).collect();
        let five = cands(&five_ids, &[0, 0, 0, 0, 0]);
        let jobs: Vec<String> = (0..2000).map(|i| format!("job-{i}")).collect();
        let mut moved = 0;
        let mut per_worker = [0usize; 4];
        for j in &jobs {
            let a = pick_worker(RouteStrategy::ConsistentHash, j, &four, &mut 0).unwrap();
            assert_eq!(pick_worker(RouteStrategy::ConsistentHash, j, &four, &mut 0), Some(a), "sticky");
            per_worker[a] += 1;
            let b = pick_worker(RouteStrategy::ConsistentHash, j, &five, &mut 0).unwrap();
            if four[a].id != five[b].id {
                moved += 1;
                assert_eq!(five[b].id, "worker-4", "a job only moves to the new worker");
            }
        }
        // Expect ~1/5 of jobs to move; allow generous slack.
        assert!((250..=550).contains(&moved), "moved {moved} of 2000");
        assert!(per_worker.iter().all(|n| (350..=650).contains(n)), "spread {per_worker:?}");
        // The chosen worker full: the run waits instead of going elsewhere.
        let j = &jobs[0];
        let a = pick_worker(RouteStrategy::ConsistentHash, j, &four, &mut 0).unwrap();
        let mut busy = four.clone();
        busy[a].running = 10;
        assert_eq!(pick_worker(RouteStrategy::ConsistentHash, j, &busy, &mut 0), None);
    }
}
