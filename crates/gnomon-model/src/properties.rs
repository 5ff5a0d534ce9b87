//! The properties the checker judges, by name (see the crate docs for what
//! each one maps to in the real code).

use stateright::Property;

use crate::model::AttemptModel;
use crate::state::*;

/// Safety: a run has at most one live attempt. In the store, only its
/// current attempt is assigned or running (and only while the run is); on
/// the workers, at most one attempt of the run is one its worker would
/// keep running (up, fence not lapsed, within its timeout).
pub const AT_MOST_ONE_LIVE_ATTEMPT_PER_RUN: &str = "at_most_one_live_attempt_per_run";
/// Safety: no write lands in the store with a token below the current fence.
pub const NO_STALE_TOKEN_WRITE_LANDS: &str = "no_stale_token_write_lands";
/// Safety: the leader never ends `lost` or `timed_out`, before its timeout
/// counted from its start, an attempt whose worker was never paused,
/// killed or cut off and whose acknowledged heartbeats never lapsed.
pub const LIVE_WORKER_ATTEMPT_NEVER_ENDED_EARLY: &str = "live_worker_attempt_never_ended_early";
/// Safety: each run's step commits its effect at most once.
pub const STEP_COMMITS_AT_MOST_ONCE: &str = "step_commits_at_most_once";
/// Safety: each instant's run is created at most once, and a leader that
/// has led across a tick has fired every instant due before it.
pub const EVERY_DUE_INSTANT_GETS_EXACTLY_ONE_RUN: &str = "every_due_instant_gets_exactly_one_run";

/// Reachability: a run succeeds on an attempt assigned under an earlier
/// term, reclaimed by the new leader from its worker's `Hello`.
pub const A_RUN_SUCCEEDS_ON_AN_ATTEMPT_RECLAIMED_AFTER_FAILOVER: &str = "a_run_succeeds_on_an_attempt_reclaimed_after_failover";
/// Reachability: a step commits.
pub const A_STEP_COMMITS: &str = "a_step_commits";
/// Reachability: a run gets a second attempt.
pub const A_RETRY_HAPPENS: &str = "a_retry_happens";
/// Reachability: a run fails after its last attempt.
pub const A_RUN_FAILS_AFTER_ITS_LAST_ATTEMPT: &str = "a_run_fails_after_its_last_attempt";
/// Reachability: an attempt takes the step result another attempt recorded.
pub const AN_ATTEMPT_TAKES_ANOTHERS_STEP_RESULT: &str = "an_attempt_takes_anothers_step_result";
/// Reachability: a superseded attempt is refused its step.
pub const A_SUPERSEDED_STEP_IS_REFUSED: &str = "a_superseded_step_is_refused";
/// Reachability: a frozen holder's step transaction is aborted by the
/// database, and another attempt commits the step while it is frozen.
pub const A_FROZEN_TRANSACTION_IS_ABORTED_AND_ANOTHER_ATTEMPT_COMMITS: &str = "a_frozen_transaction_is_aborted_and_another_attempt_commits";
/// Reachability: the store refuses a deposed leader's write.
pub const A_STALE_LEADER_WRITE_IS_REFUSED: &str = "a_stale_leader_write_is_refused";
/// Reachability: the leader's backstop ends an overrun attempt.
pub const THE_BACKSTOP_ENDS_AN_OVERRUN: &str = "the_backstop_ends_an_overrun";
/// Reachability: a worker fences itself.
pub const A_WORKER_FENCES_ITSELF: &str = "a_worker_fences_itself";
/// Reachability: an attempt is ended lost.
pub const AN_ATTEMPT_IS_LOST: &str = "an_attempt_is_lost";

