//! Every operation of the published API, with every kind of credential,
//! against a real server: each answer is checked against one table of
//! what each operation needs, and a refused call writes nothing.
//!
//! Path parameters take the names a role check once confused with actions
//! (`trigger`, `pause`, `resume`, `cancel`, `jobs`), so an operator cannot
//! reach a job write by naming a job after an operator action.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Need {
    /// No credential at all (probes).
    Public,
    Viewer,
    Operator,
    Admin,
    /// An admin not limited to namespaces.
    Unrestricted,
    /// No credential: the job's signature (a webhook call). The fixture job
    /// takes no webhook calls, so every caller, whatever its credential, is
    /// refused as for any call whose proof does not hold (401, the one
    /// answer) and nothing is written; `webhooks.rs` checks the signatures.
    Signed,
}

/// How an operation meets a credential limited to other namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Not about a namespace.
    None,
    /// Names the namespace: refused (403).
    Refused,
    /// A run of another namespace: not found (404).
    Hidden,
}

/// The one table: every operation of the document and what it needs.
const TABLE: &[(&str, &str, Need, Scope)] = &[
    ("get", "/v1/jobs", Need::Viewer, Scope::Refused),
    ("post", "/v1/jobs", Need::Admin, Scope::Refused),
    ("get", "/v1/jobs/{name}", Need::Viewer, Scope::Refused),
    ("put", "/v1/jobs/{name}", Need::Admin, Scope::Refused),
    ("delete", "/v1/jobs/{name}", Need::Admin, Scope::Refused),
    ("post", "/v1/jobs/{name}/trigger", Need::Operator, Scope::Refused),
    ("post", "/v1/jobs/{name}/pause", Need::Operator, Scope::Refused),
    ("post", "/v1/jobs/{name}/resume", Need::Operator, Scope::Refused),
    ("post", "/v1/jobs/{name}/backfill", Need::Operator, Scope::Refused),
    ("get", "/v1/backfills", Need::Viewer, Scope::Refused),
    ("get", "/v1/backfills/{id}", Need::Viewer, Scope::Hidden),
    ("post", "/v1/backfills/{id}/cancel", Need::Operator, Scope::Hidden),
    ("post", "/v1/schedules/preview", Need::Viewer, Scope::None),
    ("get", "/v1/runs", Need::Viewer, Scope::Refused),
    ("get", "/v1/runs/{id}", Need::Viewer, Scope::Hidden),
    ("get", "/v1/runs/{id}/output", Need::Viewer, Scope::Hidden),
    ("post", "/v1/runs/{id}/cancel", Need::Operator, Scope::Hidden),
    ("post", "/v1/hooks/{namespace}/{job}", Need::Signed, Scope::None),
    ("get", "/v1/workers", Need::Viewer, Scope::None),
    ("delete", "/v1/workers/{id}/binding", Need::Unrestricted, Scope::None),
    ("get", "/v1/namespaces", Need::Viewer, Scope::None),
    ("get", "/v1/namespaces/{namespace}", Need::Viewer, Scope::Refused),
    ("get", "/v1/whoami", Need::Viewer, Scope::None),
    ("get", "/v1/leader", Need::Viewer, Scope::None),
    ("get", "/v1/cluster", Need::Viewer, Scope::None),
    ("post", "/v1/cluster/learners", Need::Unrestricted, Scope::None),
    ("post", "/v1/cluster/members/{id}/promote", Need::Unrestricted, Scope::None),
    ("delete", "/v1/cluster/members/{id}", Need::Unrestricted, Scope::None),
    ("get", "/healthz", Need::Public, Scope::None),
    ("get", "/readyz", Need::Public, Scope::None),
];

/// A kind of credential.
struct Cred {
    label: &'static str,
    /// The bearer token (`None`: no header).
    token: Option<String>,
    /// Its client role's rank (0: not a client role, or none at all).
    rank: u8,
    known: bool,
    limited: bool,
}

