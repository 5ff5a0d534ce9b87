//! The worker implementations under faults, on real processes: a server
//! failover (the worker follows the new leader), a frozen worker (it
//! starts nothing stale when it wakes, and its late report changes
//! nothing), and exactly-once steps of a job frozen at each point of its
//! step (one payment, on PostgreSQL and MariaDB).

use std::time::Duration;

use gnomon_backend::testing::testdb::{Server as Db, TestDb};
use serde_json::{json, Value};

use super::cases::{ms, Ctx, WITHIN};
use super::workers::Sdk;
use crate::common::*;

/// A `gnomon server` on `store`, listening on `addr`.
pub fn server(dir: &std::path::Path, name: &str, store: &str, addr: &str) -> Proc {
    let args: Vec<String> = ["server", "--store", store, "--listen", addr, "--node-id", name, "--lease-ttl", "3s", "--election-ttl", "3s"]
        .map(String::from)
        .to_vec();
    Proc::spawn(dir, name, &args)
}

pub fn leads(addr: &str) -> bool {
    http(addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == json!(true)).unwrap_or(false)
}

/// Waits until the leader's sessions list `id` as live.
pub fn wait_worker(addr: &str, id: &str) {
    wait_worker_as(None, addr, id);
}

/// Whether the leader's sessions list `id` as live (asked with `token`).
pub fn worker_live(token: Option<&str>, addr: &str, id: &str) -> bool {
    http_as(token, addr, "GET", "/v1/workers", None)
        .map(|(_, v)| v["workers"].as_array().is_some_and(|ws| ws.iter().any(|w| w["id"] == id && w["state"] == "live")))
        .unwrap_or(false)
}

/// [`wait_worker`], asking with `token`.
pub fn wait_worker_as(token: Option<&str>, addr: &str, id: &str) {
    wait_until(&format!("worker {id} to be live"), WITHIN, || worker_live(token, addr, id));
}

/// A server that wants credentials: an SDK worker with a worker
/// credential runs its jobs; one with a wrong token is refused, says so,
/// and is never a session.
pub fn credentials(sdk: Sdk) {
    let dir = tempfile::tempdir().unwrap();
    let (admin, admin_entry) = new_credential("admin-1", &["--role", "admin"]);
    let (worker, worker_entry) = new_credential("worker-1", &["--role", "worker"]);
    let auth = dir.path().join("auth.toml");
    std::fs::write(&auth, format!("{admin_entry}\n\n{worker_entry}")).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let store = format!("sqlite://{}/db.sqlite", dir.path().display());
    let args = ["server", "--store", &store, "--listen", &addr, "--auth-file", &auth.display().to_string()].map(String::from);
    let _server = Proc::spawn(dir.path(), "server", &args);
    wait_until("the server to lead", WITHIN, || leads(&addr));
    let (good, bad) = (format!("{}-good", sdk.label()), format!("{}-bad", sdk.label()));
    let servers = std::slice::from_ref(&addr);
    let _good = sdk.spawn_with(dir.path(), &good, servers, &[], &["--token".into(), worker.clone()]);
    let refused = sdk.spawn_with(dir.path(), &bad, servers, &[], &["--token".into(), "0123456789abcdef0123456789abcdef".into()]);
    wait_worker_as(Some(&admin), &addr, &good);
    let c = Ctx { sdk, addr: addr.clone(), token: Some(admin.clone()) };
    let job = c.job("credentialed", "echo", json!({}), json!({}));
    let id = c.trigger(&job, json!({}));
    let run = c.wait_state(&id, "succeeded");
    assert_eq!(attempt(&run, 1)["worker"], good.as_str(), "{run}");
    wait_until("the refused worker to say why", WITHIN, || {
        let log = refused.log().to_ascii_lowercase();
        log.contains("unauthenticated") || log.contains("refused") || log.contains("credential")
    });
    assert!(!worker_live(Some(&admin), &addr, &bad), "a worker with a wrong token is never a session");
    assert!(!refused.log().contains("0123456789abcdef0123456789abcdef"), "the token is not echoed: {}", refused.log());
}

