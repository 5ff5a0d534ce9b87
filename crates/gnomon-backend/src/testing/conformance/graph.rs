//! The dependency checks a store makes in a job write's own transaction:
//! each refusal, and writers racing through two handles, which must never
//! leave a cycle or an edge to a job that is gone.

use gnomon_core::deps::{check_graph, AfterEdge, Graph, On};
use gnomon_core::spec::JobSpec;

use super::fixtures::*;
use crate::*;

/// Pairs of racing writes per kind of race.
const PAIRS: usize = 20;

/// A suite job in `ns` running after `after`.
fn job_in(ns: &str, name: &str, after: &[&str]) -> JobSpec {
    let mut spec = job_spec(name);
    spec.namespace = Some(ns.to_string());
    spec.after = after.iter().map(|u| AfterEdge { job: u.to_string(), on: On::Succeeded }).collect();
    spec
}

/// A write as a client makes it: again while the store says it may help
/// (a lock wait, a deadlock, a conflict). A retried delete that finds the
/// job gone had deleted it.
async fn put(s: &dyn Store, spec: &JobSpec, precondition: Precondition) -> Result<JobRecord, StoreError> {
    for _ in 0..50 {
        match s.put_job(spec, precondition, 1).await {
            Err(e) if e.is_retryable() => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            other => return other,
        }
    }
    panic!("put {} never got an answer", spec.name)
}

