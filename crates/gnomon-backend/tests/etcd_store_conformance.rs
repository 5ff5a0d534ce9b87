//! The store conformance suite on the etcd store (3-member cluster on
//! loopback, each test under a cluster name of its own), and the etcd
//! election fencing an etcd store.

use std::sync::Arc;

use gnomon_backend::testing::conformance::{job_spec, store_suite};
use gnomon_backend::testing::testdb::etcd_endpoints;
use gnomon_backend::{open_store, Elector, Store, StoreError};

fn url(cluster: &str) -> String {
    format!("etcd://{}/{cluster}", etcd_endpoints())
}

#[tokio::test]
async fn store_suite_passes_on_etcd() {
    let cluster = format!("store-{:08x}", rand::random::<u32>());
    let u = url(&cluster);
    store_suite(move || {
        let u = u.clone();
        async move { open_store(&u).await.unwrap_or_else(|e| panic!("opening {u}: {e}")) }
    })
    .await;
}

#[tokio::test]
async fn elector_suite_passes_with_the_etcd_store() {
    use gnomon_backend::election::ElectionConfig;
    use gnomon_backend::etcd::EtcdElector;
    let cluster = format!("el-{:08x}", rand::random::<u32>());
    let store: Arc<dyn Store> = open_store(&url(&cluster)).await.expect("open");
    let endpoints = gnomon_backend::etcd::parse_endpoints(&etcd_endpoints()).unwrap();
    let config = ElectionConfig { ttl: std::time::Duration::from_secs(3), ..Default::default() };
    let a = Arc::new(EtcdElector::new(endpoints.clone(), &cluster, store.clone(), config.clone()));
    gnomon_backend::testing::conformance::elector_suite(store.clone(), a.clone()).await;
    // A term whose election key is gone is fenced at once, even before a
    // newer term fences the store.
    let me = gnomon_backend::LeaderInfo { holder: "x".into(), address: "x:1".into(), backend: String::new() };
    let l = a.campaign("gone", &me).await.expect("campaign");
    let fence = gnomon_backend::Fence { scope: "gone".into(), token: l.token };
    store.fire(&fence, &[], &[]).await.expect("the live term writes");
    let mut c = etcd_client::Client::connect(&endpoints, None).await.unwrap();
    c.delete(format!("/gnomon/{cluster}/election/gone/"), Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    let r = store.fire(&fence, &[], &[]).await;
    assert!(matches!(r, Err(StoreError::Fenced { .. })), "a term without its election key is fenced, got {r:?}");
}

#[tokio::test]
async fn bad_etcd_urls_are_refused() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let e = open_store(&format!("etcd://127.0.0.1:{free}")).await.expect_err("unreachable");
    assert!(matches!(e, StoreError::Unavailable(_)) && e.to_string().contains("unreachable"), "{e}");
    for bad in ["etcd://", "etcd://nohost", "etcd://h:1/a b"] {
        assert!(matches!(open_store(bad).await, Err(StoreError::InvalidUrl(_))), "{bad}");
    }
}