/// Every property, `always` ones first.
pub fn all() -> Vec<Property<AttemptModel>> {
    vec![
        Property::always(AT_MOST_ONE_LIVE_ATTEMPT_PER_RUN, at_most_one_live_attempt_per_run),
        Property::always(NO_STALE_TOKEN_WRITE_LANDS, |_: &AttemptModel, s: &State| !s.store.stale_landed),
        Property::always(LIVE_WORKER_ATTEMPT_NEVER_ENDED_EARLY, |_: &AttemptModel, s: &State| !s.store.ended_early),
        Property::always(STEP_COMMITS_AT_MOST_ONCE, |_: &AttemptModel, s: &State| s.db.commits.iter().all(|c| *c <= 1)),
        Property::always(EVERY_DUE_INSTANT_GETS_EXACTLY_ONE_RUN, every_due_instant_gets_exactly_one_run),
        Property::sometimes(A_RUN_SUCCEEDS_ON_AN_ATTEMPT_RECLAIMED_AFTER_FAILOVER, |_: &AttemptModel, s: &State| {
            s.has_seen(seen::SUCCEEDED_AFTER_RECLAIM)
        }),
        Property::sometimes(A_STEP_COMMITS, |_: &AttemptModel, s: &State| s.db.commits.iter().any(|c| *c >= 1)),
        Property::sometimes(A_RETRY_HAPPENS, |_: &AttemptModel, s: &State| s.store.runs.iter().flatten().any(|r| r.attempt >= 2)),
        Property::sometimes(A_RUN_FAILS_AFTER_ITS_LAST_ATTEMPT, |_: &AttemptModel, s: &State| {
            s.store.runs.iter().flatten().any(|r| r.state == RunState::Failed && r.attempt == MAX_ATTEMPTS)
        }),
        Property::sometimes(AN_ATTEMPT_TAKES_ANOTHERS_STEP_RESULT, |_: &AttemptModel, s: &State| {
            slots(s).any(|sl| sl.step == Step::Done && s.db.record[usize::from(sl.run)].is_some_and(|by| by != sl.attempt))
        }),
        Property::sometimes(A_SUPERSEDED_STEP_IS_REFUSED, |_: &AttemptModel, s: &State| slots(s).any(|sl| sl.step == Step::Refused)),
        Property::sometimes(A_FROZEN_TRANSACTION_IS_ABORTED_AND_ANOTHER_ATTEMPT_COMMITS, |_: &AttemptModel, s: &State| {
            slots(s).any(|sl| sl.step == Step::Aborted && s.db.record[usize::from(sl.run)].is_some_and(|by| by != sl.attempt))
        }),
        Property::sometimes(A_STALE_LEADER_WRITE_IS_REFUSED, |_: &AttemptModel, s: &State| s.has_seen(seen::STALE_REFUSED)),
        Property::sometimes(THE_BACKSTOP_ENDS_AN_OVERRUN, |_: &AttemptModel, s: &State| s.has_seen(seen::OVERRUN)),
        Property::sometimes(A_WORKER_FENCES_ITSELF, |_: &AttemptModel, s: &State| {
            slots(s).any(|sl| sl.phase == Phase::Done(Outcome::Lost))
        }),
        Property::sometimes(AN_ATTEMPT_IS_LOST, |_: &AttemptModel, s: &State| {
            s.store.runs.iter().flatten().any(|r| r.attempts.iter().flatten().any(|a| a.state == AttemptState::Lost))
        }),
    ]
}

/// The attempts the workers hold.
fn slots(s: &State) -> impl Iterator<Item = &Slot> {
    s.workers.iter().filter_map(|w| w.slot.as_ref())
}

fn at_most_one_live_attempt_per_run(m: &AttemptModel, s: &State) -> bool {
    (0..m.cfg.due.len()).all(|r| {
        let store_ok = s.store.runs[r].is_none_or(|run| {
            let live: Vec<u8> = run.attempts.iter().flatten().zip(1u8..).filter(|(a, _)| a.state.is_live()).map(|(_, n)| n).collect();
            match live.as_slice() {
                [] => !run.state.is_live(),
                [n] => *n == run.attempt && run.state.is_live(),
                _ => false,
            }
        });
        let on_workers = (0..WORKERS).filter(|w| m.live_on_worker(s, *w, r)).count();
        store_ok && on_workers <= 1
    })
}

fn every_due_instant_gets_exactly_one_run(m: &AttemptModel, s: &State) -> bool {
    let once = s.store.created.iter().all(|c| *c <= 1);
    // A leader that has led across a tick has fired what was due before it.
    let led_across_a_tick = s.leader.is_some_and(|l| l.age >= 1);
    let fired = !led_across_a_tick || m.cfg.due.iter().enumerate().all(|(r, due)| *due >= s.clock || s.store.runs[r].is_some());
    once && fired
}
