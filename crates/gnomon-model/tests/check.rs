//! The model checked: the fixed protocol exhaustively, two instants to a
//! depth, and each defect put back found by the checker, with its trace
//! printed (`cargo test -p gnomon-model -- --nocapture` shows them).
//!
//! Bigger bounds: `GNOMON_MODEL_FAULTS` (default 1) and
//! `GNOMON_MODEL_TIMEOUT` (default 3 ticks) for the exhaustive check,
//! `GNOMON_MODEL_DEPTH` (default 12 steps) for the two instants.

use std::collections::BTreeSet;
use std::time::Instant;

use gnomon_model::properties::*;
use gnomon_model::{trace, Config, StepRule};
use stateright::{Checker, HasDiscoveries, Model};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Every `always` property holds and every `sometimes` one is reached, in
/// every state, or in every state within `steps` actions of the start.
fn check(name: &str, cfg: Config, steps: Option<usize>) {
    let described = format!("{cfg:?}");
    let started = Instant::now();
    let mut builder = cfg.model().checker();
    if let Some(steps) = steps {
        // One thread: breadth first in order, so every state within the
        // steps is reached by a shortest path and judged (stateright counts
        // the initial state as depth 1 and judges states above the target
        // no more).
        builder = builder.target_max_depth(steps + 2);
    } else {
        builder = builder.threads(2);
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "{name}: {} states ({} unique), depth {}, in {:.1?}; {described}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(checker.is_done(), "the check ran to the end");
    checker.assert_properties();
}

#[test]
fn exhaustive_one_instant_two_workers_two_terms_two_attempts_one_fault_keeps_every_property() {
    let base = Config::fixed();
    let cfg = Config { faults: env("GNOMON_MODEL_FAULTS", base.faults), timeout: env("GNOMON_MODEL_TIMEOUT", base.timeout), ..base };
    check("exhaustive", cfg, None);
}

#[test]
fn two_instants_every_behaviour_of_up_to_12_steps_keeps_every_property() {
    let cfg = Config { due: vec![0, 1], ..Config::fixed() };
    check("two instants", cfg, Some(env("GNOMON_MODEL_DEPTH", 12)));
}

/// Checks `cfg` for a counterexample to the property, breadth first to
/// one more step at a time, so the one found is among the shortest;
/// prints and returns its trace.
fn counterexample(cfg: Config, property: &'static str) -> String {
    let started = Instant::now();
    let mut visited = 0;
    for steps in 1..=40 {
        let checker = cfg
            .clone()
            .model()
            .checker()
            .target_max_depth(steps + 2)
            .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
            .spawn_bfs()
            .join();
        visited += checker.unique_state_count();
        let Some(path) = checker.discovery(property) else { continue };
        let trace = trace::render(&path);
        println!(
            "counterexample to {property} in {} steps, found after {visited} states in {:.1?}:\n{trace}",
            path.into_actions().len(),
            started.elapsed()
        );
        return trace;
    }
    panic!("the checker finds no counterexample to {property} within 40 steps");
}

#[test]
fn a_rebuild_that_forgets_when_attempts_began_ends_a_healthy_attempt_early() {
    let cfg = Config { rebuild_forgets_start: true, symmetry: false, ..Config::fixed() };
    let trace = counterexample(cfg, LIVE_WORKER_ATTEMPT_NEVER_ENDED_EARLY);
    assert!(trace.contains("Elect") && trace.contains("Hello") && trace.contains("Overrun"), "reclaimed, then ended by the backstop");
}

#[test]
fn the_old_guard_rule_commits_a_step_twice() {
    let cfg = Config { step_rule: StepRule::LaterAttemptOnly, symmetry: false, ..Config::fixed() };
    let trace = counterexample(cfg, STEP_COMMITS_AT_MOST_ONCE);
    assert!(trace.contains("2 commit(s)"));
}

#[test]
fn a_store_that_does_not_check_tokens_lets_a_deposed_leaders_write_land() {
    let cfg = Config { store_checks_tokens: false, symmetry: false, ..Config::fixed() };
    let trace = counterexample(cfg, NO_STALE_TOKEN_WRITE_LANDS);
    assert!(trace.contains("Stale"));
}

#[test]
fn a_worker_that_fences_itself_only_after_its_lease_ran_out_runs_beside_the_retry() {
    // The fence lapsing two ticks after the leader ends the lease, instead
    // of before: the worker keeps running the attempt the leader retried.
    let cfg = Config { self_fence_after: 4, timeout: 5, symmetry: false, ..Config::fixed() };
    let trace = counterexample(cfg, AT_MOST_ONE_LIVE_ATTEMPT_PER_RUN);
    assert!(trace.contains("ExpireLease"));
}