#[tokio::test]
async fn retention_deletes_old_terminal_runs_only() {
    use gnomon_backend::{Fence, LeaderInfo, NewRun, Precondition, RunFilter};
    use gnomon_core::RunState;
    let cluster = format!("ret-{:08x}", rand::random::<u32>());
    let store = open_store(&url(&cluster)).await.expect("open");
    let spec = job_spec("kept");
    let job = store.put_job(&spec, Precondition::DoesNotExist, 1).await.unwrap();
    let token = store.next_epoch("scheduler").await.unwrap();
    let fence = Fence { scope: "scheduler".into(), token };
    store.fence(&fence, &LeaderInfo::default(), 1).await.unwrap();
    // 10 runs: 8 terminal (skipped), the newest 2 pending.
    let runs: Vec<NewRun> = (0..10)
        .map(|i| NewRun {
            job_uid: job.uid.clone(),
            namespace: job.namespace.clone(),
            job: job.name.clone(),
            scheduled_at: 1000 * i,
            fired_at: 1000 * i,
            state: if i < 8 { RunState::Skipped } else { RunState::Pending },
            reason: None,
            manual: false,
            key: None,
            params: None,
            payload: None,
            upstream: None,
        })
        .collect();
    store.fire(&fence, &runs, &[]).await.unwrap();
    // Keep the newest 3 per job: 7 terminal runs go, the open ones stay.
    assert_eq!(store.prune(&fence, 3, 0, i64::MAX, 100).await.unwrap(), 7);
    let left = store.list_runs(&RunFilter { job: Some("kept".into()), ..Default::default() }, 100, None).await.unwrap().runs;
    let times: Vec<i64> = left.iter().map(|r| r.scheduled_at).collect();
    assert_eq!(times, vec![9000, 8000, 7000]);
    assert!(store.get_run(&runs[0].id()).await.unwrap().is_none());
    assert_eq!(store.open_runs().await.unwrap().len(), 2);
    // By age: everything terminal fired before 8000 (only 7000 is left).
    assert_eq!(store.prune(&fence, 1000, 8000, i64::MAX, 100).await.unwrap(), 1);
    // Nothing more to do; the size is reported.
    assert_eq!(store.prune(&fence, 0, i64::MAX, i64::MAX, 100).await.unwrap(), 0);
    assert!(store.size_bytes().await.unwrap_or(0) > 0);
    // A stale term may not prune.
    let newer = store.next_epoch("scheduler").await.unwrap();
    store.fence(&Fence { scope: "scheduler".into(), token: newer }, &LeaderInfo::default(), 2).await.unwrap();
    store.fire(&fence, &[], &[]).await.expect_err("stale");
    assert!(matches!(store.prune(&fence, 0, i64::MAX, i64::MAX, 100).await, Err(StoreError::Fenced { .. })));
}

