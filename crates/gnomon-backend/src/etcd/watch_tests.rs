//! The watches and the write retry against real etcd: the shared 3-member
//! cluster (`scripts/etcd.sh`, each test under a prefix of its own) where
//! the test only reads and writes, a private 3-member cluster
//! ([`super::test_cluster`]) where it stops a member, compacts the history
//! or needs frequent progress notifications.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, CompactionOptions, DeleteOptions, GetOptions, Txn, TxnOp, WatchOptions};
use tokio::sync::{oneshot, watch};

use super::election::watch_leadership;
use super::retry::{never_sent, send_write_with, WRITES};
use super::test_cluster::EtcdCluster;
use super::watching::{Next, Resumable, WatchStats};
use super::{connect, parse_endpoints};

/// Generous: the machine running the tests may be busy.
const WITHIN: Duration = Duration::from_secs(30);

fn shared_endpoints() -> Vec<String> {
    parse_endpoints(&crate::testing::testdb::etcd_endpoints()).expect("GNOMON_TEST_ETCD")
}

async fn client(endpoints: &[String]) -> Client {
    connect(endpoints, Duration::from_secs(10)).await.unwrap_or_else(|e| panic!("etcd at {endpoints:?}: {e}"))
}

fn unique(what: &str) -> String {
    format!("/gnomon-test/{what}-{:08x}/", rand::random::<u32>())
}

async fn put(c: &mut Client, key: String) -> i64 {
    c.put(key, "v", None).await.expect("put").header().expect("header").revision()
}

/// Answers the watch's first [`Next::Reload`] with a read of `prefix`.
async fn first_read(w: &mut Resumable, c: &mut Client, prefix: &str) {
    assert!(matches!(tokio::time::timeout(WITHIN, w.next()).await, Ok(Next::Reload)), "a new watch asks for a full read first");
    let r = c.get(prefix, Some(GetOptions::new().with_prefix().with_count_only())).await.expect("read");
    w.reloaded(r.header().expect("header").revision());
}

/// Takes events until `seen` holds `n` (key, revision) pairs.
async fn collect(w: &mut Resumable, seen: &mut Vec<(String, i64)>, n: usize) {
    while seen.len() < n {
        match tokio::time::timeout(WITHIN, w.next()).await {
            Ok(Next::Events(events)) => {
                for e in events {
                    let kv = e.kv().expect("kv");
                    seen.push((kv.key_str().expect("utf-8").to_string(), kv.mod_revision()));
                }
            }
            Ok(Next::Reload) => panic!("no compaction here: the watch must resume, not reload"),
            Err(_) => panic!("only {} of {n} events within {WITHIN:?}; the last: {:?}", seen.len(), seen.last()),
        }
    }
}

/// Every key `prefix`k00.. once, in order, at increasing revisions; and
/// nothing more arrives.
async fn assert_each_once_in_order(w: &mut Resumable, seen: &[(String, i64)], prefix: &str, n: usize) {
    let keys: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
    let want: Vec<String> = (0..n).map(|i| format!("{prefix}k{i:02}")).collect();
    assert_eq!(keys, want, "every key exactly once, in order");
    assert!(seen.windows(2).all(|p| p[0].1 < p[1].1), "revisions increase: {seen:?}");
    if let Ok(extra) = tokio::time::timeout(Duration::from_secs(1), w.next()).await {
        panic!("nothing more was written, yet the watch handed out {extra:?}");
    }
}

#[tokio::test]
async fn a_cut_watch_resumes_from_the_next_revision_and_misses_nothing() {
    let endpoints = shared_endpoints();
    let mut writer = client(&endpoints).await;
    let p = unique("cut");
    let stats = Arc::new(WatchStats::default());
    let mut w = Resumable::new(client(&endpoints).await, p.clone(), WatchOptions::new().with_prefix(), stats.clone(), "test");
    first_read(&mut w, &mut writer, &p).await;
    let mut seen = Vec::new();
    // Each cut drops a stream that already holds the next phase's events.
    for (from, to) in [(0, 10), (10, 25), (25, 40)] {
        for i in from..to {
            put(&mut writer, format!("{p}k{i:02}")).await;
        }
        collect(&mut w, &mut seen, to).await;
        stats.cut();
    }
    assert_each_once_in_order(&mut w, &seen, &p, 40).await;
    assert!(stats.opened() >= 3, "the cuts re-opened the watch: {} streams", stats.opened());
    assert_eq!(stats.reloads(), 0);
    assert_eq!(stats.revision(), seen.last().expect("events").1);
    writer.delete(p, Some(DeleteOptions::new().with_prefix())).await.expect("clean up");
}