fn rank(need: Need) -> u8 {
    match need {
        Need::Public => 0,
        Need::Viewer => 1,
        Need::Operator => 2,
        Need::Admin | Need::Unrestricted => 3,
        Need::Signed => 0,
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Unauthenticated,
    Forbidden,
    NotFound,
    Allowed,
}

fn expect(need: Need, scope: Scope, c: &Cred) -> Expect {
    if need == Need::Public {
        return Expect::Allowed;
    }
    if need == Need::Signed {
        return Expect::Unauthenticated;
    }
    if !c.known {
        return Expect::Unauthenticated;
    }
    if c.rank < rank(need) || c.rank == 0 || (need == Need::Unrestricted && c.limited) {
        return Expect::Forbidden;
    }
    match (c.limited, scope) {
        (true, Scope::Refused) => Expect::Forbidden,
        (true, Scope::Hidden) => Expect::NotFound,
        _ => Expect::Allowed,
    }
}

const NS: &str = "teamb";

/// A job of `NS` whose runs no worker may take (they stay pending, so the
/// store only changes by the calls made here).
fn job(name: &str) -> Vec<u8> {
    json!({"name": name, "namespace": NS, "schedule": {"every": "1h"},
           "executor": {"shell": {"command": "true"}}, "route": {"labels": {"pool": "nobody"}}})
    .to_string()
    .into_bytes()
}

/// What a refused call must leave as it was: every job (namespace, name,
/// version, paused) and every run of `NS` (id, state).
fn snapshot(addr: &str, admin: &str) -> Value {
    let (_, jobs) = http_as(Some(admin), addr, "GET", "/v1/jobs", None).unwrap();
    let jobs: Vec<Value> =
        jobs["jobs"].as_array().unwrap().iter().map(|j| json!([j["namespace"], j["name"], j["version"], j["status"]["paused"]])).collect();
    let (_, runs) = http_as(Some(admin), addr, "GET", &format!("/v1/runs?namespace={NS}&limit=1000"), None).unwrap();
    let runs: Vec<Value> = runs["runs"].as_array().unwrap().iter().map(|r| json!([r["id"], r["state"]])).collect();
    let (_, backfills) = http_as(Some(admin), addr, "GET", "/v1/backfills", None).unwrap();
    let backfills: Vec<Value> = backfills["backfills"].as_array().unwrap().iter().map(|b| json!([b["id"], b["state"]])).collect();
    json!({"jobs": jobs, "runs": runs, "backfills": backfills})
}

#[test]
fn every_operation_answers_every_credential_as_the_table_says() {
    let dir = tempfile::tempdir().unwrap();
    let mut entries = Vec::new();
    let mut cred = |label: &'static str, args: &[&str], rank: u8, limited: bool| {
        let (token, entry) = new_credential(label, args);
        entries.push(entry);
        Cred { label, token: Some(token), rank, known: true, limited }
    };
    let creds = vec![
        cred("viewer", &["--role", "viewer"], 1, false),
        cred("operator", &["--role", "operator"], 2, false),
        cred("admin", &["--role", "admin"], 3, false),
        cred("viewer-a", &["--role", "viewer", "--namespace", "teama"], 1, true),
        cred("operator-a", &["--role", "operator", "--namespace", "teama"], 2, true),
        cred("admin-a", &["--role", "admin", "--namespace", "teama"], 3, true),
        cred("worker", &["--role", "worker"], 0, false),
        cred("worker-b", &["--role", "worker", "--namespace", NS], 0, true),
        cred("member", &["--role", "member"], 0, false),
        Cred { label: "none", token: None, rank: 0, known: false, limited: false },
        Cred { label: "unknown", token: Some("0123456789abcdef0123456789abcdef".into()), rank: 0, known: false, limited: false },
    ];
    let file = dir.path().join("auth.toml");
    std::fs::write(&file, entries.join("\n\n")).unwrap();
    let admin = creds.iter().find(|c| c.label == "admin").unwrap().token.clone().unwrap();
    let (_server, addr) = leading_dev_with(dir.path(), &["--auth-file".into(), file.display().to_string()]);

    // The table covers exactly the document's operations: a new route
    // fails here until its policy is written down.
    let (_, doc) = http(&addr, "GET", "/v1/openapi.json", None).unwrap();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys().filter(|m| ["get", "put", "post", "delete", "patch"].contains(&m.as_str())) {
            documented.insert((method.clone(), path.clone()));
        }
    }
    let tabled: BTreeSet<(String, String)> = TABLE.iter().map(|(m, p, _, _)| (m.to_string(), p.to_string())).collect();
    assert_eq!(documented, tabled, "the published operations and this table differ");

    // A run of NS for the run operations (it stays pending).
    let put = |name: &str| {
        let (s, v) = http_as(Some(&admin), &addr, "PUT", &format!("/v1/jobs/{name}?namespace={NS}"), Some(&job(name))).unwrap();
        assert!(s == 200 || s == 201, "{name}: {s} {v}");
        let (s, v) = http_as(Some(&admin), &addr, "POST", &format!("/v1/jobs/{name}/resume?namespace={NS}"), None).unwrap();
        assert_eq!(s, 200, "{v}");
    };
    put("fixture");
    let (s, run) = http_as(Some(&admin), &addr, "POST", &format!("/v1/jobs/fixture/trigger?namespace={NS}"), None).unwrap();
    assert_eq!(s, 201, "{run}");
    let run_id = run["id"].as_str().unwrap().to_string();
    // A backfill of NS for the backfill operations, cancelled at once (so
    // it writes nothing while the table is checked).
    let now = chrono::Utc::now();
    let range = |from: i64, to: i64| {
        let at = |h: i64| (now - chrono::Duration::hours(h)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        json!({"from": at(from), "to": at(to), "rate": 1}).to_string().into_bytes()
    };
    let (s, b) = http_as(Some(&admin), &addr, "POST", &format!("/v1/jobs/fixture/backfill?namespace={NS}"), Some(&range(900, 1))).unwrap();
    assert_eq!(s, 201, "{b}");
    let backfill_id = b["id"].as_str().unwrap().to_string();
    let (s, b) = http_as(Some(&admin), &addr, "POST", &format!("/v1/backfills/{backfill_id}/cancel"), None).unwrap();
    assert_eq!(s, 200, "{b}");

    let names = ["trigger", "pause", "resume", "cancel", "jobs"];
    let mut checked = 0;
    let mut created = 0;
    for (method, template, need, scope) in TABLE {
        let instances: Vec<(String, Option<String>)> = if template.contains("{name}") {
            names.iter().map(|n| (template.replace("{name}", n), Some(n.to_string()))).collect()
        } else if template.starts_with("/v1/runs/{id}") {
            vec![(template.replace("{id}", &run_id), None)]
        } else if template.starts_with("/v1/backfills/{id}") {
            vec![(template.replace("{id}", &backfill_id), None)]
        } else {
            vec![(template.replace("{id}", "2").replace("{namespace}", NS).replace("{job}", "fixture"), None)]
        };
        for (path, name) in instances {
            for c in &creds {
                if let Some(n) = &name {
                    put(n);
                }
                let (path_q, body): (String, Option<Vec<u8>>) = match (*method, *template) {
                    ("post", "/v1/jobs") => {
                        created += 1;
                        (format!("{path}?namespace={NS}"), Some(job(&format!("created-{created}"))))
                    }
                    ("put", _) => (format!("{path}?namespace={NS}"), Some(job(name.as_deref().unwrap()))),
                    ("post", "/v1/schedules/preview") => (path.clone(), Some(br#"{"schedule":{"every":"1h"}}"#.to_vec())),
                    // A range whose first instant is after its last: refused
                    // once allowed (400), so no backfill runs while the table
                    // is checked.
                    ("post", "/v1/jobs/{name}/backfill") => (format!("{path}?namespace={NS}"), Some(range(1, 3))),
                    ("post", "/v1/cluster/learners") => (path.clone(), Some(br#"{"id":9,"address":"127.0.0.1:1"}"#.to_vec())),
                    _ if template.starts_with("/v1/jobs") || *template == "/v1/runs" || *template == "/v1/backfills" => {
                        (format!("{path}?namespace={NS}"), None)
                    }
                    _ => (path.clone(), None),
                };
                let before = snapshot(&addr, &admin);
                let (status, answer) = http_as(c.token.as_deref(), &addr, &method.to_ascii_uppercase(), &path_q, body.as_deref()).unwrap();
                let want = expect(*need, *scope, c);
                let what = format!("{} {path_q} as {}: {status} {answer}", method.to_ascii_uppercase(), c.label);
                match want {
                    Expect::Unauthenticated => assert_eq!(status, 401, "{what}"),
                    Expect::Forbidden => assert_eq!(status, 403, "{what}"),
                    Expect::NotFound => assert_eq!(status, 404, "{what}"),
                    Expect::Allowed => assert!(!matches!(status, 401 | 403) && (200..500).contains(&status), "{what}"),
                }
                if want != Expect::Allowed {
                    assert!(answer["error"]["code"].is_string(), "a refusal says why: {what}");
                    assert_eq!(snapshot(&addr, &admin), before, "a refused call wrote: {what}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 300, "{checked}");
}
