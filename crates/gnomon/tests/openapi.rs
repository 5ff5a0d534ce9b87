//! The published OpenAPI document describes what the server really sends:
//! every operation it lists is called on a real `gnomon dev`, and every
//! answer (successes and errors) validates against the schema the document
//! gives for that operation and status. Objects are checked closed (no
//! field the document does not name), so a field added to an answer
//! without its type fails here.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// Makes every object schema closed: `unevaluatedProperties: false` on
/// each schema with properties or `allOf`, except the members of an
/// `allOf` (their parent closes over all of them together).
fn close(schema: &mut Value, in_all_of: bool) {
    match schema {
        Value::Object(map) => {
            // Only object types: a rule's subschema (`dependentSchemas`,
            // `then`, a `oneOf` branch naming required fields) constrains
            // some properties of an object that its type closes.
            let typed = map.get("type") == Some(&json!("object"));
            let is_object = (typed && map.contains_key("properties")) || map.contains_key("allOf");
            if is_object && !in_all_of && !map.contains_key("additionalProperties") {
                map.insert("unevaluatedProperties".into(), json!(false));
            }
            for (key, value) in map.iter_mut() {
                match (key.as_str(), value) {
                    ("allOf", Value::Array(items)) => items.iter_mut().for_each(|i| close(i, true)),
                    (_, v) => close(v, false),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| close(i, false)),
        _ => {}
    }
}

struct Checker {
    doc: Value,
    seen: BTreeSet<(String, String)>,
    addr: String,
}

impl Checker {
    /// Calls `method path` (`template` is the document's path) and validates
    /// the answer against the document; returns the status and body.
    fn call(&mut self, method: &str, template: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let bytes = body.map(|b| serde_json::to_vec(&b).unwrap());
        self.call_with(method, template, path, &[], bytes.as_deref())
    }

    /// [`Checker::call`] with request headers and a raw body.
    fn call_with(&mut self, method: &str, template: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> (u16, Value) {
        let (status, value) = http_with(None, &self.addr, method, path, headers, body).unwrap();
        let op = &self.doc["paths"][template][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {template} is not in the document");
        self.seen.insert((template.to_string(), method.to_ascii_lowercase()));
        let responses = &op["responses"];
        let class = format!("{}XX", status / 100);
        let response = [status.to_string(), class.clone()]
            .iter()
            .map(|k| &responses[k])
            .find(|r| r.is_object())
            .unwrap_or_else(|| panic!("{method} {path} answered {status}, which the document does not list: {value}"));
        match response["content"]["application/json"]["schema"].as_object() {
            None => assert!(value.is_null(), "{method} {path} answered {status} with a body the document does not describe: {value}"),
            Some(schema) => {
                let mut root = self.doc.clone();
                root.as_object_mut().unwrap().extend(schema.clone());
                let validator = jsonschema::draft202012::new(&root).expect("the document's schemas compile");
                let errors: Vec<String> = validator.iter_errors(&value).map(|e| format!("{e} at {}", e.instance_path())).collect();
                assert!(errors.is_empty(), "{method} {path} answered {status}, not as documented:\n{}\nbody: {value:#}", errors.join("\n"));
            }
        }
        (status, value)
    }
}

#[test]
fn every_answer_matches_the_published_document() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev_env(dir.path(), &[("GNOMON_HOOK_SECRET_DOC", "doc-secret")]);
    let (status, mut doc) = http(&addr, "GET", "/v1/openapi.json", None).unwrap();
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"].as_str().map(|v| v.starts_with("3.1")), Some(true), "an OpenAPI 3.1 document");
    close(&mut doc, false);
    let mut c = Checker { doc: doc.clone(), seen: BTreeSet::new(), addr: addr.clone() };

    // Jobs.
    let job = json!({"name": "echo", "description": "says hello", "schedule": {"every": "1h"},
        "retry": {"max_attempts": 2, "backoff": {"initial": "1s"}}, "timeout": "30s",
        "route": {"strategy": "least_loaded", "labels": {}},
        "executor": {"shell": {"command": "sh", "args": ["-c", "echo hello; sleep 0.2"], "env": {"A": "b"}}}});
    assert_eq!(c.call("POST", "/v1/jobs", "/v1/jobs", Some(job.clone())).0, 201);
    assert_eq!(c.call("POST", "/v1/jobs", "/v1/jobs", Some(job.clone())).0, 409);
    let bad = json!({"name": "bad", "schedule": {"cron": "61 * * * *"}, "executor": {"shell": {"command": "true"}}});
    let (status, err) = c.call("POST", "/v1/jobs", "/v1/jobs", Some(bad));
    assert_eq!((status, err["error"]["code"].as_str()), (400, Some("invalid_cron")));
    let http_job = json!({"name": "ping", "schedule": {"cron": "0 30 2 * * *", "timezone": "Europe/Berlin"}, "overlap": "forbid",
        "misfire": "skip", "catchup_window": "1m",
        "executor": {"http": {"url": "http://127.0.0.1:9/", "method": "POST", "headers": {"X": "y"}, "body": "{}", "expect_status": 204}}});
    assert_eq!(c.call("PUT", "/v1/jobs/{name}", "/v1/jobs/ping", Some(http_job)).0, 201);
    let handler = json!({"name": "hand", "executor": {"handler": {"name": "noop", "payload": {"k": [1, 2]}}}});
    assert_eq!(c.call("PUT", "/v1/jobs/{name}", "/v1/jobs/hand", Some(handler.clone())).0, 201);
    assert_eq!(c.call("PUT", "/v1/jobs/{name}", "/v1/jobs/hand?version=1", Some(handler)).0, 200);
    assert_eq!(c.call("PUT", "/v1/jobs/{name}", "/v1/jobs/other", Some(job.clone())).0, 400);

    // What the document says and the server does agree. A handler's
    // payload is any JSON value, in the schema and on the server.
    let payload = &doc["components"]["schemas"]["HandlerSpec"]["properties"]["payload"];
    let payload_schema = jsonschema::draft202012::new(payload).expect("the payload's schema compiles");
    for value in [json!(42), json!("text"), json!([1, "a"]), json!(null), json!(true), json!({"k": {"deep": [1.5]}})] {
        assert!(payload_schema.is_valid(&value), "the document refuses the payload {value}: {payload}");
        let job = json!({"name": "any-payload", "executor": {"handler": {"name": "noop", "payload": value}}});
        let (status, body) = c.call("PUT", "/v1/jobs/{name}", "/v1/jobs/any-payload", Some(job));
        assert!(status == 200 || status == 201, "the server refuses the payload {value}: {body}");
    }
    // If-Match is declared on the job writes it guards, and honoured.
    for method in ["put", "delete"] {
        let params = doc["paths"]["/v1/jobs/{name}"][method]["parameters"].as_array().unwrap();
        assert!(params.iter().any(|p| p["name"] == "If-Match" && p["in"] == "header"), "{method} declares no If-Match: {params:?}");
    }
    let (_, current) = c.call("GET", "/v1/jobs/{name}", "/v1/jobs/any-payload", None);
    let version = current["status"]["version"].as_u64().unwrap().to_string();
    let unnamed = json!({"executor": {"handler": {"name": "noop"}}});
    let stale = (version.parse::<u64>().unwrap() + 5).to_string();
    let unnamed_bytes = serde_json::to_vec(&unnamed).unwrap();
    let (status, _) = c.call_with("PUT", "/v1/jobs/{name}", "/v1/jobs/any-payload", &[("If-Match", &stale)], Some(&unnamed_bytes));
    assert_eq!(status, 409, "a stale If-Match is refused");
    let quoted = format!("\"{version}\"");
    let (status, body) = c.call_with("PUT", "/v1/jobs/{name}", "/v1/jobs/any-payload", &[("If-Match", &quoted)], Some(&unnamed_bytes));
    assert_eq!((status, body["name"].as_str()), (200, Some("any-payload")), "a PUT body without a name takes the path's: {body}");
    // A trigger's body may be JSON null (as documented), empty or {}.
    let trigger_body = &doc["paths"]["/v1/jobs/{name}/trigger"]["post"]["requestBody"]["content"]["application/json"]["schema"];
    assert!(
        jsonschema::draft202012::new(&{
            let mut root = doc.clone();
            root.as_object_mut().unwrap().extend(trigger_body.as_object().unwrap().clone());
            root
        })
        .unwrap()
        .is_valid(&json!(null)),
        "the document no longer allows a null trigger body: {trigger_body}"
    );
    for body in [&b"null"[..], b"", b"{}", b" null "] {
        let (status, run) = c.call_with("POST", "/v1/jobs/{name}/trigger", "/v1/jobs/any-payload/trigger", &[], Some(body));
        assert_eq!(status, 201, "a trigger with the body {:?}: {run}", String::from_utf8_lossy(body));
    }
    assert_eq!(c.call("GET", "/v1/jobs", "/v1/jobs", None).0, 200);
    assert_eq!(c.call("GET", "/v1/jobs", "/v1/jobs?namespace=default&stale=true", None).0, 200);
    assert_eq!(c.call("GET", "/v1/jobs", "/v1/jobs?bogus=1", None).0, 400);
    assert_eq!(c.call("GET", "/v1/jobs/{name}", "/v1/jobs/echo", None).0, 200);
    assert_eq!(c.call("GET", "/v1/jobs/{name}", "/v1/jobs/missing", None).0, 404);
    assert_eq!(c.call("POST", "/v1/jobs/{name}/pause", "/v1/jobs/ping/pause", None).0, 200);
    assert_eq!(c.call("POST", "/v1/jobs/{name}/resume", "/v1/jobs/ping/resume", None).0, 200);
    assert_eq!(c.call("POST", "/v1/jobs/{name}/resume", "/v1/jobs/missing/resume", None).0, 404);

    // Previews.
    let preview = json!({"schedule": {"cron": "0 30 2 * * *", "timezone": "Europe/Berlin"}, "count": 3, "after": "2026-03-27T12:00:00Z"});
    let (status, p) = c.call("POST", "/v1/schedules/preview", "/v1/schedules/preview", Some(preview));
    assert_eq!(status, 200);
    assert_eq!(p["fires"][1]["local"], json!("2026-03-29T03:00:00+02:00"));
    assert_eq!(p["fires"][1]["offset_changed_from"], json!("+01:00"));
    assert!(p["fires"][1]["note"].as_str().is_some());
    let (status, err) = c.call("POST", "/v1/schedules/preview", "/v1/schedules/preview", Some(json!({"schedule": {"cron": "x"}})));
    assert_eq!((status, err["error"]["code"].as_str()), (400, Some("invalid_cron")));
    assert_eq!(c.call("POST", "/v1/schedules/preview", "/v1/schedules/preview", Some(json!({"schedule": {}, "count": 0}))).0, 400);

    // Dependencies: a job after echo; a cycle, an unknown upstream and
    // deleting a job others run after are refused.
    let after = json!({"name": "after-echo", "after": [{"job": "echo", "on": "any"}], "executor": {"handler": {"name": "noop"}}});
    assert_eq!(c.call("POST", "/v1/jobs", "/v1/jobs", Some(after)).0, 201);
    let unknown = json!({"name": "x", "after": [{"job": "nope"}], "executor": {"handler": {"name": "noop"}}});
    let (status, err) = c.call("POST", "/v1/jobs", "/v1/jobs", Some(unknown));
    assert_eq!((status, err["error"]["code"].as_str()), (409, Some("unknown_upstream")));
    let (status, err) = c.call("DELETE", "/v1/jobs/{name}", "/v1/jobs/echo", None);
    assert_eq!((status, err["error"]["code"].as_str()), (409, Some("has_dependents")));

    // Runs: one trigger runs to the end on the embedded worker.
    let (status, run) = c.call("POST", "/v1/jobs/{name}/trigger", "/v1/jobs/echo/trigger", None);
    assert_eq!(status, 201);
    let id = run["id"].as_str().unwrap().to_string();
    let (status, many) = c.call("POST", "/v1/jobs/{name}/trigger", "/v1/jobs/hand/trigger?count=3", None);
    assert_eq!((status, many["count"].as_u64()), (201, Some(3)));
    assert_eq!(c.call("POST", "/v1/jobs/{name}/trigger", "/v1/jobs/echo/trigger?count=0", None).0, 400);
    wait_until("the run to end", Duration::from_secs(60), || {
        http(&addr, "GET", &format!("/v1/runs/{id}"), None).map(|(_, v)| v["state"] == json!("succeeded")).unwrap_or(false)
    });
    let (status, done) = c.call("GET", "/v1/runs/{id}", &format!("/v1/runs/{id}"), None);
    assert_eq!(status, 200);
    assert!(done["attempts"][0]["output"].as_str().unwrap_or("").contains("hello"), "{done}");
    assert_eq!(done["graph"]["downstream"][0]["job"], "after-echo", "the instant's graph: {done}");
    let down = done["graph"]["downstream"][0]["id"].as_str().expect("its run of the instant").to_string();
    wait_until("the dependency run to end", Duration::from_secs(60), || {
        http(&addr, "GET", &format!("/v1/runs/{down}"), None).map(|(_, v)| v["state"] == json!("succeeded")).unwrap_or(false)
    });
    let (status, dep) = c.call("GET", "/v1/runs/{id}", &format!("/v1/runs/{down}"), None);
    assert_eq!((status, dep["graph"]["upstream"][0]["state"].as_str()), (200, Some("succeeded")), "{dep}");
    assert_eq!(c.call("GET", "/v1/runs/{id}", "/v1/runs/nope", None).0, 404);
    assert_eq!(c.call("GET", "/v1/runs", "/v1/runs?limit=2", None).0, 200);
    assert_eq!(c.call("GET", "/v1/runs", "/v1/runs?job=echo&state=succeeded&stale=true", None).0, 200);
    assert_eq!(c.call("GET", "/v1/runs", "/v1/runs?state=weird", None).0, 400);
    // Backfills: one that finishes, one cancelled, refusals.
    let tick = json!({"name": "tick", "schedule": {"every": "1s"}, "executor": {"handler": {"name": "noop"}}});
    assert_eq!(c.call("POST", "/v1/jobs", "/v1/jobs", Some(tick)).0, 201);
    let at = |ago_s: i64| (chrono::Utc::now() - chrono::Duration::seconds(ago_s)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let (status, b) =
        c.call("POST", "/v1/jobs/{name}/backfill", "/v1/jobs/tick/backfill", Some(json!({"from": at(20), "to": at(15), "rate": 100})));
    assert_eq!(status, 201, "{b}");
    let bid = b["id"].as_str().unwrap().to_string();
    wait_until("the backfill to finish", Duration::from_secs(60), || {
        http(&addr, "GET", &format!("/v1/backfills/{bid}"), None).map(|(_, v)| v["state"] == json!("done")).unwrap_or(false)
    });
    assert_eq!(c.call("GET", "/v1/backfills/{id}", &format!("/v1/backfills/{bid}"), None).0, 200);
    assert_eq!(c.call("GET", "/v1/backfills", "/v1/backfills?job=tick", None).0, 200);
    assert_eq!(c.call("POST", "/v1/backfills/{id}/cancel", &format!("/v1/backfills/{bid}/cancel"), None).0, 409);
    let (_, slow_b) =
        c.call("POST", "/v1/jobs/{name}/backfill", "/v1/jobs/tick/backfill", Some(json!({"from": at(3000), "to": at(2000), "rate": 1})));
    let sid = slow_b["id"].as_str().unwrap().to_string();
    assert_eq!(c.call("POST", "/v1/backfills/{id}/cancel", &format!("/v1/backfills/{sid}/cancel"), None).0, 200);
    assert_eq!(c.call("GET", "/v1/backfills/{id}", "/v1/backfills/nope", None).0, 404);
    let (status, err) = c.call("POST", "/v1/jobs/{name}/backfill", "/v1/jobs/tick/backfill", Some(json!({"from": at(1), "to": at(5)})));
    assert_eq!((status, err["error"]["code"].as_str()), (400, Some("invalid_range")));
    let (status, err) =
        c.call("POST", "/v1/jobs/{name}/backfill", "/v1/jobs/tick/backfill", Some(json!({"from": at(-60), "to": at(-120)})));
    assert_eq!((status, err["error"]["code"].as_str()), (409, Some("no_instants")), "an end ahead is cut to now: {err}");

    // A long run, cancelled while it runs.
    let slow = json!({"name": "slow", "executor": {"shell": {"command": "sleep", "args": ["30"]}}});
    assert_eq!(c.call("POST", "/v1/jobs", "/v1/jobs", Some(slow)).0, 201);
    let (_, run) = c.call("POST", "/v1/jobs/{name}/trigger", "/v1/jobs/slow/trigger", None);
    let slow_id = run["id"].as_str().unwrap().to_string();
    wait_until("the slow run to start", Duration::from_secs(60), || {
        http(&addr, "GET", &format!("/v1/runs/{slow_id}"), None).map(|(_, v)| v["state"] == json!("running")).unwrap_or(false)
    });
    let (status, waiting) = c.call("GET", "/v1/runs", "/v1/runs?state=waiting", None);
    assert_eq!(status, 200, "{waiting}");
    // Its output while it runs, and an ended run's kept output.
    let (status, live) = c.call("GET", "/v1/runs/{id}/output", &format!("/v1/runs/{slow_id}/output?from=0"), None);
    assert_eq!((status, live["live"].clone()), (200, json!(true)), "{live}");
    let (status, kept) = c.call("GET", "/v1/runs/{id}/output", &format!("/v1/runs/{id}/output?attempt=1"), None);
    assert_eq!((status, kept["live"].clone()), (200, json!(false)), "{kept}");
    assert!(kept["text"].as_str().unwrap_or("").contains("hello"), "{kept}");
    assert_eq!(c.call("GET", "/v1/runs/{id}/output", &format!("/v1/runs/{id}/output?attempt=0"), None).0, 400);
    assert_eq!(c.call("GET", "/v1/runs/{id}/output", &format!("/v1/runs/{id}/output?attempt=9"), None).0, 404);
    assert_eq!(c.call("GET", "/v1/runs/{id}/output", "/v1/runs/nope/output", None).0, 404);
    let (status, _) = c.call("POST", "/v1/runs/{id}/cancel", &format!("/v1/runs/{slow_id}/cancel"), None);
    assert!(status == 200 || status == 202, "cancel answered {status}");
    assert_eq!(c.call("POST", "/v1/runs/{id}/cancel", &format!("/v1/runs/{id}/cancel"), None).0, 409);

    // A webhook call: signed, replayed, unsigned, too large, for a job without one.
    let hooked = json!({"name": "hooked", "params": {"who": {"default": "nobody"}},
        "triggers": {"webhook": {"secret": "doc", "params": {"who": "/who"}}},
        "executor": {"shell": {"command": "true"}}});
    assert_eq!(c.call("POST", "/v1/jobs", "/v1/jobs", Some(hooked)).0, 201);
    let hook = "/v1/hooks/{namespace}/{job}";
    let signed_call = |c: &mut Checker, path: &str, body: &[u8], key: Option<&str>| {
        let ts = now_ms();
        let job = path.rsplit('/').next().unwrap();
        let (ts_text, sig) = (ts.to_string(), sign("doc-secret", "default", job, ts, key.unwrap_or(""), body));
        let mut headers = vec![("Gnomon-Timestamp", ts_text.as_str()), ("Gnomon-Signature", sig.as_str())];
        headers.extend(key.map(|k| ("Idempotency-Key", k)));
        c.call_with("POST", hook, path, &headers, Some(body))
    };
    let (status, run) = signed_call(&mut c, "/v1/hooks/default/hooked", br#"{"who":"doc"}"#, None);
    assert_eq!((status, run["state"].as_str().is_some(), run.as_object().map(|o| o.len())), (201, true, Some(2)), "{run}");
    assert_eq!(signed_call(&mut c, "/v1/hooks/default/hooked", br#"{"who":"k"}"#, Some("k1")).0, 201);
    assert_eq!(signed_call(&mut c, "/v1/hooks/default/hooked", br#"{"who":"k"}"#, Some("k1")).0, 200);
    assert_eq!(signed_call(&mut c, "/v1/hooks/default/hooked", br#"{"who":"other"}"#, Some("k1")).0, 409);
    assert_eq!(signed_call(&mut c, "/v1/hooks/default/echo", b"{}", None).0, 401);
    assert_eq!(signed_call(&mut c, "/v1/hooks/default/hooked", &vec![b' '; 70 * 1024], None).0, 413);
    let (status, err) = c.call_with("POST", hook, "/v1/hooks/default/hooked", &[], Some(b"{}"));
    assert_eq!((status, err["error"]["code"].as_str()), (401, Some("unauthorized")), "{err}");

    // Cluster and operations.
    assert_eq!(c.call("GET", "/v1/workers", "/v1/workers", None).0, 200);
    // A server without credentials binds no worker id to one: the embedded
    // worker's id has no binding to release.
    let (status, err) = c.call("DELETE", "/v1/workers/{id}/binding", "/v1/workers/dev-worker/binding", None);
    assert_eq!((status, err["error"]["code"].as_str()), (404, Some("no_binding")), "{err}");
    let (status, err) = c.call("DELETE", "/v1/workers/{id}/binding", "/v1/workers/a%20b/binding", None);
    assert_eq!((status, err["error"]["code"].as_str()), (400, Some("invalid_worker_id")), "{err}");
    assert_eq!(c.call("GET", "/v1/namespaces", "/v1/namespaces", None).0, 200);
    assert_eq!(c.call("GET", "/v1/namespaces/{namespace}", "/v1/namespaces/default", None).0, 200);
    assert_eq!(c.call("GET", "/v1/namespaces/{namespace}", "/v1/namespaces/-bad", None).0, 400);
    let (status, me) = c.call("GET", "/v1/whoami", "/v1/whoami", None);
    assert_eq!((status, me["role"].as_str()), (200, Some("admin")));
    let (status, leader) = c.call("GET", "/v1/leader", "/v1/leader", None);
    assert_eq!((status, leader["is_self"].as_bool()), (200, Some(true)));
    assert_eq!(c.call("GET", "/v1/leader", "/v1/leader?stale=true", None).0, 200);
    assert_eq!(c.call("GET", "/v1/cluster", "/v1/cluster", None).0, 404);
    assert_eq!(c.call("POST", "/v1/cluster/learners", "/v1/cluster/learners", Some(json!({"id": 4, "address": "127.0.0.1:1"}))).0, 404);
    assert_eq!(c.call("POST", "/v1/cluster/members/{id}/promote", "/v1/cluster/members/4/promote", None).0, 404);
    assert_eq!(c.call("DELETE", "/v1/cluster/members/{id}", "/v1/cluster/members/4", None).0, 404);
    assert_eq!(c.call("GET", "/healthz", "/healthz", None).0, 200);
    assert_eq!(c.call("GET", "/readyz", "/readyz", None).0, 200);
    assert_eq!(c.call("DELETE", "/v1/jobs/{name}", "/v1/jobs/echo?version=99", None).0, 409);
    assert_eq!(c.call("DELETE", "/v1/jobs/{name}", "/v1/jobs/after-echo", None).0, 204);
    assert_eq!(c.call("DELETE", "/v1/jobs/{name}", "/v1/jobs/echo", None).0, 204);

    // Every operation the document lists was called.
    let mut listed = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            listed.insert((path.clone(), method.clone()));
        }
    }
    let missed: Vec<_> = listed.difference(&c.seen).collect();
    assert!(missed.is_empty(), "operations in the document that this test never called: {missed:?}");

    // The CLI reads the same types: its JSON output is the answer again.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(BIN).args(["--server", &format!("http://{addr}"), "-o", "json"]).args(args).output().unwrap();
        assert!(out.status.success(), "gnomon {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let p = cli(&[
        "job",
        "preview",
        "--cron",
        "0 30 2 * * *",
        "--timezone",
        "Europe/Berlin",
        "--after",
        "2026-03-27T12:00:00Z",
        "--count",
        "3",
    ]);
    assert_eq!(p["fires"][1]["local"], json!("2026-03-29T03:00:00+02:00"));
    assert_eq!(cli(&["job", "preview", "ping", "--count", "2"])["fires"].as_array().map(Vec::len), Some(2));
    assert_eq!(cli(&["run", "get", &id]), http(&addr, "GET", &format!("/v1/runs/{id}"), None).unwrap().1);
    let many = cli(&["job", "trigger", "hand", "--count", "2"]);
    assert_eq!(many["count"], json!(2));
    // YAML and JSON lines carry the same answers.
    let raw = |args: &[&str]| {
        let out = std::process::Command::new(BIN).args(["--server", &format!("http://{addr}")]).args(args).output().unwrap();
        assert!(out.status.success(), "gnomon {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let yaml: Value = serde_yaml_ng::from_str(&raw(&["-o", "yaml", "run", "get", &id])).unwrap();
    assert_eq!(yaml, http(&addr, "GET", &format!("/v1/runs/{id}"), None).unwrap().1);
    let lines = raw(&["-o", "jsonl", "run", "list", "--limit", "3"]);
    assert_eq!(lines.lines().count(), 3);
    assert!(lines.lines().all(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| v["id"].is_string())));
    let table = raw(&["job", "list"]);
    assert!(table.starts_with("NAME") && table.contains("hand"), "{table}");

    // And the check has teeth: an undocumented field, a missing one or a
    // wrong type in a real answer is refused.
    let mut root = doc.clone();
    root["$ref"] = json!("#/components/schemas/Run");
    let validator = jsonschema::draft202012::new(&root).unwrap();
    assert!(validator.is_valid(&done));
    let mut extra = done.clone();
    extra["surprise"] = json!(1);
    assert!(!validator.is_valid(&extra), "an undocumented field passes");
    let mut missing = done.clone();
    missing.as_object_mut().unwrap().remove("state");
    assert!(!validator.is_valid(&missing), "a missing field passes");
    let mut wrong = done.clone();
    wrong["attempts"][0]["exit_code"] = json!("zero");
    assert!(!validator.is_valid(&wrong), "a wrong type passes");
}
