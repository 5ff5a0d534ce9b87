//! Single behaviours played step by step: what an action does, or that it
//! is not enabled.

use super::*;

fn model() -> AttemptModel {
    Config { symmetry: false, ..Config::fixed() }.model()
}

/// Plays the actions from the initial state; each must change it.
fn play(m: &AttemptModel, actions: &[Action]) -> State {
    let mut s = m.init_states()[0];
    for a in actions {
        s = m.next_state(&s, *a).unwrap_or_else(|| panic!("{a:?} is enabled in {s:?}"));
    }
    s
}

#[test]
fn a_second_fire_of_an_instant_writes_nothing() {
    let m = model();
    let s = play(&m, &[Action::Fire(0)]);
    assert_eq!(s.store.created[0], 1);
    assert_eq!(m.next_state(&s, Action::Fire(0)), None, "refused by the instant's key");
}

#[test]
fn a_stale_report_changes_nothing_and_is_acked() {
    let m = model();
    // w0 succeeds while cut off; its lease runs out first, so the
    // attempt is lost; the spooled report arrives after its Hello.
    let s = play(
        &m,
        &[
            Action::Fire(0),
            Action::Assign { run: 0, worker: 0 },
            Action::Disconnect(0),
            Action::Commit(0),
            Action::Finish(0, Outcome::Succeeded),
            Action::Tick,
            Action::Tick,
            Action::Tick,
            Action::ExpireLease(0),
        ],
    );
    let run = s.store.runs[0].expect("the run");
    assert_eq!((run.state, run.current().expect("a1").state), (RunState::Retrying, AttemptState::Lost));
    let s = m.next_state(&s, Action::Hello(0)).expect("Hello");
    let after = s.store.runs[0].expect("the run");
    assert_eq!(after, run, "the stale report changed nothing");
    assert_eq!(s.workers[0].slot, None, "and was acked");
}

#[test]
fn a_frozen_workers_assignment_waits_and_is_dropped_once_its_fence_lapsed() {
    let m = model();
    let s = play(&m, &[Action::Fire(0), Action::Pause(0), Action::Assign { run: 0, worker: 0 }, Action::Tick, Action::Tick]);
    assert!(s.workers[0].inbox.is_some(), "the assignment waits");
    let s =
        play(&m, &[Action::Fire(0), Action::Pause(0), Action::Assign { run: 0, worker: 0 }, Action::Tick, Action::Tick, Action::Resume(0)]);
    let s = m.next_state(&s, Action::Receive(0)).expect("taken");
    assert_eq!((s.workers[0].inbox, s.workers[0].slot), (None, None), "dropped, not started");
}

#[test]
fn the_database_ends_a_frozen_holders_transaction_and_the_retry_commits() {
    let m = model();
    let s = play(
        &m,
        &[
            Action::Fire(0),
            Action::Assign { run: 0, worker: 0 },
            Action::PauseInTx(0),
            Action::Tick,
            Action::Tick,
            Action::Tick,
            Action::ExpireLease(0),
            Action::Retry(0),
            Action::Assign { run: 0, worker: 1 },
        ],
    );
    assert_eq!(s.db.lock[0], Some(0), "the frozen holder keeps the row");
    assert_eq!(m.next_state(&s, Action::Commit(1)), None, "the retry waits for the row");
    let s = play(
        &m,
        &[
            Action::Fire(0),
            Action::Assign { run: 0, worker: 0 },
            Action::PauseInTx(0),
            Action::Tick,
            Action::Tick,
            Action::Tick,
            Action::ExpireLease(0),
            Action::Retry(0),
            Action::Assign { run: 0, worker: 1 },
            Action::TxTimeout(0),
            Action::Commit(1),
            Action::Resume(0),
        ],
    );
    assert_eq!(s.db.record[0], Some(2));
    // The resumed attempt 1 finds its transaction gone; trying again, it
    // takes attempt 2's result and writes nothing.
    let s = m.next_state(&s, Action::Commit(0)).expect("tries again");
    assert_eq!((s.db.commits[0], s.workers[0].slot.map(|sl| sl.step)), (1, Some(Step::Done)));
}
