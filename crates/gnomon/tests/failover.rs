//! High availability at process level: three `gnomon server` replicas and
//! two `gnomon worker`s on loopback, with jobs firing every second, for each
//! election backend — etcd (3-member cluster, PostgreSQL store), MySQL
//! `GET_LOCK` and PostgreSQL advisory locks. Each replica reaches its
//! election backend through a TCP proxy the test controls.
//!
//! Every test runs the same four faults against the leader in turn —
//! SIGKILL, SIGSTOP past the TTL then SIGCONT, SIGTERM, and a network
//! black hole between it and the backend — and then checks the whole
//! history: no `(job, scheduled_at)` fired twice, every second of the
//! `fire_all` job fired exactly once (misses caught up), and no run ever had
//! two live attempts.
//!
//! Bounds are generous (shared, noisy machines); the failover *times* are
//! measured by `bench/failover.sh`, not asserted here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gnomon_backend::testing::testdb::{etcd_endpoints, Server as Db, TestDb};
use gnomon_backend::{RunFilter, Store};
use serde_json::{json, Value};

mod common;
use common::*;

#[path = "failover/history.rs"]
mod history;
#[path = "failover/long.rs"]
mod long;

const ELECTION_TTL: &str = "3s";
/// Well above the longest failover (an election TTL, a campaign, the new
/// leader's rebuild and a worker's reconnect): workers keep their attempts
/// through every one. The default for a 3 s election is 10 s (its fence at
/// 7 s); with four clusters of three servers on two cores a partition's
/// hand-over took up to 9 s, so the tests give the workers more.
const LEASE_TTL: &str = "15s";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Backend {
    Etcd,
    MySql,
    Postgres,
    /// The etcd store, with the etcd election in the same cluster.
    EtcdStore,
}

struct Replica {
    id: String,
    port: u16,
    /// The proxies between this replica and its election backend.
    proxies: Vec<Proxy>,
    args: Vec<String>,
    proc: Option<Proc>,
}