#[tokio::test]
async fn a_catching_up_watch_resumes_after_its_last_event_not_its_header() {
    // etcd hands a watch that starts in the past its history in batches of
    // at most 1000 revisions, each headed by the current revision: a watch
    // resuming from a batch's header would skip the rest.
    let endpoints = shared_endpoints();
    let p = unique("catch-up");
    let n = 1300;
    let mut c = client(&endpoints).await;
    let before = c.get(p.as_str(), Some(GetOptions::new().with_prefix().with_count_only())).await.expect("read");
    let start = before.header().expect("header").revision();
    let mut writers = Vec::new();
    for t in 0..10 {
        let (endpoints, p) = (endpoints.clone(), p.clone());
        writers.push(tokio::spawn(async move {
            let mut c = client(&endpoints).await;
            for i in (t..n).step_by(10) {
                put(&mut c, format!("{p}k{i:04}")).await;
            }
        }));
    }
    for w in writers {
        w.await.expect("writer");
    }
    let stats = Arc::new(WatchStats::default());
    let options = WatchOptions::new().with_prefix();
    let mut w = Resumable::new(client(&endpoints).await, p.clone(), options, stats.clone(), "test").starting_at(start);
    let mut seen = Vec::new();
    collect(&mut w, &mut seen, 1).await;
    assert!(seen.len() <= 1000, "the history comes in batches: {} events in the first", seen.len());
    stats.cut();
    collect(&mut w, &mut seen, n).await;
    let mut keys: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), n, "every key once");
    assert!(seen.windows(2).all(|p| p[0].1 < p[1].1), "revisions increase");
    assert!(stats.opened() >= 2);
    c.delete(p, Some(DeleteOptions::new().with_prefix())).await.expect("clean up");
}

#[tokio::test]
async fn a_watch_resumes_without_loss_when_its_member_restarts() {
    let mut cluster = EtcdCluster::start(3).await;
    // The watch talks to one follower only (stopping it elects no one);
    // the writer to the others.
    let f = cluster.a_follower().await;
    let mut writer = client(&cluster.endpoints_but(f)).await;
    let p = unique("restart");
    let stats = Arc::new(WatchStats::default());
    let options = WatchOptions::new().with_prefix();
    let mut w = Resumable::new(client(&[cluster.endpoint(f)]).await, p.clone(), options, stats.clone(), "test");
    first_read(&mut w, &mut writer, &p).await;
    let mut seen = Vec::new();
    for i in 0..10 {
        put(&mut writer, format!("{p}k{i:02}")).await;
    }
    collect(&mut w, &mut seen, 10).await;
    cluster.stop(f);
    for i in 10..25 {
        put(&mut writer, format!("{p}k{i:02}")).await;
    }
    cluster.restart(f).await;
    collect(&mut w, &mut seen, 25).await;
    for i in 25..40 {
        put(&mut writer, format!("{p}k{i:02}")).await;
    }
    collect(&mut w, &mut seen, 40).await;
    assert_each_once_in_order(&mut w, &seen, &p, 40).await;
    assert!(stats.opened() >= 2, "the watch re-opened after its member came back");
    assert_eq!(stats.reloads(), 0);
}

/// Writes under `p` and elsewhere, then compacts the history up to now.
async fn churn_and_compact(c: &mut Client, p: &str) -> i64 {
    for i in 0..5 {
        put(c, format!("{p}churn{i}")).await;
        put(c, format!("/gnomon-test/elsewhere/{i}")).await;
    }
    let now = put(c, format!("{p}b")).await;
    c.compact(now, Some(CompactionOptions::new().with_physical())).await.expect("compact");
    now
}

#[tokio::test]
async fn a_compacted_start_revision_falls_back_to_a_full_read() {
    let cluster = EtcdCluster::start(3).await;
    let mut c = client(&cluster.endpoints()).await;
    let p = unique("compacted");
    let start = put(&mut c, format!("{p}a")).await;
    let compacted = churn_and_compact(&mut c, &p).await;
    let stats = Arc::new(WatchStats::default());
    let options = WatchOptions::new().with_prefix();
    let mut w = Resumable::new(client(&cluster.endpoints()).await, p.clone(), options, stats.clone(), "test").starting_at(start);
    assert!(matches!(tokio::time::timeout(WITHIN, w.next()).await, Ok(Next::Reload)), "a compacted start asks for a full read");
    assert_eq!(stats.reloads(), 1);
    // The full read: the current state, at a fresh revision.
    let r = c.get(p.as_str(), Some(GetOptions::new().with_prefix())).await.expect("read");
    let keys: Vec<&str> = r.kvs().iter().map(|kv| kv.key_str().expect("utf-8")).collect();
    assert_eq!(keys.len(), 7, "a, b and 5 churn keys: {keys:?}");
    let read_at = r.header().expect("header").revision();
    assert!(read_at >= compacted);
    w.reloaded(read_at);
    // It watches from after that read: the next write, once.
    let c_rev = put(&mut c, format!("{p}c")).await;
    match tokio::time::timeout(WITHIN, w.next()).await {
        Ok(Next::Events(e)) => {
            let got: Vec<(String, i64)> =
                e.iter().filter_map(|e| e.kv()).map(|kv| (kv.key_str().unwrap().to_string(), kv.mod_revision())).collect();
            assert_eq!(got, vec![(format!("{p}c"), c_rev)]);
        }
        other => panic!("expected the write after the read, got {other:?}"),
    }
    // No loop: in 2 s idle the watch neither re-opens nor reloads.
    assert!(tokio::time::timeout(Duration::from_secs(2), w.next()).await.is_err());
    // (A re-watch looping on the compacted revision opens ~5 a second; a
    // third open allows for one stream broken by a busy machine.)
    assert_eq!(stats.reloads(), 1);
    assert!((2..=3).contains(&stats.opened()), "one compacted open, one after the read: {}", stats.opened());
}

