//! Job dependencies through the API and the CLI of real `gnomon dev`
//! processes (embedded SQLite) on loopback: the checks at write (racing
//! writes included), chains, fan-out and fan-in, failure edges and skips,
//! inherited params, the graph of an instant, and a leader killed while
//! upstream runs end. The
//! replicated stores run dependency jobs through their failovers in
//! `failover.rs`.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

mod common;
use common::*;

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    http(addr, "POST", path, Some(body.to_string().as_bytes())).unwrap()
}

fn create(addr: &str, spec: Value) {
    let (code, body) = post(addr, "/v1/jobs", &spec);
    assert_eq!(code, 201, "{spec}: {body}");
}

fn noop(name: &str, after: Value) -> Value {
    json!({"name": name, "after": after, "executor": {"handler": {"name": "noop"}}})
}

/// Every run of `job`, by scheduled time.
fn runs_of(addr: &str, job: &str) -> BTreeMap<String, Value> {
    let (code, body) = http(addr, "GET", &format!("/v1/runs?job={job}&limit=1000"), None).unwrap();
    assert_eq!(code, 200, "{body}");
    body["runs"].as_array().unwrap().iter().map(|r| (r["scheduled_at"].as_str().unwrap().to_string(), r.clone())).collect()
}

fn ended(state: &Value) -> bool {
    ["succeeded", "failed", "cancelled", "skipped"].contains(&state.as_str().unwrap_or(""))
}

fn run(addr: &str, id: &str) -> Value {
    let (code, body) = http(addr, "GET", &format!("/v1/runs/{id}"), None).unwrap();
    assert_eq!(code, 200, "{body}");
    body
}

#[test]
fn edges_are_checked_at_write_and_a_job_others_run_after_is_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    create(&addr, noop("load", json!([])));
    create(&addr, noop("transform", json!([{"job": "load"}])));
    create(&addr, noop("report", json!([{"job": "transform"}])));
    let jobs_before = http(&addr, "GET", "/v1/jobs", None).unwrap().1;

    // Malformed edges are a 400; edges that do not fit the namespace's
    // jobs (an upstream it lacks, a cycle through others) a 409.
    let cases = [
        (noop("x", json!([{"job": "nope"}])), 409, "unknown_upstream", "after[0].job"),
        (noop("x", json!([{"job": "x"}])), 400, "dependency_cycle", "after[0].job"),
        (noop("x", json!([{"job": "other/load"}])), 400, "cross_namespace", "after[0].job"),
        (noop("x", json!([{"job": "load"}, {"job": "load"}])), 400, "invalid_after", "after[1].job"),
        (noop("x", json!([{"job": "load", "on": "sometimes"}])), 400, "invalid_field", "after[0]"),
    ];
    for (spec, status, code, field) in cases {
        let (got, body) = post(&addr, "/v1/jobs", &spec);
        assert_eq!((got, body["error"]["code"].as_str()), (status, Some(code)), "{spec}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(field), "{body}");
    }
    // A cycle through an update, with its path.
    let (status, body) =
        http(&addr, "PUT", "/v1/jobs/load", Some(noop("load", json!([{"job": "report"}])).to_string().as_bytes())).unwrap();
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("dependency_cycle")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("load → transform → report → load"), "{body}");
    // Deleting a job others run after is refused, naming them.
    let (status, body) = http(&addr, "DELETE", "/v1/jobs/transform", None).unwrap();
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("has_dependents")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("report"), "{body}");
    assert_eq!(http(&addr, "GET", "/v1/jobs", None).unwrap().1, jobs_before, "a refused write changes nothing");
    // Once nothing runs after it, it goes.
    assert_eq!(http(&addr, "DELETE", "/v1/jobs/report", None).unwrap().0, 204);
    assert_eq!(http(&addr, "DELETE", "/v1/jobs/transform", None).unwrap().0, 204);
}