impl Replica {
    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

struct Ha {
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    db: Option<TestDb>,
    store: Arc<dyn Store>,
    replicas: Vec<Replica>,
    _workers: Vec<Proc>,
    /// The scheduled seconds the fire_all job must cover, from its first run.
    started: i64,
    /// A backfill asked for before the faults, and its range.
    backfill: Option<(String, i64, i64)>,
    /// This test's keys in the shared etcd cluster, removed at the end.
    etcd_prefix: Option<String>,
    /// The long runs started before the faults.
    long_runs: Vec<String>,
}

/// `url` with its host:port replaced by `addr`.
fn via(url: &str, addr: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (creds, hostpath) = match rest.split_once('@') {
        Some((c, h)) => (format!("{c}@"), h),
        None => (String::new(), rest),
    };
    let path = hostpath.split_once('/').map(|(_, p)| p).unwrap_or("");
    format!("{scheme}://{creds}{addr}/{path}")
}

fn host_port(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    let hostpath = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
    hostpath.split('/').next().unwrap().to_string()
}

impl Ha {
    fn start(backend: Backend) -> Ha {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cluster = format!("failover-{:08x}", rand_u32());
        let db = match backend {
            Backend::EtcdStore => None,
            Backend::MySql => Some(rt.block_on(TestDb::create(Db::MySql)).unwrap_or_else(|e| panic!("{e}"))),
            Backend::Etcd | Backend::Postgres => Some(rt.block_on(TestDb::create(Db::Postgres)).unwrap_or_else(|e| panic!("{e}"))),
        };
        let store_url = match &db {
            Some(db) => db.url.clone(),
            None => format!("etcd://{}/{cluster}", etcd_endpoints()),
        };
        let store = rt.block_on(gnomon_backend::open_store(&store_url)).expect("open the test store");
        let mut replicas = Vec::new();
        for i in 1..=3 {
            let port = free_port();
            let mut args: Vec<String> = vec![
                "server".into(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--node-id".into(),
                format!("s{i}"),
                "--lease-ttl".into(),
                LEASE_TTL.into(),
                "--election-ttl".into(),
                ELECTION_TTL.into(),
                "--store-connect-timeout".into(),
                "2s".into(),
                // The checks read the whole history (a 2,000-run burst of
                // one job among it): keep every run.
                "--retain-runs".into(),
                "1000000".into(),
            ];
            let etcd_proxies = || -> (Vec<Proxy>, String) {
                let members: Vec<Proxy> =
                    etcd_endpoints().split(',').map(|e| Proxy::start(e.trim().trim_start_matches("http://").to_string())).collect();
                let list: Vec<String> = members.iter().map(|p| p.addr()).collect();
                (members, list.join(","))
            };
            let proxies = match backend {
                Backend::Etcd => {
                    let (members, list) = etcd_proxies();
                    args.extend(["--store".into(), store_url.clone(), "--etcd".into(), list, "--cluster".into(), cluster.clone()]);
                    members
                }
                Backend::EtcdStore => {
                    let (members, list) = etcd_proxies();
                    args.extend(["--store".into(), format!("etcd://{list}/{cluster}")]);
                    members
                }
                Backend::MySql | Backend::Postgres => {
                    let p = Proxy::start(host_port(&store_url));
                    args.extend(["--store".into(), via(&store_url, &p.addr())]);
                    vec![p]
                }
            };
            replicas.push(Replica { id: format!("s{i}"), port, proxies, args, proc: None });
        }
        let etcd_prefix = matches!(backend, Backend::Etcd | Backend::EtcdStore).then(|| format!("/gnomon/{cluster}/"));
        let mut ha =
            Ha { dir, rt, db, store, replicas, _workers: Vec::new(), started: 0, backfill: None, etcd_prefix, long_runs: Vec::new() };
        for i in 0..3 {
            ha.start_replica(i);
        }
        let servers: Vec<String> = ha.replicas.iter().map(Replica::addr).collect();
        for w in ["wa", "wb"] {
            let data = ha.dir.path().join(w);
            let args: Vec<String> =
                // The long job is a shell job; the tests run as root.
                ["--server", &servers.join(","), "worker", "--id", w, "--capacity", "16", "--data-dir", data.to_str().unwrap(), "--allow-root-jobs"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
            ha._workers.push(Proc::spawn(ha.dir.path(), w, &args));
        }
        ha.leader(Duration::from_secs(60));
        ha
    }

    fn start_replica(&mut self, i: usize) {
        let r = &mut self.replicas[i];
        r.proc = Some(Proc::spawn_env(self.dir.path(), &r.id, &r.args, &[(HOOK_ENV.into(), HOOK_SECRET.into())]));
        let addr = r.addr();
        wait_until(&format!("{} to answer", r.id), Duration::from_secs(60), || http(&addr, "GET", "/v1/leader", None).is_ok());
    }

    fn api(&self, i: usize, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let bytes = body.map(|b| serde_json::to_vec(&b).unwrap());
        http(&self.replicas[i].addr(), method, path, bytes.as_deref()).unwrap_or((0, Value::Null))
    }

    /// The index of the replica that says it leads (exactly one), waiting up to `timeout`.
    fn leader(&self, timeout: Duration) -> usize {
        let mut found = None;
        wait_until("exactly one replica to lead", timeout, || {
            let leading: Vec<usize> = (0..3)
                .filter(|&i| self.replicas[i].proc.is_some())
                .filter(|&i| self.api(i, "GET", "/v1/leader", None).1["is_self"] == json!(true))
                .collect();
            found = (leading.len() == 1).then(|| leading[0]);
            found.is_some()
        });
        found.unwrap()
    }

    fn token(&self, i: usize) -> u64 {
        self.api(i, "GET", "/v1/leader", None).1["token"].as_u64().unwrap_or(0)
    }

    /// Waits for a replica other than `old` to lead, with a token above `old_token`.
    fn new_leader(&self, old: usize, old_token: u64, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let l = self.leader(deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1)));
            if l != old {
                let t = self.token(l);
                assert!(t > old_token, "the new term's token {t} is not above the old {old_token}");
                return l;
            }
            assert!(Instant::now() < deadline, "no other replica took over within {timeout:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn runs(&self, job: &str) -> Vec<gnomon_backend::RunRecord> {
        let filter = RunFilter { job: Some(job.into()), ..Default::default() };
        let mut out = Vec::new();
        let mut cursor = None;
        loop {
            let page = self.rt.block_on(self.store.list_runs(&filter, 1000, cursor)).expect("list runs");
            out.extend(page.runs);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return out,
            }
        }
    }