/// Retention counts a job's runs by its uid: two namespaces with a job of
/// the same name, and a job deleted and created again, keep their own
/// counts. Runs written before the uid index existed are indexed by a
/// backfill, then counted.
#[tokio::test]
async fn retention_counts_runs_per_job_not_per_name() {
    use gnomon_backend::{Fence, JobRecord, LeaderInfo, NewRun, Precondition};
    use gnomon_core::RunState;
    let cluster = format!("ret-{:08x}", rand::random::<u32>());
    let store = open_store(&url(&cluster)).await.expect("open");
    let token = store.next_epoch("scheduler").await.unwrap();
    let fence = Fence { scope: "scheduler".into(), token };
    store.fence(&fence, &LeaderInfo::default(), 1).await.unwrap();
    let done = |job: &JobRecord, from: i64, n: i64| -> Vec<NewRun> {
        (from..from + n)
            .map(|i| NewRun {
                job_uid: job.uid.clone(),
                namespace: job.namespace.clone(),
                job: job.name.clone(),
                scheduled_at: 1000 * i,
                fired_at: 1000 * i,
                state: RunState::Skipped,
                reason: None,
                manual: false,
                key: None,
                params: None,
                payload: None,
                upstream: None,
            })
            .collect()
    };
    let a = store.put_job(&job_spec("twin"), Precondition::DoesNotExist, 1).await.unwrap();
    let mut other = job_spec("twin");
    other.namespace = Some("other".into());
    let b = store.put_job(&other, Precondition::DoesNotExist, 1).await.unwrap();
    store.fire(&fence, &done(&a, 0, 5), &[]).await.unwrap();
    store.fire(&fence, &done(&b, 0, 5), &[]).await.unwrap();
    assert_eq!(store.prune(&fence, 5, 0, i64::MAX, 100).await.unwrap(), 0, "5 runs each: nothing beyond 5 per job");
    store.delete_job("default", "twin", Precondition::None).await.unwrap();
    let again = store.put_job(&job_spec("twin"), Precondition::DoesNotExist, 2).await.unwrap();
    store.fire(&fence, &done(&again, 10, 2), &[]).await.unwrap();
    assert_eq!(store.prune(&fence, 5, 0, i64::MAX, 100).await.unwrap(), 0, "the re-created job counts on its own");
    assert_eq!(store.prune(&fence, 4, 0, i64::MAX, 100).await.unwrap(), 2, "one each from the deleted job and the other namespace's");
    // As written before the index existed: no uid index, no marker.
    let endpoints = etcd_endpoints();
    let mut c = etcd_client::Client::connect(endpoints.split(',').collect::<Vec<_>>(), None).await.unwrap();
    let p = format!("/gnomon/{cluster}/");
    c.delete(format!("{p}idx/uid/"), Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    c.delete(format!("{p}meta/uid_index"), None).await.unwrap();
    assert_eq!(store.prune(&fence, 2, 0, i64::MAX, 100).await.unwrap(), 4, "backfilled, then 2 kept of each 4");
    let marker = c.get(format!("{p}meta/uid_index"), None).await.unwrap();
    assert_eq!(marker.kvs()[0].value(), b"done");
    let left = c.get(format!("{p}idx/uid/"), Some(etcd_client::GetOptions::new().with_prefix().with_count_only())).await.unwrap();
    assert_eq!(left.count(), 6, "2 runs of each of the three jobs are indexed");
}

#[tokio::test]
async fn worker_session_leases_live_in_etcd() {
    use gnomon_backend::{Fence, LeaderInfo};
    use std::time::Duration;
    let cluster = format!("ws-{:08x}", rand::random::<u32>());
    let store = open_store(&url(&cluster)).await.expect("open");
    let leases = store.session_leases().expect("etcd keeps session leases");
    let token = store.next_epoch("scheduler").await.unwrap();
    let fence = Fence { scope: "scheduler".into(), token };
    store.fence(&fence, &LeaderInfo::default(), 1).await.unwrap();
    let mut deleted = leases.deletions();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = leases.register(&fence, "wa", Duration::from_secs(10)).await.expect("register wa");
    let b = leases.register(&fence, "wb", Duration::from_secs(1)).await.expect("register wb");
    let live = leases.live().await.unwrap();
    assert!(live.iter().any(|s| s.worker == "wa" && s.lease == a && s.remaining_ms > 5000), "{live:?}");
    assert!(leases.refresh(a).await.unwrap(), "a live lease refreshes");
    // wb is never refreshed: etcd expires it and the watch reports it.
    let (w, l) = tokio::time::timeout(Duration::from_secs(10), deleted.recv()).await.expect("wb's deletion within 10 s").unwrap();
    assert_eq!((w.as_str(), l), ("wb", b));
    assert!(!leases.refresh(b).await.unwrap(), "an expired lease does not refresh");
    // Releasing wa deletes its key too.
    leases.release(a).await.unwrap();
    let (w, l) = tokio::time::timeout(Duration::from_secs(10), deleted.recv()).await.expect("wa's deletion").unwrap();
    assert_eq!((w.as_str(), l), ("wa", a));
    assert!(leases.live().await.unwrap().is_empty());
    // A stale term may not register sessions.
    let newer = store.next_epoch("scheduler").await.unwrap();
    store.fence(&Fence { scope: "scheduler".into(), token: newer }, &LeaderInfo::default(), 2).await.unwrap();
    assert!(matches!(leases.register(&fence, "wc", Duration::from_secs(5)).await, Err(StoreError::Fenced { .. })));
}

#[tokio::test]
async fn job_writes_are_signalled_by_a_watch() {
    use gnomon_backend::Precondition;
    use std::time::Duration;
    let cluster = format!("sig-{:08x}", rand::random::<u32>());
    let a = open_store(&url(&cluster)).await.expect("open");
    let b = open_store(&url(&cluster)).await.expect("open");
    let mut signal = a.job_change_signal().expect("etcd pushes job writes");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spec = job_spec("pushed");
    let seq = a.job_changes(0).await.unwrap().seq;
    b.put_job(&spec, Precondition::DoesNotExist, 1).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), signal.recv()).await.expect("a signal within 5 s").expect("open");
    let changes = a.job_changes(seq).await.unwrap();
    assert_eq!(changes.upserted.len(), 1);
    b.delete_job("default", "pushed", Precondition::None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), signal.recv()).await.expect("a signal for the delete").expect("open");
    assert_eq!(a.job_changes(changes.seq).await.unwrap().deleted.len(), 1);
}