fn attempt(run: &Value, n: usize) -> Value {
    run["attempts"].as_array().and_then(|a| a.get(n - 1)).cloned().unwrap_or(Value::Null)
}

/// Worker `a` is frozen (SIGSTOP) mid-attempt past its lease; the retry
/// runs on worker `b`. When `a` wakes it starts nothing stale, and its
/// late report changes nothing.
pub fn frozen_worker(sdk: Sdk) {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _server = server(dir.path(), "server", &format!("sqlite://{}/db.sqlite", dir.path().display()), &addr);
    wait_until("the server to lead", WITHIN, || leads(&addr));
    let starts = dir.path().join("starts.log");
    let env = [("GNOMON_CONFORMANCE_LOG", starts.display().to_string())];
    let (a_id, b_id) = (format!("{}-a", sdk.label()), format!("{}-b", sdk.label()));
    let a = sdk.spawn(dir.path(), &a_id, std::slice::from_ref(&addr), &env);
    wait_worker(&addr, &a_id);
    let c = Ctx { sdk, addr: addr.clone(), token: None };
    let retry = json!({"retry": {"max_attempts": 3, "backoff": {"initial": "100ms", "max": "100ms"}}});
    let job = c.job("frozen", "sleep", json!({"seconds": 60}), retry);
    let id = c.trigger(&job, json!({}));
    c.wait_run(&id, "running on a", |r| r["state"] == "running" && attempt(r, 1)["worker"] == a_id.as_str());
    // A tick or two, so the attempt is well under way.
    std::thread::sleep(Duration::from_millis(300));
    a.signal(SIGSTOP);
    let _b = sdk.spawn(dir.path(), &b_id, std::slice::from_ref(&addr), &env);
    let run = c.wait_run(&id, "retried on b", |r| r["attempt"] == 2 && attempt(r, 2)["worker"] == b_id.as_str() && r["state"] == "running");
    let first = attempt(&run, 1);
    assert_eq!(first["state"], "lost", "{run}");
    a.signal(SIGCONT);
    // `a` wakes: it fences itself, reconnects and sends its late report.
    wait_worker(&addr, &a_id);
    std::thread::sleep(Duration::from_secs(2));
    let run = c.run(&id);
    assert_eq!(attempt(&run, 1), first, "the late report changed nothing: {run}");
    assert_eq!((run["state"].clone(), attempt(&run, 2)["worker"].clone()), (json!("running"), json!(b_id)), "{run}");
    let lines: Vec<String> = std::fs::read_to_string(&starts).unwrap_or_default().lines().map(String::from).collect();
    assert_eq!(lines, [format!("{id} 1 start"), format!("{id} 2 start")], "{sdk:?}: nothing started twice or stale");
    let (s, v) = http(&addr, "POST", &format!("/v1/runs/{id}/cancel"), None).unwrap();
    assert!(s == 200 || s == 202, "{s} {v}");
    c.wait_state(&id, "cancelled");
}