    /// Waits until some run was fired after `t` (by whoever leads now).
    fn wait_fire_after(&self, t: i64, timeout: Duration) {
        wait_until("a fire by the new leader", timeout, || self.runs("every-second").iter().any(|r| r.fired_at > t));
    }

    fn metric(&self, i: usize, name: &str) -> f64 {
        let Ok(text) = raw_get(&self.replicas[i].addr(), "/metrics") else { return -1.0 };
        text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
    }

    fn create_jobs(&mut self) {
        let l = self.leader(Duration::from_secs(30));
        for (name, misfire) in [("every-second", "fire_all"), ("every-second-once", "fire_once")] {
            let (code, body) = self.api(
                l,
                "POST",
                "/v1/jobs",
                Some(json!({"name": name, "schedule": {"every": "1s"}, "misfire": misfire, "catchup_window": "10m",
                            "executor": {"handler": {"name": "noop"}},
                            "retry": {"max_attempts": 5, "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0, "jitter": 0}}})),
            );
            assert_eq!(code, 201, "{body}");
        }
        // A manual-only job: a burst of it keeps a leader busy writing. It
        // takes webhook calls too.
        let burst =
            json!({"name": "burst", "executor": {"handler": {"name": "noop"}}, "triggers": {"webhook": {"secret": HOOK_SECRET_NAME}}});
        let (code, body) = self.api(l, "POST", "/v1/jobs", Some(burst));
        assert_eq!(code, 201, "{body}");
        // A dependency job: each run of every-second releases its run of
        // the same instant, through every fault.
        let after = json!({"name": "after-second", "after": [{"job": "every-second", "on": "any"}], "executor": {"handler": {"name": "noop"}},
                           "retry": {"max_attempts": 5, "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0, "jitter": 0}}});
        let (code, body) = self.api(l, "POST", "/v1/jobs", Some(after));
        assert_eq!(code, 201, "{body}");
        wait_until("the jobs to fire", Duration::from_secs(30), || self.runs("every-second").len() >= 3);
        self.started = self.runs("every-second").iter().map(|r| r.scheduled_at).min().unwrap();
        // A backfill of the 80 s before every-second-once was created, at 2
        // instants a second: it runs through the first faults.
        let to = self.started - 5_000;
        let from = to - 79_000;
        let iso = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let body = json!({"from": iso(from), "to": iso(to), "rate": 2});
        let (code, b) = self.api(l, "POST", "/v1/jobs/every-second-once/backfill", Some(body));
        assert_eq!(code, 201, "{b}");
        self.backfill = Some((b["id"].as_str().unwrap().to_string(), from, to));
    }

    /// `POST /v1/jobs/burst/trigger` with an idempotency key on replica
    /// `i` (a follower forwards it to the leader): (status, run id).
    fn trigger_keyed(&self, i: usize, key: &str) -> (u16, Option<String>) {
        let res = http_with(None, &self.replicas[i].addr(), "POST", "/v1/jobs/burst/trigger", &[("Idempotency-Key", key)], None);
        let (code, body) = res.unwrap_or((0, Value::Null));
        if !matches!(code, 200 | 201) {
            eprintln!("keyed trigger {key} on replica {i}: {code} {body}");
        }
        (code, body["id"].as_str().map(str::to_string))
    }

    /// A webhook call of `burst` on replica `i`, timestamped `ts`, with
    /// `body`: (status, error code or run id).
    fn hook_call(&self, i: usize, ts: i64, body: &str) -> (u16, Option<String>) {
        let (ts_text, sig) = (ts.to_string(), sign(HOOK_SECRET, "default", "burst", ts, "", body.as_bytes()));
        let headers = [("Gnomon-Timestamp", ts_text.as_str()), ("Gnomon-Signature", sig.as_str())];
        let res = http_with(None, &self.replicas[i].addr(), "POST", "/v1/hooks/default/burst", &headers, Some(body.as_bytes()));
        let (code, body) = res.unwrap_or((0, Value::Null));
        (code, body["id"].as_str().or(body["error"]["code"].as_str()).map(str::to_string))
    }

    /// SIGKILL the leader; an idempotency key answered before the kill,
    /// and one sent while it dies, are repeated to the two other replicas
    /// and name the same one run there; so are webhook calls, whose
    /// replays are refused.
    fn sigkill(&mut self) {
        let old = self.leader(Duration::from_secs(30));
        let token = self.token(old);
        let others: Vec<usize> = (0..3).filter(|&i| i != old).collect();
        let (code, before) = self.trigger_keyed(others[0], "before-the-kill");
        assert_eq!(code, 201, "a keyed trigger through a follower");
        let hook_ts = now_ms();
        let (code, hooked) = self.hook_call(others[0], hook_ts, r#"{"event":"before-the-kill"}"#);
        assert_eq!(code, 201, "a webhook call through a follower: {hooked:?}");
        let t0 = now_ms();
        let mut p = self.replicas[old].proc.take().unwrap();
        p.signal(SIGKILL);
        // Sent during the failover: answered or refused, never two runs.
        let (during_code, during) = self.trigger_keyed(others[0], "during-the-kill");
        let (hook_during_code, _) = self.hook_call(others[0], t0, r#"{"event":"during-the-kill"}"#);
        p.wait_exit(Duration::from_secs(10));
        let new = self.new_leader(old, token, Duration::from_secs(30));
        self.wait_fire_after(t0, Duration::from_secs(30));
        eprintln!("SIGKILL: {} -> {} after {} ms", self.replicas[old].id, self.replicas[new].id, now_ms() - t0);
        let mut created = usize::from(during_code == 201);
        for &i in &others {
            let mut answer = (0, None);
            wait_until("a keyed trigger to be answered", Duration::from_secs(30), || {
                answer = self.trigger_keyed(i, "before-the-kill");
                answer.0 != 0 && answer.0 != 503
            });
            assert_eq!(answer, (200, before.clone()), "{}: the key's run from the old term", self.replicas[i].id);
            let again = self.trigger_keyed(i, "during-the-kill");
            assert!(matches!(again.0, 200 | 201), "{}: {again:?}", self.replicas[i].id);
            created += usize::from(again.0 == 201);
            if during_code == 201 {
                assert_eq!(again, (200, during.clone()), "{}: the run the dying leader answered", self.replicas[i].id);
            }
        }
        assert!(created <= 1, "at most one answer created the run sent during the kill");
        // The webhook calls, replayed to both: the one answered before the
        // kill is refused as a replay; the one sent during it started at
        // most one run.
        let mut hook_created = usize::from(hook_during_code == 201);
        for &i in &others {
            let replay = self.hook_call(i, hook_ts, r#"{"event":"before-the-kill"}"#);
            assert_eq!(replay, (409, Some("webhook_replayed".into())), "{}: a replay", self.replicas[i].id);
            let again = self.hook_call(i, t0, r#"{"event":"during-the-kill"}"#);
            assert!(again.0 == 201 || again == (409, Some("webhook_replayed".into())), "{}: {again:?}", self.replicas[i].id);
            hook_created += usize::from(again.0 == 201);
        }
        assert!(hook_created <= 1, "at most one answer started the run of the call sent during the kill");
        let names = |r: &gnomon_backend::RunRecord| {
            ["before-the-kill", "during-the-kill"].iter().any(|k| r.id == gnomon_backend::keyed_run_id(&r.job_uid, k))
        };
        let keyed: Vec<String> = self.runs("burst").into_iter().filter(|r| r.manual && r.id.contains("-k")).map(|r| r.id).collect();
        assert_eq!(keyed.len(), 4, "one run per idempotency key or webhook call, and no other keyed run: {keyed:?}");
        assert!(self.runs("burst").iter().filter(|r| names(r)).count() == 2);
        self.start_replica(old);
    }

    /// SIGSTOP the leader past its TTL, let another take over, SIGCONT it.
    /// Returns the old leader's fencing rejections after it stepped down.
    fn sigstop_once(&mut self, busy: bool) -> f64 {
        let old = self.leader(Duration::from_secs(30));
        let token = self.token(old);
        let before = self.metric(old, "gnomon_fencing_rejections_total");
        if busy {
            // Pause it while it is busy dispatching a burst and writing its
            // results, as a GC pause or an overloaded host would.
            let (code, body) = self.api(old, "POST", "/v1/jobs/burst/trigger?count=2000", None);
            assert!(code < 300, "{body}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let t0 = now_ms();
        let p = self.replicas[old].proc.take().unwrap();
        p.signal(SIGSTOP);
        let new = self.new_leader(old, token, Duration::from_secs(40));
        self.wait_fire_after(t0, Duration::from_secs(30));
        // Let the new term fire for a while, then wake the old leader into it.
        std::thread::sleep(Duration::from_secs(2));
        p.signal(SIGCONT);
        self.replicas[old].proc = Some(p);
        let addr = self.replicas[old].addr();
        wait_until("the old leader to step down", Duration::from_secs(20), || {
            http(&addr, "GET", "/v1/leader", None).is_ok_and(|(_, v)| v["is_self"] == json!(false))
                && self.metric(old, "gnomon_is_leader") == 0.0
        });
        assert_eq!(self.leader(Duration::from_secs(10)), new, "leadership stays with the new leader");
        let rejected = self.metric(old, "gnomon_fencing_rejections_total") - before;
        eprintln!(
            "SIGSTOP{}: {} -> {}; {rejected} stale writes fenced",
            if busy { " (busy)" } else { "" },
            self.replicas[old].id,
            self.replicas[new].id
        );
        rejected
    }

    /// A woken leader must step down and leave the history clean; whether
    /// it writes at all before its elector tells it that it lost is a race
    /// (it now drops a step in flight the moment the verdict arrives), and a
    /// write it does make must be fenced. Both pauses (idle and busy) run;
    /// [`Ha::fence_out`] proves the fence end to end deterministically.
    fn sigstop(&mut self) {
        let fenced = self.sigstop_once(false) + self.sigstop_once(true);
        eprintln!("SIGSTOP: {fenced} stale writes fenced in 2 pauses");
    }

    /// A newer term fences the store while the leader still holds its lock
    /// and has not been told: its next write is rejected (counted in
    /// `gnomon_fencing_rejections_total`), it steps down, and a later term
    /// leads. Store-epoch tokens (the MySQL and PostgreSQL locks) only.
    fn fence_out(&mut self) {
        let old = self.leader(Duration::from_secs(30));
        let token = self.token(old);
        let before = self.metric(old, "gnomon_fencing_rejections_total");
        let scope = gnomon_server::node::SCOPE;
        let intruder = self.rt.block_on(async {
            let t = self.store.next_epoch(scope).await.expect("next_epoch");
            let info = gnomon_backend::LeaderInfo { holder: "intruder".into(), address: "127.0.0.1:1".into(), backend: "test".into() };
            self.store.fence(&gnomon_backend::Fence { scope: scope.into(), token: t }, &info, now_ms()).await.expect("fence");
            t
        });
        assert!(intruder > token);
        wait_until("the fenced-out leader's write to be rejected", Duration::from_secs(30), || {
            self.metric(old, "gnomon_fencing_rejections_total") > before
        });
        // It stepped down; whoever leads next has a token above the intruder's.
        wait_until("a term above the intruder's", Duration::from_secs(30), || {
            (0..3).filter(|&i| self.replicas[i].proc.is_some()).any(|i| {
                let (_, v) = self.api(i, "GET", "/v1/leader", None);
                v["is_self"] == json!(true) && v["token"].as_u64().is_some_and(|t| t > intruder)
            })
        });
        let t0 = now_ms();
        self.wait_fire_after(t0, Duration::from_secs(30));
        eprintln!(
            "fence-out: token {token} fenced by {intruder}; {} rejections",
            self.metric(old, "gnomon_fencing_rejections_total") - before
        );
    }

    /// The database ends every gnomon connection (a failover, an
    /// administrator), twice, while the leader is busy with a burst: the
    /// election lock goes with its connection, so leadership may move, and
    /// writes in flight have unknown outcomes. Afterwards whoever leads
    /// fires again and the whole burst ends.
    fn kill_db_connections(&mut self) {
        let l = self.leader(Duration::from_secs(30));
        let (code, body) = self.api(l, "POST", "/v1/jobs/burst/trigger?count=2000", None);
        assert!(code < 300, "{body}");
        std::thread::sleep(Duration::from_millis(150));
        let db = self.db.as_ref().expect("a database backend");
        for round in 1..=2 {
            let killed = self.rt.block_on(db.kill_connections()).unwrap_or_else(|e| panic!("{e}"));
            eprintln!("database: round {round}: {killed} connections ended");
            std::thread::sleep(Duration::from_millis(1500));
        }
        let t0 = now_ms();
        self.wait_fire_after(t0, Duration::from_secs(60));
        wait_until("every burst run to end", Duration::from_secs(120), || {
            let runs = self.runs("burst");
            runs.len() >= 2000 && runs.iter().all(|r| r.state.is_terminal())
        });
        eprintln!("database connections killed: fires resumed and the burst ended");
    }

    fn sigterm(&mut self) {
        let old = self.leader(Duration::from_secs(30));
        let token = self.token(old);
        let t0 = Instant::now();
        let mut p = self.replicas[old].proc.take().unwrap();
        p.signal(SIGTERM);
        let new = self.new_leader(old, token, Duration::from_secs(20));
        let took = t0.elapsed();
        assert!(p.wait_exit(Duration::from_secs(30)).is_some(), "SIGTERM makes the server exit");
        let log = p.log();
        assert!(log.contains("resigning"), "the leader resigned on SIGTERM:\n{log}");
        eprintln!("SIGTERM: {} -> {} after {took:?}", self.replicas[old].id, self.replicas[new].id);
        self.start_replica(old);
    }

    fn partition(&mut self) {
        let old = self.leader(Duration::from_secs(30));
        let token = self.token(old);
        let t0 = now_ms();
        for p in &self.replicas[old].proxies {
            p.blackhole();
        }
        let new = self.new_leader(old, token, Duration::from_secs(40));
        let addr = self.replicas[old].addr();
        wait_until("the cut-off leader to step down", Duration::from_secs(30), || self.metric(old, "gnomon_is_leader") == 0.0);
        self.wait_fire_after(t0, Duration::from_secs(30));
        for p in &self.replicas[old].proxies {
            p.restore();
        }
        // Reconnected, it follows.
        std::thread::sleep(Duration::from_secs(3));
        assert!(http(&addr, "GET", "/v1/leader", None).is_ok_and(|(_, v)| v["is_self"] == json!(false)));
        eprintln!("partition: {} -> {} after {} ms", self.replicas[old].id, self.replicas[new].id, now_ms() - t0);
    }
}

impl Drop for Ha {
    fn drop(&mut self) {
        if std::thread::panicking() {
            dump_logs(self.dir.path());
        }
        for r in &mut self.replicas {
            r.proc = None;
        }
        self._workers.clear();
        if let Some(db) = self.db.take() {
            self.rt.block_on(db.drop_database());
        }
        if let Some(prefix) = self.etcd_prefix.take() {
            self.rt.block_on(delete_etcd_prefix(&prefix));
        }
    }
}

fn failover_suite(backend: Backend) {
    let mut ha = Ha::start(backend);
    ha.create_jobs();
    ha.create_long_job();
    // Each fault starts with long attempts running: none may end early.
    ha.start_long(2);
    ha.sigkill();
    ha.start_long(2);
    ha.sigstop();
    if matches!(backend, Backend::MySql | Backend::Postgres) {
        ha.start_long(2);
        ha.fence_out();
        ha.start_long(2);
        ha.kill_db_connections();
    }
    ha.start_long(2);
    ha.sigterm();
    ha.start_long(2);
    ha.partition();
    ha.pause_workers();
    // Let the last catch-up land, then check everything that happened.
    std::thread::sleep(Duration::from_secs(16));
    ha.check_history();
    ha.check_long_runs();
}

/// The secret of the `burst` job's webhook, in every replica's environment.
const HOOK_ENV: &str = "GNOMON_HOOK_SECRET_FAILOVER";
const HOOK_SECRET_NAME: &str = "failover";
const HOOK_SECRET: &str = "failover-hook-secret";

#[test]
fn failover_with_etcd_election() {
    failover_suite(Backend::Etcd);
}

#[test]
fn failover_on_the_etcd_store() {
    failover_suite(Backend::EtcdStore);
}

#[test]
fn failover_with_mysql_get_lock() {
    failover_suite(Backend::MySql);
}

#[test]
fn failover_with_postgres_advisory_lock() {
    failover_suite(Backend::Postgres);
}