#[tokio::test]
async fn batches_beyond_one_txn_are_split_within_etcds_limits() {
    use gnomon_backend::{AttemptChange, Fence, FireOutcome, JobAdvance, LeaderInfo, NewRun, Precondition, Transition};
    use gnomon_core::{AttemptState, RunState};
    let cluster = format!("big-{:08x}", rand::random::<u32>());
    let store = open_store(&url(&cluster)).await.expect("open");
    let mut jobs = Vec::new();
    for i in 0..5 {
        let spec = job_spec(&format!("big{i}"));
        jobs.push(store.put_job(&spec, Precondition::DoesNotExist, 1).await.unwrap());
    }
    let token = store.next_epoch("scheduler").await.unwrap();
    let fence = Fence { scope: "scheduler".into(), token };
    store.fence(&fence, &LeaderInfo::default(), 1).await.unwrap();
    let runs: Vec<NewRun> = (0..600)
        .map(|i| {
            let j = &jobs[i % 5];
            NewRun {
                job_uid: j.uid.clone(),
                namespace: j.namespace.clone(),
                job: j.name.clone(),
                scheduled_at: 1000 * i as i64,
                fired_at: 1,
                state: RunState::Pending,
                reason: None,
                manual: false,
                key: None,
                params: None,
                payload: None,
                upstream: None,
            }
        })
        .collect();
    let advances: Vec<JobAdvance> = jobs.iter().map(|j| JobAdvance { job_uid: j.uid.clone(), last_scheduled_at: 600_000 }).collect();
    let out = store.fire(&fence, &runs, &advances).await.expect("a 600-run fire");
    assert!(out.iter().all(|o| *o == FireOutcome::Created));
    assert_eq!(store.get_job("default", "big0").await.unwrap().unwrap().last_scheduled_at, Some(600_000));
    // Assign, start and finish all 600 in batches of 600 transitions each.
    let step = |from: RunState, fa: u32, to: RunState, ta: u32, change: &dyn Fn() -> AttemptChange| -> Vec<Transition> {
        runs.iter()
            .map(|r| Transition {
                run_id: r.id(),
                from,
                from_attempt: fa,
                to,
                to_attempt: ta,
                reason: None,
                next_attempt_at: None,
                attempt: Some(change()),
                at: 5,
                notify: Vec::new(),
            })
            .collect()
    };
    let assign = step(RunState::Pending, 0, RunState::Assigned, 1, &|| AttemptChange::Assign { attempt: 1, worker: "w".into(), token });
    assert!(store.transition(&fence, &assign).await.expect("assign").iter().all(|a| *a));
    let start = step(RunState::Assigned, 1, RunState::Running, 1, &|| AttemptChange::Start { attempt: 1 });
    assert!(store.transition(&fence, &start).await.expect("start").iter().all(|a| *a));
    let end = step(RunState::Running, 1, RunState::Succeeded, 1, &|| AttemptChange::End {
        attempt: 1,
        state: AttemptState::Succeeded,
        exit_code: Some(0),
        output: "ok".into(),
        started_at: None,
    });
    assert!(store.transition(&fence, &end).await.expect("end").iter().all(|a| *a));
    assert!(store.open_runs().await.unwrap().is_empty());
    let d = store.get_run(&runs[599].id()).await.unwrap().unwrap();
    assert_eq!((d.run.state, d.attempts.len(), d.attempts[0].state), (RunState::Succeeded, 1, AttemptState::Succeeded));
}

/// A single etcd member of this test's own, serving clients over TLS.
struct TlsMember {
    child: std::process::Child,
}