/// Two servers on PostgreSQL; the leader is killed; the worker follows
/// the new leader and runs the job's next fires.
pub fn failover(sdk: Sdk) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let db = rt.block_on(TestDb::create(Db::Postgres)).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let addrs: Vec<String> = (0..2).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let mut servers: Vec<Option<Proc>> =
        addrs.iter().enumerate().map(|(i, a)| Some(server(dir.path(), &format!("s{i}"), &db.url, a))).collect();
    let mut leader = 0;
    wait_until("a server to lead", WITHIN, || {
        leader = addrs.iter().position(|a| leads(a)).unwrap_or(usize::MAX);
        leader != usize::MAX
    });
    let id = format!("{}-w", sdk.label());
    let _w = sdk.spawn(dir.path(), &id, &addrs, &[]);
    wait_worker(&addrs[leader], &id);
    let c = Ctx { sdk, addr: addrs[leader].clone(), token: None };
    let job = c.job("every-second", "echo", json!({}), json!({"schedule": {"every": "1s"}}));
    let succeeded_after = |addr: &str, t: i64| -> bool {
        http(addr, "GET", &format!("/v1/runs?job={job}&state=succeeded&limit=100"), None)
            .map(|(_, v)| v["runs"].as_array().is_some_and(|rs| rs.iter().any(|r| ms(r["scheduled_at"].as_str().unwrap_or("")) > t)))
            .unwrap_or(false)
    };
    wait_until("a run to succeed", WITHIN, || succeeded_after(&addrs[leader], 0));
    if let Some(p) = servers[leader].take() {
        p.signal(SIGKILL);
    }
    let killed = now_ms();
    let other = 1 - leader;
    wait_until("the other server to lead", WITHIN, || leads(&addrs[other]));
    wait_until("a fire after the failover to succeed on the worker", WITHIN, || succeeded_after(&addrs[other], killed + 1_000));
    let page = http(&addrs[other], "GET", &format!("/v1/runs?job={job}&limit=5"), None).unwrap().1;
    let newest = page["runs"].as_array().unwrap().iter().find(|r| r["state"] == "succeeded").cloned().unwrap();
    let run = http(&addrs[other], "GET", &format!("/v1/runs/{}", newest["id"].as_str().unwrap()), None).unwrap().1;
    assert_eq!(attempt(&run, run["attempt"].as_u64().unwrap_or(1) as usize)["worker"], id.as_str(), "{run}");
    drop(servers);
    rt.block_on(db.drop_database());
}

/// Where the first attempt's worker is frozen: before the step's guard,
/// inside the step's transaction after the guard, and after the commit
/// but before the report.
pub const FREEZES: [&str; 3] = ["before_guard", "in_tx", "after_commit"];

/// The tables of exactly-once steps, as the SDKs' `create_tables` make
/// them, and the job's own `payments`.
fn step_tables(server: Db) -> [&'static str; 3] {
    match server {
        Db::Postgres => [
            "CREATE TABLE gnomon_fence (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL, token BIGINT NOT NULL, \
             written_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            "CREATE TABLE gnomon_steps (run_id TEXT NOT NULL, step TEXT NOT NULL, attempt BIGINT NOT NULL, token BIGINT NOT NULL, \
             result TEXT, committed_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (run_id, step))",
            "CREATE TABLE payments (run_id TEXT NOT NULL, attempt BIGINT NOT NULL, amount BIGINT NOT NULL)",
        ],
        Db::MySql => [
            "CREATE TABLE gnomon_fence (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY, attempt BIGINT NOT NULL, \
             token BIGINT NOT NULL, written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB",
            "CREATE TABLE gnomon_steps (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL, \
             step VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, attempt BIGINT NOT NULL, token BIGINT NOT NULL, \
             result TEXT, committed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), PRIMARY KEY (run_id, step)) ENGINE=InnoDB",
            "CREATE TABLE payments (run_id VARCHAR(255) NOT NULL, attempt BIGINT NOT NULL, amount BIGINT NOT NULL) ENGINE=InnoDB",
        ],
    }
}

/// Runs `sql` on the test database; a query's rows of one integer column.
fn on_db(rt: &tokio::runtime::Runtime, db: &TestDb, sql: &str, select: bool) -> Vec<i64> {
    use sqlx::Connection;
    rt.block_on(async {
        match db.server {
            Db::Postgres => {
                let mut c = sqlx::PgConnection::connect(&db.url).await.expect("postgres");
                if !select {
                    sqlx::raw_sql(sql).execute(&mut c).await.expect(sql);
                    return Vec::new();
                }
                let rows: Vec<(i64,)> = sqlx::query_as(sql).fetch_all(&mut c).await.expect(sql);
                rows.into_iter().map(|r| r.0).collect()
            }
            Db::MySql => {
                let mut c = sqlx::MySqlConnection::connect(&db.url).await.expect("mysql");
                if !select {
                    sqlx::raw_sql(sql).execute(&mut c).await.expect(sql);
                    return Vec::new();
                }
                let rows: Vec<(i64,)> = sqlx::query_as(sql).fetch_all(&mut c).await.expect(sql);
                rows.into_iter().map(|r| r.0).collect()
            }
        }
    })
}