/// One request of a race: method, path and body.
type Request = (&'static str, String, Option<Value>);

/// Sends every request at once, each from a thread of its own released
/// with the others; their answers, in order.
fn race(addr: &str, requests: Vec<Request>) -> Vec<(u16, Value)> {
    let start = std::sync::Barrier::new(requests.len());
    std::thread::scope(|s| {
        let threads: Vec<_> = requests
            .into_iter()
            .map(|(method, path, body)| {
                let start = &start;
                s.spawn(move || {
                    let body = body.map(|b| b.to_string());
                    start.wait();
                    http(addr, method, &path, body.as_deref().map(str::as_bytes)).unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// The stored dependency graph, read back; every upstream exists and no
/// path of edges comes back to where it started.
fn sound_graph(addr: &str) -> gnomon_core::deps::Graph {
    let (code, body) = http(addr, "GET", "/v1/jobs", None).unwrap();
    assert_eq!(code, 200, "{body}");
    let jobs: Vec<(String, Vec<gnomon_core::deps::AfterEdge>)> = body["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["name"].as_str().unwrap().to_string(), serde_json::from_value(j["after"].clone()).unwrap_or_default()))
        .collect();
    let graph: gnomon_core::deps::Graph =
        jobs.iter().map(|(n, after)| (n.clone(), after.iter().map(|e| e.job.clone()).collect())).collect();
    for (name, after) in &jobs {
        if let Err(e) = gnomon_core::deps::check_graph(name, after, &graph) {
            panic!("the stored graph is unsound at {name}: {e} ({graph:?})");
        }
    }
    graph
}

#[test]
fn racing_writes_store_no_cycle_and_no_edge_to_a_deleted_job() {
    const PAIRS: usize = 15;
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    for i in 0..PAIRS {
        for name in [format!("x{i}"), format!("y{i}"), format!("d{i}")] {
            create(&addr, noop(&name, json!([])));
        }
    }
    let put = |name: String, up: String| -> Request { ("PUT", format!("/v1/jobs/{name}"), Some(noop(&name, json!([{"job": up}])))) };
    // x after y against y after x, every pair at once: one of each pair
    // is refused as a cycle.
    let requests = (0..PAIRS).flat_map(|i| [put(format!("x{i}"), format!("y{i}")), put(format!("y{i}"), format!("x{i}"))]).collect();
    let answers = race(&addr, requests);
    for (i, pair) in answers.chunks(2).enumerate() {
        let mut codes: Vec<(u16, Option<&str>)> = pair.iter().map(|(s, b)| (*s, b["error"]["code"].as_str())).collect();
        codes.sort();
        assert_eq!(codes, [(200, None), (409, Some("dependency_cycle"))], "pair {i}: {pair:?}");
    }
    let graph = sound_graph(&addr);
    assert_eq!(graph.values().map(Vec::len).sum::<usize>(), PAIRS, "one edge per pair: {graph:?}");
    // A delete of d against the creation of a job after d: one of each
    // pair is refused, and no stored job names a job that is gone.
    let requests = (0..PAIRS).flat_map(|i| [("DELETE", format!("/v1/jobs/d{i}"), None), put(format!("e{i}"), format!("d{i}"))]).collect();
    let answers = race(&addr, requests);
    for (i, pair) in answers.chunks(2).enumerate() {
        let codes = (pair[0].0, pair[0].1["error"]["code"].as_str(), pair[1].0, pair[1].1["error"]["code"].as_str());
        assert!(
            codes == (204, None, 409, Some("unknown_upstream")) || codes == (409, Some("has_dependents"), 201, None),
            "pair {i}: {pair:?}"
        );
    }
    let graph = sound_graph(&addr);
    for i in 0..PAIRS {
        let (d, e) = (format!("d{i}"), format!("e{i}"));
        assert!(graph.contains_key(&d) == graph.contains_key(&e), "pair {i}: d and its dependent stand or go together: {graph:?}");
    }
}

#[test]
fn a_pipeline_runs_each_instant_once_fans_out_and_in_and_skips_a_refused_edge() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    create(&addr, json!({"name": "load", "params": {"day": {"default": "today"}}, "executor": {"handler": {"name": "noop"}}}));
    // load → (clean, stats) → report; audit only when load fails; notify on any end.
    create(&addr, noop("clean", json!([{"job": "load"}])));
    create(&addr, noop("stats", json!([{"job": "load"}])));
    let script = r#"echo "day=$GNOMON_PARAM_DAY""#;
    create(
        &addr,
        json!({"name": "report", "after": [{"job": "clean"}, {"job": "stats"}], "params": {"day": {"default": "never"}},
               "executor": {"shell": {"command": "sh", "args": ["-c", script]}}}),
    );
    create(&addr, noop("audit", json!([{"job": "load", "on": "failed"}])));
    create(&addr, noop("notify", json!([{"job": "load", "on": "any"}])));

    let (code, t) = post(&addr, "/v1/jobs/load/trigger", &json!({"params": {"day": "2026-12-01"}}));
    assert_eq!(code, 201, "{t}");
    let root = t["id"].as_str().unwrap().to_string();
    let at = run(&addr, &root)["scheduled_at"].as_str().unwrap().to_string();
    wait_until("the pipeline to end", Duration::from_secs(60), || {
        ["clean", "stats", "report", "audit", "notify"].iter().all(|j| runs_of(&addr, j).get(&at).is_some_and(|r| ended(&r["state"])))
    });
    for job in ["clean", "stats", "report", "notify"] {
        let runs = runs_of(&addr, job);
        assert_eq!(runs.len(), 1, "{job}: one run per upstream instant: {runs:?}");
        assert_eq!(runs[&at]["state"], "succeeded", "{job}: {}", runs[&at]);
    }
    let audit = &runs_of(&addr, "audit")[&at];
    assert_eq!(audit["state"], "skipped", "{audit}");
    assert_eq!(audit["reason"], "after: load ended succeeded; the edge runs on failed");
    // The fan-in ran after both of its upstreams, with the params of the
    // instant (its own declaration takes the upstream's value).
    let report = run(&addr, runs_of(&addr, "report")[&at]["id"].as_str().unwrap());
    assert_eq!(report["params"]["day"], "2026-12-01", "{report}");
    assert!(report["attempts"][0]["output"].as_str().unwrap().contains("day=2026-12-01"), "{report}");
    let report_started = report["attempts"][0]["assigned_at"].as_str().unwrap().to_string();
    for up in ["clean", "stats"] {
        let r = run(&addr, runs_of(&addr, up)[&at]["id"].as_str().unwrap());
        let up_ended = r["attempts"][0]["ended_at"].as_str().unwrap().to_string();
        assert!(up_ended <= report_started, "{up} ended at {up_ended}, report started at {report_started}");
    }
    // The graph of the instant, from either side.
    let g = &report["graph"];
    let ups: Vec<(&str, &str)> =
        g["upstream"].as_array().unwrap().iter().map(|u| (u["job"].as_str().unwrap(), u["state"].as_str().unwrap())).collect();
    assert_eq!(ups, [("clean", "succeeded"), ("stats", "succeeded")], "{g}");
    let root_view = run(&addr, &root);
    let downs: Vec<&str> = root_view["graph"]["downstream"].as_array().unwrap().iter().map(|d| d["job"].as_str().unwrap()).collect();
    assert_eq!(downs, ["audit", "clean", "notify", "stats"], "{}", root_view["graph"]);
    // The CLI shows the graph too.
    let out =
        Command::new(BIN).args(["--server", &format!("http://{addr}"), "run", "get", &root]).env_remove("GNOMON_TOKEN").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("downstream") && text.contains("audit"), "{text}");

    // A failing upstream: the failure edge runs, the others are skipped.
    create(&addr, json!({"name": "flaky", "executor": {"shell": {"command": "false"}}}));
    create(&addr, noop("on-fail", json!([{"job": "flaky", "on": "failed"}])));
    create(&addr, noop("on-ok", json!([{"job": "flaky"}])));
    create(&addr, noop("after-ok", json!([{"job": "on-ok"}])));
    let (code, t) = post(&addr, "/v1/jobs/flaky/trigger", &json!({}));
    assert_eq!(code, 201, "{t}");
    let at = run(&addr, t["id"].as_str().unwrap())["scheduled_at"].as_str().unwrap().to_string();
    wait_until("the failure edges to decide", Duration::from_secs(60), || {
        ["on-fail", "on-ok", "after-ok"].iter().all(|j| runs_of(&addr, j).get(&at).is_some_and(|r| ended(&r["state"])))
    });
    assert_eq!(runs_of(&addr, "on-fail")[&at]["state"], "succeeded");
    assert_eq!(runs_of(&addr, "on-ok")[&at]["state"], "skipped");
    let after_ok = &runs_of(&addr, "after-ok")[&at];
    assert_eq!(
        (after_ok["state"].as_str(), after_ok["reason"].as_str()),
        (Some("skipped"), Some("after: on-ok ended skipped; the edge runs on succeeded"))
    );
}

#[test]
fn a_waiting_run_shows_what_it_waits_for_and_can_be_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    create(&addr, json!({"name": "slow", "executor": {"shell": {"command": "sleep", "args": ["30"]}}}));
    create(&addr, noop("next", json!([{"job": "slow"}])));
    let (code, t) = post(&addr, "/v1/jobs/slow/trigger", &json!({}));
    assert_eq!(code, 201, "{t}");
    let at = run(&addr, t["id"].as_str().unwrap())["scheduled_at"].as_str().unwrap().to_string();
    let mut next = Value::Null;
    wait_until("the downstream run to wait", Duration::from_secs(30), || {
        next = runs_of(&addr, "next").get(&at).cloned().unwrap_or_default();
        next["state"] == "waiting"
    });
    let id = next["id"].as_str().unwrap().to_string();
    let view = run(&addr, &id);
    assert_eq!(view["waiting_for"], "after: slow", "{view}");
    let (code, cancelled) = http(&addr, "POST", &format!("/v1/runs/{id}/cancel"), None).unwrap();
    assert_eq!((code, cancelled["state"].as_str()), (200, Some("cancelled")), "{cancelled}");
    // Its upstream's end later changes nothing.
    let slow = t["id"].as_str().unwrap();
    // Pending (200) or running (202), as the worker has taken it or not.
    let code = http(&addr, "POST", &format!("/v1/runs/{slow}/cancel"), None).unwrap().0;
    assert!(matches!(code, 200 | 202), "{code}");
    wait_until("the upstream to end", Duration::from_secs(30), || ended(&run(&addr, slow)["state"]));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(run(&addr, &id)["state"], "cancelled");
}

#[test]
fn each_upstream_outcome_releases_its_downstream_run_once_across_a_killed_leader() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dev, addr) = leading_dev(dir.path());
    create(&addr, json!({"name": "up", "executor": {"shell": {"command": "sh", "args": ["-c", "sleep 0.$((RANDOM % 5))"]}}}));
    // The downstream runs retry: one whose attempt the kill cuts off is
    // lost and runs again.
    let down = json!({"name": "down", "after": [{"job": "up"}], "executor": {"handler": {"name": "noop"}},
                      "retry": {"max_attempts": 3, "backoff": {"initial": "100ms"}}});
    create(&addr, down);
    let (code, t) = post(&addr, "/v1/jobs/up/trigger?count=40", &json!({}));
    assert_eq!(code, 201, "{t}");
    // Kill the leader while the upstream runs end, and their downstream
    // runs are being released.
    wait_until("some upstream runs to end", Duration::from_secs(30), || {
        runs_of(&addr, "up").values().filter(|r| r["state"] == "succeeded").count() >= 5
    });
    dev.signal(SIGKILL);
    dev.wait_exit(Duration::from_secs(10)).expect("the killed server exits");
    let (_dev, addr) = leading_dev(dir.path());
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let up = runs_of(&addr, "up");
        let down = runs_of(&addr, "down");
        if up.values().all(|r| ended(&r["state"])) && down.len() == up.len() && down.values().all(|r| ended(&r["state"])) {
            break;
        }
        if std::time::Instant::now() > deadline {
            let open: Vec<String> = up
                .values()
                .chain(down.values())
                .filter(|r| !ended(&r["state"]))
                .map(|r| format!("{} {} {}", r["id"], r["state"], run(&addr, r["id"].as_str().unwrap())["waiting_for"]))
                .collect();
            dump_logs(dir.path());
            panic!("runs still open after 120 s ({} up, {} down): {open:?}", up.len(), down.len());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let up = runs_of(&addr, "up");
    let down = runs_of(&addr, "down");
    assert_eq!(up.len(), 40);
    for (at, u) in &up {
        let d = &down[at];
        let expect = if u["state"] == "succeeded" { "succeeded" } else { "skipped" };
        assert_eq!(d["state"], expect, "{at}: up {} → down {}", u, d);
        if expect == "succeeded" {
            let u = run(&addr, u["id"].as_str().unwrap());
            let d = run(&addr, d["id"].as_str().unwrap());
            let up_end = u["attempts"].as_array().unwrap().last().unwrap()["ended_at"].as_str().unwrap().to_string();
            let down_start = d["attempts"][0]["assigned_at"].as_str().unwrap().to_string();
            assert!(up_end <= down_start, "{at}: the downstream run started before its upstream ended");
            let firsts = d["attempts"].as_array().unwrap().iter().filter(|a| a["attempt"] == 1).count();
            assert_eq!(firsts, 1, "released once: {d}");
        }
    }
}

/// `gnomon job create --after … --param …` writes the edges and params the
/// API reads back, the pipeline they make runs, and a bad flag is refused
/// by the CLI itself, with the flag's words, before any request.
#[test]
fn the_cli_creates_a_pipeline_with_edges_and_params() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    let url = format!("http://{addr}");
    let cli = |args: &[&str]| Command::new(BIN).args(["--server", &url]).args(args).env_remove("GNOMON_TOKEN").output().unwrap();
    let ok = |args: &[&str]| {
        let out = cli(args);
        assert!(out.status.success(), "gnomon {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    ok(&["job", "create", "extract", "--param", "day=today", "--param", "limit:int=100", "--", "true"]);
    let show = r#"echo "day=$GNOMON_PARAM_DAY""#;
    ok(&["job", "create", "transform", "--after", "extract", "--param", "day:string=never", "--", "sh", "-c", show]);
    ok(&["job", "create", "cleanup", "--after", "extract:failed", "--after", "transform:any", "--", "true"]);
    let get = |name: &str| -> Value { serde_json::from_slice(&ok(&["job", "get", name, "-o", "json"])).unwrap() };
    let extract = get("extract");
    assert_eq!(extract["params"], json!({"day": {"default": "today"}, "limit": {"default": 100}}), "{extract}");
    assert!(extract.get("after").is_none(), "{extract}");
    let transform = get("transform");
    assert_eq!(transform["after"], json!([{"job": "extract", "on": "succeeded"}]), "{transform}");
    assert_eq!(transform["params"], json!({"day": {"default": "never"}}), "{transform}");
    assert_eq!(get("cleanup")["after"], json!([{"job": "extract", "on": "failed"}, {"job": "transform", "on": "any"}]));

    // Bad flags: a message in the flags' words and a failed exit, before
    // any request (the CLI is pointed at a port where nothing listens, so
    // a request would fail otherwise).
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    for (args, says) in [
        (vec!["--after", "extract:failure"], "did you mean failed"),
        (vec!["--after", "other/extract"], "another namespace"),
        (vec!["--param", "1st=x"], "a parameter name is"),
        (vec!["--param", "n:int=many"], "is not an integer"),
        (vec!["--every", "1m", "--param", "day"], "day has no default"),
        (vec!["--webhook-secret", "HOOK", "--webhook-param", "day=/day"], "declares no param"),
    ] {
        let mut all = vec!["--server", nowhere.as_str(), "job", "create", "refused"];
        all.extend(args.iter().copied());
        all.extend(["--", "true"]);
        let out = Command::new(BIN).args(&all).env_remove("GNOMON_TOKEN").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(http(&addr, "GET", "/v1/jobs/refused", None).unwrap().0, 404);
    // What only the server knows is still its word: an unknown upstream.
    let out = cli(&["job", "create", "orphan", "--after", "nope", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("unknown_upstream"), "{err}");

    // The pipeline runs: transform takes the day the trigger set, cleanup
    // is skipped (extract did not fail).
    let t: Value = serde_json::from_slice(&ok(&["job", "trigger", "extract", "--param", "day=2026-12-01", "-o", "json"])).unwrap();
    let root = t["id"].as_str().unwrap_or_else(|| panic!("{t}")).to_string();
    let at = run(&addr, &root)["scheduled_at"].as_str().unwrap().to_string();
    wait_until("the pipeline to end", Duration::from_secs(60), || {
        ["transform", "cleanup"].iter().all(|j| runs_of(&addr, j).get(&at).is_some_and(|r| ended(&r["state"])))
    });
    let transform = run(&addr, runs_of(&addr, "transform")[&at]["id"].as_str().unwrap());
    assert_eq!(transform["state"], "succeeded", "{transform}");
    assert!(transform["attempts"][0]["output"].as_str().unwrap().contains("day=2026-12-01"), "{transform}");
    assert_eq!(run(&addr, &root)["params"], json!({"day": "2026-12-01", "limit": 100}));
    assert_eq!(runs_of(&addr, "cleanup")[&at]["state"], "skipped");
}