async fn delete(s: &dyn Store, ns: &str, name: &str) -> Result<(), StoreError> {
    let mut retried = false;
    for _ in 0..50 {
        match s.delete_job(ns, name, Precondition::None).await {
            Err(e) if e.is_retryable() => retried = true,
            Err(StoreError::NotFound(_)) if retried => return Ok(()),
            other => return other,
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("delete {ns}/{name} never got an answer")
}

/// The namespace's stored graph, after checking that every upstream
/// exists and no cycle goes through any job (so there is none).
async fn sound_graph(s: &dyn Store, ns: &str) -> Graph {
    let jobs = s.list_jobs(Some(ns)).await.expect("list");
    let graph: Graph = jobs.iter().map(|j| (j.name.clone(), j.spec.after.iter().map(|e| e.job.clone()).collect())).collect();
    for j in &jobs {
        if let Err(e) = check_graph(&j.name, &j.spec.after, &graph) {
            panic!("namespace {ns} stores an unsound graph at {}: {e} ({graph:?})", j.name);
        }
    }
    graph
}

fn graph_code(r: &Result<JobRecord, StoreError>) -> Option<&'static str> {
    match r {
        Err(StoreError::Graph(e)) => Some(e.code),
        _ => None,
    }
}

pub(super) async fn edges_that_do_not_fit_and_deletes_of_upstreams_are_refused(s: &dyn Store) {
    let ns = unique("graph");
    for spec in [job_in(&ns, "load", &[]), job_in(&ns, "transform", &["load"]), job_in(&ns, "report", &["transform"])] {
        s.put_job(&spec, Precondition::DoesNotExist, 1).await.expect("create");
    }
    let seq = s.job_changes(0).await.expect("changes").seq;
    let refused = |r: Result<JobRecord, StoreError>| match r {
        Err(StoreError::Graph(e)) => e,
        other => panic!("refusal expected, got {other:?}"),
    };
    // An upstream the namespace does not have, by position; a job of the
    // same name in another namespace does not count.
    let e = refused(s.put_job(&job_in(&ns, "x", &["load", "nope"]), Precondition::None, 2).await);
    assert_eq!((e.code, e.field.as_str()), ("unknown_upstream", "after[1].job"), "{e}");
    assert!(e.message.contains("\"nope\""), "{e}");
    let e = refused(s.put_job(&job_in(&unique("other"), "x", &["load"]), Precondition::None, 2).await);
    assert_eq!((e.code, e.field.as_str()), ("unknown_upstream", "after[0].job"), "{e}");
    // A cycle through an update, with its path; the job keeps its edges.
    let e = refused(s.put_job(&job_in(&ns, "load", &["report"]), Precondition::MatchesVersion(1), 2).await);
    assert_eq!((e.code, e.field.as_str()), ("dependency_cycle", "after"), "{e}");
    assert!(e.message.ends_with("load → transform → report → load"), "{e}");
    let load = s.get_job(&ns, "load").await.expect("get").expect("load");
    assert!(load.version == 1 && load.spec.after.is_empty(), "a refused update changes nothing: {load:?}");
    // A job others run after stays, and the refusal names them.
    match s.delete_job(&ns, "transform", Precondition::None).await {
        Err(StoreError::HasDependents { namespace, name, dependents }) => {
            assert_eq!((namespace.as_str(), name.as_str(), dependents), (ns.as_str(), "transform", vec!["report".to_string()]));
        }
        other => panic!("has_dependents expected, got {other:?}"),
    }
    assert!(s.get_job(&ns, "transform").await.expect("get").is_some(), "a refused delete deletes nothing");
    let idle = s.job_changes(seq).await.expect("changes");
    assert!(idle.upserted.is_empty() && idle.deleted.is_empty(), "refused writes leave no trace in the feed: {idle:?}");
    // An edit that keeps the edges passes; once nothing runs after a job,
    // it goes.
    s.put_job(&job_in(&ns, "transform", &["load"]), Precondition::MatchesVersion(1), 3).await.expect("same edges");
    s.put_job(&job_in(&ns, "report", &[]), Precondition::None, 3).await.expect("edges dropped");
    s.delete_job(&ns, "transform", Precondition::None).await.expect("nothing runs after it now");
    s.delete_job(&ns, "load", Precondition::None).await.expect("nor after this one");
    sound_graph(s, &ns).await;
}

/// Writes that would close a cycle between two jobs, from two handles at
/// once: over existing jobs (`x` after `y` against `y` after `x`: exactly
/// one is refused, as a cycle) and with one of them created by the race
/// (`y` created after `x` against `x` after `y`: `x`'s is refused, as a
/// cycle or as naming a job not yet there).
pub(super) async fn racing_writes_store_no_cycle(a: &dyn Store, b: &dyn Store) {
    for i in 0..PAIRS {
        let ns = unique("race");
        put(a, &job_in(&ns, "x", &[]), Precondition::DoesNotExist).await.expect("create x");
        put(a, &job_in(&ns, "y", &[]), Precondition::DoesNotExist).await.expect("create y");
        let (x_after_y, y_after_x) = (job_in(&ns, "x", &["y"]), job_in(&ns, "y", &["x"]));
        let (xy, yx) = tokio::join!(put(a, &x_after_y, Precondition::None), put(b, &y_after_x, Precondition::None));
        let codes = (graph_code(&xy), graph_code(&yx));
        match (&xy, &yx) {
            (Ok(_), Err(_)) | (Err(_), Ok(_)) if matches!(codes, (Some("dependency_cycle"), None) | (None, Some("dependency_cycle"))) => {}
            _ => panic!("pair {i}: exactly one write is refused as a cycle, got {xy:?} and {yx:?}"),
        }
        assert_eq!(sound_graph(a, &ns).await.values().map(Vec::len).sum::<usize>(), 1, "pair {i}: one edge is stored");

        let ns = unique("race");
        put(a, &job_in(&ns, "x", &[]), Precondition::DoesNotExist).await.expect("create x");
        let (y_after_x, x_after_y) = (job_in(&ns, "y", &["x"]), job_in(&ns, "x", &["y"]));
        let (created, xy) = tokio::join!(put(a, &y_after_x, Precondition::DoesNotExist), put(b, &x_after_y, Precondition::None));
        assert!(created.is_ok(), "pair {i}: y is created: {created:?}");
        assert!(matches!(graph_code(&xy), Some("dependency_cycle" | "unknown_upstream")), "pair {i}: x after y is refused: {xy:?}");
        sound_graph(a, &ns).await;
    }
}

/// A delete of `y` against a write of `x` after `y` (`x` created by it,
/// or an existing one), from two handles at once: exactly one is refused,
/// and afterwards either `y` exists or no job names it.
pub(super) async fn a_delete_racing_a_write_that_names_the_job(a: &dyn Store, b: &dyn Store) {
    for i in 0..PAIRS {
        let ns = unique("race");
        put(a, &job_in(&ns, "y", &[]), Precondition::DoesNotExist).await.expect("create y");
        let existing = i % 2 == 0;
        if existing {
            put(a, &job_in(&ns, "x", &[]), Precondition::DoesNotExist).await.expect("create x");
        }
        let x_after_y = job_in(&ns, "x", &["y"]);
        let (deleted, written) = tokio::join!(delete(a, &ns, "y"), put(b, &x_after_y, Precondition::None));
        match (&deleted, &written) {
            (Ok(()), Err(StoreError::Graph(e))) if e.code == "unknown_upstream" => {}
            (Err(StoreError::HasDependents { dependents, .. }), Ok(_)) if dependents == &["x".to_string()] => {}
            _ => panic!("pair {i} (x existed: {existing}): exactly one is refused, got {deleted:?} and {written:?}"),
        }
        let graph = sound_graph(a, &ns).await;
        assert!(graph.contains_key("y") || graph.values().all(|ups| ups.is_empty()), "pair {i}: {graph:?}");
    }
}

/// `dependents` answers the jobs whose edges name a job, as every job write
/// and delete leaves them, read from another handle.
pub(super) async fn dependents_follow_every_job_write(a: &dyn Store, b: &dyn Store) {
    let ns = unique("deps");
    let names = |jobs: Vec<JobRecord>| jobs.into_iter().map(|j| j.name).collect::<Vec<_>>();
    a.put_job(&job_in(&ns, "extract", &[]), Precondition::DoesNotExist, 1).await.expect("extract");
    a.put_job(&job_in(&ns, "load", &["extract"]), Precondition::DoesNotExist, 1).await.expect("load");
    a.put_job(&job_in(&ns, "audit", &["extract", "load"]), Precondition::DoesNotExist, 1).await.expect("audit");
    assert_eq!(names(b.dependents(&ns, "extract").await.expect("read")), ["audit", "load"]);
    assert_eq!(names(b.dependents(&ns, "load").await.expect("read")), ["audit"]);
    assert!(b.dependents(&ns, "audit").await.expect("read").is_empty());
    // Another namespace's job of the same name is not one of them.
    let other = unique("deps");
    a.put_job(&job_in(&other, "extract", &[]), Precondition::DoesNotExist, 1).await.expect("other extract");
    assert!(b.dependents(&other, "extract").await.expect("read").is_empty());
    // An edge dropped, a job deleted: gone from the answer.
    a.put_job(&job_in(&ns, "audit", &["load"]), Precondition::None, 2).await.expect("audit drops extract");
    assert_eq!(names(b.dependents(&ns, "extract").await.expect("read")), ["load"]);
    a.delete_job(&ns, "audit", Precondition::None).await.expect("delete audit");
    assert!(b.dependents(&ns, "load").await.expect("read").is_empty());
    // A pause keeps them.
    a.set_job_paused(&ns, "load", true, 3).await.expect("pause");
    assert_eq!(names(b.dependents(&ns, "extract").await.expect("read")), ["load"]);
}