/// Exactly-once steps on real processes and a real database: a job pays
/// once per run in a step (`fenced_step`: `begin_attempt`, then
/// `run_step` inserting into `payments`), and the worker running its first
/// attempt is frozen (SIGSTOP) at each of [`FREEZES`] in turn, on a
/// shared server and two workers. The run is retried on the other worker
/// and succeeds while the frozen one is still stopped — inside the step's
/// transaction, once the database has ended the frozen transaction for
/// idling (`idle` 5 s; the retries meanwhile wait 1 s for the lock and are
/// retried). When the frozen attempt wakes it pays nothing: it reads the
/// retry's record, or finds its connection ended, or had paid first and
/// the retry read its record. Exactly one payment each time. With
/// `control`, a last run without the step (the same freeze inside its
/// transaction) pays twice.
pub fn exactly_once_steps(sdk: Sdk, server: Db, control: bool) {
    let began = std::time::Instant::now();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let db = rt.block_on(TestDb::create(server)).unwrap_or_else(|e| panic!("{e}"));
    for ddl in step_tables(server) {
        on_db(&rt, &db, ddl, false);
    }
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _server = self::server(dir.path(), "server", &format!("sqlite://{}/db.sqlite", dir.path().display()), &addr);
    wait_until("the server to lead", WITHIN, || leads(&addr));
    let notes = dir.path().join("notes.log");
    let env = [("GNOMON_CONFORMANCE_LOG", notes.display().to_string())];
    let ids = [format!("{}-a", sdk.label()), format!("{}-b", sdk.label())];
    let workers: Vec<Proc> = ids.iter().map(|id| sdk.spawn(dir.path(), id, std::slice::from_ref(&addr), &env)).collect();
    for id in &ids {
        wait_worker(&addr, id);
    }
    let c = Ctx { sdk, addr: addr.clone(), token: None };
    let retry = json!({"retry": {"max_attempts": 10, "backoff": {"initial": "200ms", "max": "200ms"}}});
    let noted = || std::fs::read_to_string(&notes).unwrap_or_default();
    let paid = |id: &str| on_db(&rt, &db, &format!("SELECT attempt FROM payments WHERE run_id = '{id}' ORDER BY attempt"), true);
    let label = match server {
        Db::Postgres => "postgres",
        Db::MySql => "mariadb",
    };
    let mut cases: Vec<(&str, bool)> = FREEZES.iter().map(|f| (*f, true)).collect();
    if control {
        cases.push(("in_tx", false));
    }
    for (freeze, guarded) in cases {
        let case = std::time::Instant::now();
        let payload = json!({"dsn": db.url, "pause": freeze, "pause_seconds": 3, "lock_wait": 1, "idle": 5, "guarded": guarded});
        let name = format!("steps-{label}-{freeze}{}", if guarded { "" } else { "-unguarded" });
        let job = c.job(&name, "fenced_step", payload, retry.clone());
        let id = c.trigger(&job, json!({}));
        // The first attempt says where it stopped, and on which worker.
        let (head, tail) = (format!("{id} 1 "), format!(" paused {freeze}"));
        let mut at = String::new();
        wait_until(&format!("attempt 1 of {id} to reach {freeze}"), WITHIN, || {
            at = noted().lines().find(|l| l.starts_with(&head) && l.ends_with(&tail)).unwrap_or_default().to_string();
            !at.is_empty()
        });
        let frozen_id = &at[head.len()..at.len() - tail.len()];
        let k = ids.iter().position(|i| i == frozen_id).unwrap_or_else(|| panic!("no worker {frozen_id}: {at}"));
        let (frozen, other) = (&workers[k], &ids[1 - k]);
        frozen.signal(SIGSTOP);
        let stopped = std::time::Instant::now();
        let run = c.wait_run(&id, "succeeded while attempt 1's worker is frozen", |r| r["state"] == "succeeded");
        let to_success = stopped.elapsed();
        let n = run["attempt"].as_u64().unwrap_or(0);
        assert_eq!(attempt(&run, 1)["state"], "lost", "{run}");
        assert_eq!(attempt(&run, n as usize)["worker"], other.as_str(), "{run}");
        // Attempts between were told the frozen one holds the step's lock.
        for k in 2..n as usize {
            let a = attempt(&run, k);
            assert!(a["state"] == "failed" && a["output"].as_str().unwrap_or("").contains("waited too long for a lock"), "{run}");
        }
        let won_by = if freeze == "after_commit" && guarded { 1 } else { n as i64 };
        let winner = if freeze == "after_commit" && guarded { "recorded" } else { "committed" };
        assert!(noted().contains(&format!("{id} {n} {winner} paid_by={won_by}\n")), "{sdk:?} {label} {freeze}: {}", noted());
        let one = if guarded { vec![won_by] } else { vec![n as i64] };
        assert_eq!(paid(&id), one, "{sdk:?} {label} {freeze}: paid while the first attempt is frozen");
        frozen.signal(SIGCONT);
        let end = match (freeze, guarded) {
            ("before_guard", _) => format!("{id} 1 recorded paid_by={n}\n"),
            ("in_tx", true) => format!("{id} 1 failed: "),
            _ => format!("{id} 1 committed paid_by=1\n"),
        };
        if sdk == Sdk::Rust {
            // The Rust worker drops a stopped attempt's future (its
            // transaction rolls back with its connection) when it learns
            // on waking that the attempt is lost; a timer that fires first
            // lets it end as in the other languages.
            let woke = std::time::Instant::now();
            wait_until(&format!("the frozen attempt of {id} to end or be dropped"), WITHIN, || {
                noted().contains(&end) || (woke.elapsed() > Duration::from_secs(5) && worker_live(None, &addr, frozen_id))
            });
        } else {
            wait_until(&format!("the frozen attempt of {id} to end ({end:?})"), WITHIN, || noted().contains(&end));
        }
        wait_worker(&addr, frozen_id);
        let after = c.run(&id);
        assert_eq!((after["state"].clone(), attempt(&after, 1)["state"].clone()), (json!("succeeded"), json!("lost")), "{after}");
        if guarded {
            assert_eq!(paid(&id), one, "{sdk:?} {label} {freeze}: exactly one payment once the frozen attempt woke");
        } else {
            assert_eq!(paid(&id), [1, n as i64], "{sdk:?} {label}: without the step the frozen attempt pays too");
        }
        eprintln!(
            "{sdk:?} on {label}, frozen {freeze}{}: succeeded on attempt {n} {:.1} s after the freeze; case {:.1} s",
            if guarded { "" } else { " (no step)" },
            to_success.as_secs_f64(),
            case.elapsed().as_secs_f64()
        );
    }
    eprintln!("{sdk:?} on {label}: all cases in {:.1} s", began.elapsed().as_secs_f64());
    drop(workers);
    rt.block_on(db.drop_database());
}

