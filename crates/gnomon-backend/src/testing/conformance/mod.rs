//! Conformance suites shared by every backend, in the manner of openraft's
//! `Suite::test_all(builder)`. A backend's tests call [`store_suite`] with a
//! builder that opens a *new handle to the same database* each time (so
//! concurrent handles behave like separate servers), and [`elector_suite`]
//! with an elector over a store.
//!
//! The suites panic with a description on the first violation.

use std::future::Future;
use std::sync::Arc;

use crate::*;

mod backfills;
mod election;
mod firing;
mod fixtures;
mod graph;
mod jobs;
mod notifications;
mod runs;
mod workers;

pub use election::{contested_elector_suite, elector_suite, ElectorFixture};
pub use firing::a_turn_of_the_largest_runs_is_written;
use firing::*;
pub use fixtures::job_spec;
use jobs::*;
use notifications::*;
use runs::*;

/// Runs every store test. `open` must return a new handle to one shared database.
pub async fn store_suite<F, Fut>(open: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    let a = open().await;
    let b = open().await;
    jobs_and_preconditions(a.as_ref()).await;
    a_resume_settles_the_timeline_when_nothing_is_left_to_fire(a.as_ref()).await;
    job_change_feed(a.as_ref(), b.as_ref()).await;
    graph::edges_that_do_not_fit_and_deletes_of_upstreams_are_refused(a.as_ref()).await;
    graph::racing_writes_store_no_cycle(a.as_ref(), b.as_ref()).await;
    graph::a_delete_racing_a_write_that_names_the_job(a.as_ref(), b.as_ref()).await;
    graph::dependents_follow_every_job_write(a.as_ref(), b.as_ref()).await;
    fire_uniqueness_under_concurrency(a.clone(), b.clone()).await;
    two_servers_race_fire_in_a_tight_loop(a.clone(), b.clone()).await;
    fire_advances_last_scheduled_at(a.as_ref()).await;
    job_heads_and_reads_by_uid(a.as_ref(), b.as_ref()).await;
    manual_and_scheduled_runs_share_an_instant(a.as_ref()).await;
    a_keyed_manual_run_is_created_once(a.as_ref()).await;
    a_runs_params_and_payload_are_kept_with_it(a.as_ref()).await;
    a_dependency_run_waits_and_is_created_once(a.as_ref()).await;
    a_turn_of_the_largest_runs_is_written(a.as_ref(), 24).await;
    stale_token_writes_are_rejected(a.as_ref(), b.as_ref()).await;
    cas_transitions_and_terminal_finality(a.as_ref()).await;
    a_turn_is_one_write(a.as_ref(), b.as_ref()).await;
    a_large_turn_write_mixes_new_existing_and_folded_runs(a.as_ref()).await;
    pagination_is_stable_under_inserts(a.as_ref()).await;
    cancel_requests(a.as_ref()).await;
    leader_time_only_moves_forward(a.as_ref(), b.as_ref()).await;
    notifications_ride_with_their_transition(a.as_ref(), b.as_ref()).await;
    retention_deletes_only_old_terminal_runs(a.as_ref()).await;
    kept_keyed_runs_are_the_ended_keyed_runs_since_the_cut(a.as_ref()).await;
    backfills::backfills_advance_by_fenced_cas_and_stop_when_cancelled(a.as_ref(), b.as_ref()).await;
    backfills::a_turn_carries_backfill_progress_and_new_backfills(a.as_ref(), b.as_ref()).await;
    workers::the_first_credential_to_bind_a_worker_id_keeps_it(a.as_ref(), b.as_ref()).await;
    workers::racing_binds_leave_one_owner(a.clone(), b.clone()).await;
}