#[tokio::test]
async fn the_election_watch_reads_its_key_after_compaction_instead_of_looping() {
    let cluster = EtcdCluster::start(3).await;
    let mut c = client(&cluster.endpoints()).await;
    let p = unique("election");
    let key = format!("{p}leader");
    let created = put(&mut c, key.clone()).await;
    churn_and_compact(&mut c, &p).await;
    let start = |created: i64| {
        let (alive_tx, alive_rx) = watch::channel(true);
        let (lost_tx, lost_rx) = watch::channel(false);
        let (stop_tx, stop_rx) = oneshot::channel();
        let stats = Arc::new(WatchStats::default());
        let endpoints = cluster.endpoints();
        let (k, s) = (key.clone(), stats.clone());
        tokio::spawn(async move {
            let c = client(&endpoints).await;
            watch_leadership(c, k.into_bytes(), created, alive_rx, lost_tx, stop_rx, s).await
        });
        (alive_tx, lost_rx, stop_tx, stats)
    };
    // The key is still ours: the term goes on, watched from after the read.
    let (_alive, mut lost, _stop, stats) = start(created);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!*lost.borrow(), "the key is there: leadership is not lost");
    assert_eq!(stats.reloads(), 1, "one full read");
    assert!((2..=3).contains(&stats.opened()), "one compacted open, one after the read, no loop: {}", stats.opened());
    c.delete(key.clone(), None).await.expect("delete");
    tokio::time::timeout(WITHIN, lost.wait_for(|l| *l)).await.expect("the deletion is seen").expect("open");
    // Deleted and created again by another term before the compaction:
    // the full read finds a key that is not this term's.
    let created = put(&mut c, key.clone()).await;
    c.delete(key.clone(), None).await.expect("delete");
    put(&mut c, key.clone()).await;
    churn_and_compact(&mut c, &p).await;
    let (_alive, mut lost, _stop, stats) = start(created);
    tokio::time::timeout(WITHIN, lost.wait_for(|l| *l)).await.expect("lost after the full read").expect("open");
    assert_eq!(stats.reloads(), 1);
}

#[tokio::test]
async fn progress_notify_keeps_an_idle_watch_current() {
    let cluster = EtcdCluster::start(3).await;
    let mut c = client(&cluster.endpoints()).await;
    let p = unique("idle");
    let stats = Arc::new(WatchStats::default());
    let options = WatchOptions::new().with_prefix();
    let mut w = Resumable::new(client(&cluster.endpoints()).await, p.clone(), options, stats.clone(), "test");
    first_read(&mut w, &mut c, &p).await;
    let read_at = stats.revision();
    let watching = tokio::spawn(async move {
        loop {
            if let Next::Events(e) = w.next().await {
                panic!("nothing is written under the watched prefix, yet {e:?}");
            }
        }
    });
    // Writes elsewhere only.
    let mut now = 0;
    for i in 0..5 {
        now = put(&mut c, format!("/gnomon-test/busy/{i}")).await;
    }
    assert!(now > read_at);
    let deadline = tokio::time::Instant::now() + WITHIN;
    while stats.revision() < now {
        assert!(tokio::time::Instant::now() < deadline, "the idle watch still knows revision {} < {now}", stats.revision());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!watching.is_finished());
    watching.abort();
}

/// A sleep that records its waits and does not wait.
fn recorder() -> (Arc<Mutex<Vec<Duration>>>, impl FnMut(Duration) -> std::future::Ready<()>) {
    let waits = Arc::new(Mutex::new(Vec::new()));
    let w = waits.clone();
    (waits, move |d| {
        w.lock().unwrap().push(d);
        std::future::ready(())
    })
}