impl Drop for TlsMember {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sh(dir: &std::path::Path, script: &str) {
    let out = std::process::Command::new("sh").arg("-c").arg(script).current_dir(dir).output().expect("sh");
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn tls_and_credentials_reach_a_secured_member() {
    use gnomon_backend::Precondition;
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A CA, a server certificate for 127.0.0.1 and a client certificate
    // (X.509 v3: rustls refuses v1). The member requires client certificates
    // (etcd 3.4 does once --trusted-ca-file is set).
    sh(
        d,
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-key.pem -out ca.pem -days 2 -subj /CN=gnomon-test-ca 2>/dev/null && \
         printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && \
         openssl req -newkey rsa:2048 -nodes -keyout server-key.pem -out server.csr -subj /CN=127.0.0.1 2>/dev/null && \
         openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -out server.pem -days 2 -extfile san.ext 2>/dev/null && \
         openssl req -newkey rsa:2048 -nodes -keyout client-key.pem -out client.csr -subj /CN=client 2>/dev/null && \
         printf 'extendedKeyUsage=clientAuth\\n' > client.ext && \
         openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -out client.pem -days 2 -extfile client.ext 2>/dev/null",
    );
    let (client, peer) = (free(), free());
    let p = |f: &str| d.join(f).display().to_string();
    let _member = TlsMember {
        child: std::process::Command::new("etcd")
            .args(["--name", "t", "--data-dir", &p("data")])
            .args([
                "--listen-client-urls",
                &format!("https://127.0.0.1:{client}"),
                "--advertise-client-urls",
                &format!("https://127.0.0.1:{client}"),
            ])
            .args([
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args(["--initial-cluster", &format!("t=http://127.0.0.1:{peer}")])
            .args(["--cert-file", &p("server.pem"), "--key-file", &p("server-key.pem"), "--trusted-ca-file", &p("ca.pem")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("etcd (scripts/test.sh installs it)"),
    };
    let tls = format!("etcd://127.0.0.1:{client}/tls?ca={}&cert={}&key={}", p("ca.pem"), p("client.pem"), p("client-key.pem"));
    let mut store = None;
    let mut last = None;
    for _ in 0..150 {
        match open_store(&tls).await {
            Ok(s) => {
                store = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let store = store.unwrap_or_else(|| panic!("the TLS member did not answer within 30 s: {last:?}"));
    let spec = job_spec("secure");
    store.put_job(&spec, Precondition::DoesNotExist, 1).await.expect("a write over TLS");
    assert!(store.get_job("default", "secure").await.unwrap().is_some());
    // Plain HTTP to a TLS member, no client certificate, or a missing CA
    // file: refused, said so.
    assert!(open_store(&format!("etcd://127.0.0.1:{client}/tls")).await.is_err());
    assert!(open_store(&format!("etcd://127.0.0.1:{client}/tls?ca={}", p("ca.pem"))).await.is_err());
    let e = open_store(&format!("etcd://127.0.0.1:{client}/tls?ca={}", p("nope.pem"))).await.expect_err("missing CA file");
    assert!(e.to_string().contains("nope.pem"), "{e}");
    // Credentials: turn on etcd's auth with a root user.
    let ctl = format!(
        "ETCDCTL_API=3 etcdctl --endpoints=https://127.0.0.1:{client} --cacert={} --cert={} --key={}",
        p("ca.pem"),
        p("client.pem"),
        p("client-key.pem")
    );
    sh(d, &format!("{ctl} user add root:rootpw >/dev/null && {ctl} auth enable >/dev/null"));
    let with =
        |cred: &str| format!("etcd://{cred}127.0.0.1:{client}/tls?ca={}&cert={}&key={}", p("ca.pem"), p("client.pem"), p("client-key.pem"));
    let s = open_store(&with("root:rootpw@")).await.expect("the right password");
    assert!(s.get_job("default", "secure").await.unwrap().is_some());
    let e = open_store(&with("root:wrong@")).await.expect_err("a wrong password");
    assert!(e.to_string().contains("authentication failed"), "{e}");
    assert!(!e.to_string().contains("wrong"), "the password is not echoed: {e}");
}

/// The edge index answers `dependents` as a prefix read when it is whole;
/// a writer that does not keep it (a binary from before it) makes the
/// next read answer from the namespace's jobs and rebuild it; a stale
/// entry never makes a wrong answer.
#[tokio::test]
async fn dependents_use_the_edge_index_and_survive_writers_that_do_not_keep_it() {
    use gnomon_core::deps::{AfterEdge, On};
    let cluster = format!("edges-{:08x}", rand::random::<u32>());
    let store = open_store(&url(&cluster)).await.expect("open");
    let p = format!("/gnomon/{cluster}");
    let endpoints = gnomon_backend::etcd::parse_endpoints(&etcd_endpoints()).unwrap();
    let mut raw = etcd_client::Client::connect(endpoints, None).await.expect("raw client");
    let job = |name: &str, after: &[&str]| {
        let mut s = job_spec(name);
        s.namespace = Some("etl".into());
        s.after = after.iter().map(|u| AfterEdge { job: u.to_string(), on: On::Succeeded }).collect();
        s
    };
    let names = |jobs: Vec<gnomon_backend::JobRecord>| jobs.into_iter().map(|j| j.name).collect::<Vec<_>>();
    let revs = |r: etcd_client::GetResponse| r.kvs().first().map_or(0, |kv| kv.mod_revision());
    store.put_job(&job("extract", &[]), gnomon_backend::Precondition::DoesNotExist, 1).await.expect("extract");
    store.put_job(&job("load", &["extract"]), gnomon_backend::Precondition::DoesNotExist, 1).await.expect("load");
    assert_eq!(names(store.dependents("etl", "extract").await.unwrap()), ["load"]);

    // A writer that bumps the graph key but keeps no index: the index is
    // emptied behind the store's back, which a whole index would show.
    raw.delete(format!("{p}/edges/"), Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    raw.put(format!("{p}/graphs/etl"), "", None).await.unwrap();
    // A write while the index is not whole keeps its own entries but does
    // not vouch for the rest.
    store.put_job(&job("audit", &["extract"]), gnomon_backend::Precondition::DoesNotExist, 1).await.expect("audit");
    let graph = revs(raw.get(format!("{p}/graphs/etl"), None).await.unwrap());
    assert_ne!(graph, revs(raw.get(format!("{p}/edge_marks/etl"), None).await.unwrap()), "the mark stays behind");
    // The read answers from the jobs and rebuilds.
    assert_eq!(names(store.dependents("etl", "extract").await.unwrap()), ["audit", "load"]);
    let graph = revs(raw.get(format!("{p}/graphs/etl"), None).await.unwrap());
    assert_eq!(graph, revs(raw.get(format!("{p}/edge_marks/etl"), None).await.unwrap()), "rebuilt and vouched for");
    let entries = raw.get(format!("{p}/edges/etl/extract/"), Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(entries.kvs().len(), 2);

    // Whole, the index is what is read: an entry removed behind the
    // store's back (without the graph key) is missing from the answer.
    raw.delete(format!("{p}/edges/etl/extract/load"), None).await.unwrap();
    assert_eq!(names(store.dependents("etl", "extract").await.unwrap()), ["audit"]);
    store.put_job(&job("load", &["extract"]), gnomon_backend::Precondition::None, 2).await.expect("load again");
    assert_eq!(names(store.dependents("etl", "extract").await.unwrap()), ["audit", "load"]);

    // A stale entry (naming a job that does not run after `extract`, or
    // none) costs a read, not a wrong answer.
    let extract_uid = store.get_job("etl", "extract").await.unwrap().unwrap().uid;
    raw.put(format!("{p}/edges/etl/extract/ghost"), extract_uid, None).await.unwrap();
    raw.put(format!("{p}/edges/etl/extract/gone"), "0000000000000000", None).await.unwrap();
    assert_eq!(names(store.dependents("etl", "extract").await.unwrap()), ["audit", "load"]);
    // Edges dropped and jobs deleted leave the index with them.
    store.put_job(&job("audit", &[]), gnomon_backend::Precondition::None, 2).await.expect("audit drops its edge");
    store.delete_job("etl", "load", gnomon_backend::Precondition::None).await.expect("delete load");
    assert!(store.dependents("etl", "extract").await.unwrap().is_empty());
    let left = raw.get(format!("{p}/edges/etl/extract/"), Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    let left: Vec<String> = left.kvs().iter().map(|kv| kv.key_str().unwrap().rsplit('/').next().unwrap().to_string()).collect();
    assert_eq!(left, ["ghost", "gone"], "only the planted entries remain");
}