/// A server on TLS (a private CA): an SDK worker trusting the CA, with a
/// worker credential, runs its jobs; one that does not trust it never
/// becomes a session. The API is driven through the CLI (over TLS).
pub fn tls(sdk: Sdk) {
    use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // A name of its own: a leaf whose issuer reads like its subject looks
    // self-signed to OpenSSL-based clients.
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "sdk test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = d.join("ca.pem");
    std::fs::write(&ca_pem, ca_params.self_signed(&ca_key).unwrap().pem()).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let mut leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    leaf.distinguished_name.push(rcgen::DnType::CommonName, "localhost");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_key = KeyPair::generate().unwrap();
    let (cert, key) = (d.join("server.crt"), d.join("server.key"));
    std::fs::write(&cert, leaf.signed_by(&leaf_key, &issuer).unwrap().pem()).unwrap();
    std::fs::write(&key, leaf_key.serialize_pem()).unwrap();
    let (admin, admin_entry) = new_credential("admin-1", &["--role", "admin"]);
    let (worker, worker_entry) = new_credential("worker-1", &["--role", "worker"]);
    let auth = d.join("auth.toml");
    std::fs::write(&auth, format!("{admin_entry}\n\n{worker_entry}")).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let store = format!("sqlite://{}/db.sqlite", d.display());
    let (cert_s, key_s, auth_s, ca_s) =
        (cert.display().to_string(), key.display().to_string(), auth.display().to_string(), ca_pem.display().to_string());
    let args = ["server", "--store", &store, "--listen", &addr, "--auth-file", &auth_s, "--tls-cert", &cert_s, "--tls-key", &key_s]
        .map(String::from);
    let _server = Proc::spawn(d, "server", &args);
    let url = format!("https://{addr}");
    let cli = |args: &[&str]| -> (bool, Value) {
        let out = std::process::Command::new(BIN)
            .args(["--server", &url, "--token", &admin, "--ca", &ca_s, "-o", "json"])
            .args(args)
            .env_remove("GNOMON_TOKEN")
            .output()
            .unwrap();
        (out.status.success(), serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
    };
    wait_until("the TLS server", WITHIN, || cli(&["leader"]).0);
    let (good, untrusting) = (format!("{}-tls", sdk.label()), format!("{}-untrusting", sdk.label()));
    let servers = std::slice::from_ref(&addr);
    let _good = sdk.spawn_with(d, &good, servers, &[], &["--token".into(), worker.clone(), "--ca".into(), ca_s.clone()]);
    // Trusting another CA (the server's leaf as if it were one) is not trusting this one.
    let other = d.join("other-ca.pem");
    let mut other_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    other_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    other_params.distinguished_name.push(rcgen::DnType::CommonName, "another CA");
    std::fs::write(&other, other_params.self_signed(&KeyPair::generate().unwrap()).unwrap().pem()).unwrap();
    let _untrusting =
        sdk.spawn_with(d, &untrusting, servers, &[], &["--token".into(), worker.clone(), "--ca".into(), other.display().to_string()]);
    let listed = |id: &str| {
        cli(&["worker", "list"]).1["workers"].as_array().is_some_and(|ws| ws.iter().any(|w| w["id"] == id && w["state"] == "live"))
    };
    wait_until("the TLS worker to be live", WITHIN, || listed(&good));
    let job = d.join("job.json");
    let spec = json!({"name": "over-tls", "executor": {"handler": {"name": "echo", "payload": {"tls": true}}},
                      "route": {"labels": {"sdk": sdk.label()}}});
    std::fs::write(&job, spec.to_string()).unwrap();
    assert!(cli(&["job", "apply", "-f", job.to_str().unwrap()]).0, "creating the job over TLS");
    let (ok, run) = cli(&["job", "trigger", "over-tls"]);
    assert!(ok, "{run}");
    let id = run["id"].as_str().unwrap_or_else(|| panic!("{run}")).to_string();
    let mut got = Value::Null;
    wait_until("the run to succeed over TLS", WITHIN, || {
        got = cli(&["run", "get", &id]).1;
        got["state"] == "succeeded"
    });
    assert_eq!(attempt(&got, 1)["worker"], good.as_str(), "{got}");
    assert!(!listed(&untrusting), "a worker that does not trust the server's CA is never a session");
}