#[tokio::test]
async fn a_write_to_a_stopped_member_is_resent_and_one_that_may_have_left_is_not() {
    let mut cluster = EtcdCluster::start(3).await;
    let f = cluster.a_follower().await;
    let kv = client(&[cluster.endpoint(f)]).await.kv_client();
    let p = unique("writes");
    let txn = || Txn::new().and_then(vec![TxnOp::put(format!("{p}x"), "1", None)]);
    cluster.stop(f);
    // The connection the member dropped may fail a first request as a
    // broken one (maybe sent); once the client reconnects, every request
    // fails to connect: it never left.
    let mut refused = false;
    for _ in 0..50 {
        if let Err(e) = kv.clone().get(format!("{p}x"), None).await {
            if never_sent(&e) {
                refused = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused, "a stopped member refuses the connection");
    // Nothing listens: each try fails to connect, so it is tried 5 times.
    let calls = AtomicU32::new(0);
    let (waits, sleep) = recorder();
    let r = send_write_with(&WRITES, never_sent, sleep, || {
        calls.fetch_add(1, Ordering::SeqCst);
        let mut kv = kv.clone();
        let t = txn();
        async move { kv.txn(t).await }
    })
    .await;
    assert!(r.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 5, "a write that never left is resent: {r:?}");
    assert_eq!(*waits.lock().unwrap(), WRITES.delays());
    let mut others = client(&cluster.endpoints_but(f)).await;
    assert_eq!(others.get(format!("{p}x"), None).await.expect("read").count(), 0);

    // A listener that takes the connection and the request, then hangs up:
    // the request left, so it is not resent.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let received = Arc::new(AtomicU32::new(0));
    let got = received.clone();
    let server = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            let got = got.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                // The HTTP/2 preface (24 bytes), settings, then the request;
                // it hangs up once the client has been quiet for 500 ms.
                while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(500), sock.read(&mut buf)).await {
                    if n == 0 {
                        break;
                    }
                    got.fetch_add(u32::try_from(n).unwrap_or(u32::MAX), Ordering::SeqCst);
                }
            });
        }
    });
    let opts = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
    let hangs_up = Client::connect([format!("http://{addr}")], Some(opts)).await.expect("a lazy connect").kv_client();
    let calls = AtomicU32::new(0);
    let (waits, sleep) = recorder();
    let r = send_write_with(&WRITES, never_sent, sleep, || {
        calls.fetch_add(1, Ordering::SeqCst);
        let mut kv = hangs_up.clone();
        let t = txn();
        async move { kv.txn(t).await }
    })
    .await;
    let e = r.expect_err("no answer");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a write that may have left is not resent: {e}");
    assert!(waits.lock().unwrap().is_empty());
    let bytes = received.load(Ordering::SeqCst);
    assert!(bytes > 24, "the listener got more than the preface: {bytes} bytes ({e})");
    server.abort();
}

#[tokio::test]
async fn worker_deletions_are_reported_across_a_restart_and_a_compaction() {
    let mut cluster = EtcdCluster::start(3).await;
    let name = format!("wd-{:08x}", rand::random::<u32>());
    let f = cluster.a_follower().await;
    let member = cluster.endpoint(f).replace("http://", "");
    let store = super::EtcdStore::open(&format!("etcd://{member}/{name}")).await.expect("open");
    let mut c = client(&cluster.endpoints_but(f)).await;
    let p = format!("/gnomon/{name}/workers/");
    for w in ["w1", "w2", "w3"] {
        put(&mut c, format!("{p}{w}")).await;
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let stats = Arc::new(WatchStats::default());
    tokio::spawn(super::sessions::watch_worker_deletions(store, tx, stats.clone()));
    let deadline = tokio::time::Instant::now() + WITHIN;
    while stats.opened() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the watch opened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.delete(format!("{p}w1"), None).await.expect("delete");
    let got = tokio::time::timeout(WITHIN, rx.recv()).await.expect("w1 within bounds").expect("open");
    assert_eq!(got.0, "w1");
    // Its member goes away; w2 is deleted and the history compacted past
    // the watch's revision; the member comes back.
    cluster.stop(f);
    c.delete(format!("{p}w2"), None).await.expect("delete");
    churn_and_compact(&mut c, &format!("/gnomon/{name}/other/")).await;
    cluster.restart(f).await;
    let got = tokio::time::timeout(WITHIN, rx.recv()).await.expect("w2 within bounds").expect("open");
    assert_eq!(got.0, "w2", "found missing by the full read");
    assert_eq!(stats.reloads(), 1);
    c.delete(format!("{p}w3"), None).await.expect("delete");
    let got = tokio::time::timeout(WITHIN, rx.recv()).await.expect("w3 within bounds").expect("open");
    assert_eq!(got.0, "w3", "watched again after the read");
    assert!(tokio::time::timeout(Duration::from_secs(1), rx.recv()).await.is_err(), "each deletion once");
}
