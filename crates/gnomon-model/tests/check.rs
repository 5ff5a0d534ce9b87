//! The model checked: the fixed protocol exhaustively, and each defect put
//! back found by the checker, with its trace printed.
//!
//! `GNOMON_MODEL_FAULTS` (default 1) and `GNOMON_MODEL_INSTANTS` (default
//! 1) raise the bound of the exhaustive check.

use std::collections::BTreeSet;
use std::time::Instant;

use gnomon_model::properties::*;
use gnomon_model::{trace, Config, StepRule};
use stateright::{Checker, HasDiscoveries, Model};

fn env(name: &str, default: u8) -> u8 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The bound of the exhaustive check.
fn bound() -> Config {
    let mut cfg = Config::fixed();
    cfg.faults = env("GNOMON_MODEL_FAULTS", cfg.faults);
    cfg.due = match env("GNOMON_MODEL_INSTANTS", 1) {
        1 => vec![0],
        _ => vec![0, 1],
    };
    cfg
}

#[test]
fn the_fixed_protocol_keeps_every_property_two_workers_two_terms_two_attempts_one_fault() {
    let cfg = bound();
    let described = format!("{cfg:?}");
    let started = Instant::now();
    let checker = cfg.model().checker().spawn_bfs().join();
    println!(
        "exhaustive: {} states ({} unique), depth {}, in {:.1?}; bound {described}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(checker.is_done(), "the check ran to the end");
    checker.assert_properties();
}

/// Checks `cfg` until the property has a counterexample; returns its trace.
fn counterexample(cfg: Config, property: &'static str) -> String {
    let started = Instant::now();
    let checker = cfg.model().checker().finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property]))).spawn_bfs().join();
    let path = checker.discovery(property).unwrap_or_else(|| panic!("the checker finds a counterexample to {property}"));
    let trace = trace::render(&path);
    println!(
        "counterexample to {property} after {} states in {:.1?}, {} steps:\n{trace}",
        checker.unique_state_count(),
        started.elapsed(),
        path.into_actions().len()
    );
    trace
}

#[test]
fn a_rebuild_that_forgets_when_attempts_began_ends_a_healthy_attempt_early() {
    let cfg = Config { rebuild_forgets_start: true, symmetry: false, ..Config::fixed() };
    let trace = counterexample(cfg, LIVE_WORKER_ATTEMPT_NEVER_ENDED_EARLY);
    assert!(trace.contains("Overrun"), "the leader's backstop ends it");
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
