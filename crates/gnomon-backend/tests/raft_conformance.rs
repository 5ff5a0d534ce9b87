//! The `raft` store and elector against a three-member cluster in this
//! process: each member has its own directory and its own gRPC server on a
//! loopback port, and they talk over real connections. The store suite
//! opens handles on every member in turn (so writes are forwarded to the
//! leader and reads go through the read index), and the elector suites run
//! with a candidate per member; a sever cuts the leader's links.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gnomon_backend::raft::{Member, RaftConfig, RaftElector, RaftStore};
use gnomon_backend::roles::*;
use gnomon_backend::testing::conformance::{contested_elector_suite, store_suite, ElectorFixture};
use gnomon_backend::{Elector, Store};
use gnomon_proto::raft::raft_server::RaftServer;

struct Cluster {
    members: Vec<Arc<Member>>,
    peers: BTreeMap<u64, String>,
    servers: Vec<tokio::task::JoinHandle<()>>,
    dirs: Vec<tempfile::TempDir>,
}

fn config(id: u64, dir: &std::path::Path, peers: &BTreeMap<u64, String>, snapshot_every: u64) -> RaftConfig {
    let mut c = RaftConfig::new(id, dir.to_path_buf(), peers.clone());
    c.snapshot_every = snapshot_every;
    c
}

fn serve(member: &Arc<Member>, l: tokio::net::TcpListener) -> tokio::task::JoinHandle<()> {
    let svc = RaftServer::new(member.service()).max_decoding_message_size(usize::MAX);
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l))
            .await;
    })
}

async fn cluster() -> Cluster {
    cluster_with(5000).await
}

async fn cluster_with(snapshot_every: u64) -> Cluster {
    let mut listeners = Vec::new();
    let mut peers = BTreeMap::new();
    for id in 1..=3u64 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        peers.insert(id, l.local_addr().expect("addr").to_string());
        listeners.push(l);
    }
    let (mut members, mut dirs, mut servers) = (Vec::new(), Vec::new(), Vec::new());
    for (i, l) in listeners.into_iter().enumerate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let member = Member::start(config(i as u64 + 1, dir.path(), &peers, snapshot_every)).await.expect("member starts");
        servers.push(serve(&member, l));
        members.push(member);
        dirs.push(dir);
    }
    members[0].bootstrap().await.expect("bootstrap");
    // Refused over a cluster that exists.
    assert!(members[0].bootstrap().await.is_err(), "a second bootstrap is refused");
    wait_leader(&members).await;
    Cluster { members, peers, servers, dirs }
}

async fn wait_leader(members: &[Arc<Member>]) -> u64 {
    for _ in 0..300 {
        if let Some(l) = members.iter().find_map(|m| {
            let x = m.raft.metrics().borrow().clone();
            (x.current_leader == Some(m.id) && x.state == openraft::ServerState::Leader).then_some(m.id)
        }) {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no leader within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn raft_store_passes_the_store_suite_across_members() {
    let c = cluster().await;
    let next = AtomicUsize::new(0);
    let members = c.members.clone();
    store_suite(|| {
        let m = members[next.fetch_add(1, Ordering::SeqCst) % members.len()].clone();
        async move { Arc::new(RaftStore::new(m)) as Arc<dyn Store> }
    })
    .await;
    // Every member applied the same history: the same jobs everywhere.
    let lists: Vec<Vec<String>> = {
        let mut v = Vec::new();
        for m in &c.members {
            let s = RaftStore::new(m.clone());
            let mut names: Vec<String> =
                s.list_jobs(None).await.expect("list").into_iter().map(|j| format!("{}@{}", j.uid, j.version)).collect();
            names.sort();
            v.push(names);
        }
        v
    };
    assert!(lists.windows(2).all(|w| w[0] == w[1]), "members differ: {lists:?}");
    for m in &c.members {
        m.shutdown().await;
    }
}

struct RaftFixture {
    cluster: Cluster,
    /// Candidates are handed out leader first.
    order: Vec<usize>,
    next: AtomicUsize,
}

#[async_trait]
impl ElectorFixture for RaftFixture {
    fn store(&self) -> Arc<dyn Store> {
        // On the first candidate's member, which the sever never cuts (it
        // resigns before, and leadership moves to where a scheduler waits).
        Arc::new(RaftStore::new(self.cluster.members[self.order[0]].clone()))
    }
    async fn candidate(&self) -> Arc<dyn Elector> {
        let i = self.order[self.next.fetch_add(1, Ordering::SeqCst) % 3];
        Arc::new(RaftElector::new(self.cluster.members[i].clone()))
    }
    async fn sever(&self, _scope: &str) {
        let leader = wait_leader(&self.cluster.members).await;
        for m in &self.cluster.members {
            if m.id == leader {
                for other in 1..=3 {
                    if other != leader {
                        m.set_cut(other, true);
                    }
                }
            } else {
                m.set_cut(leader, true);
            }
        }
    }
    fn loss_bound(&self) -> Duration {
        Duration::from_secs(10)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn raft_elector_passes_the_elector_suites() {
    let cluster = cluster().await;
    let leader = wait_leader(&cluster.members).await as usize - 1;
    let order = vec![leader, (leader + 1) % 3, (leader + 2) % 3];
    let fx = RaftFixture { cluster, order, next: AtomicUsize::new(0) };
    let _ = (&fx.cluster.peers, &fx.cluster.servers, &fx.cluster.dirs);
    contested_elector_suite(&fx).await;
    for m in &fx.cluster.members {
        m.shutdown().await;
    }
}

/// A member's jobs, read as soon as it can serve a linearizable read (a
/// member busy installing a snapshot may refuse one for a moment).
async fn job_names(m: &Arc<Member>) -> Vec<String> {
    let s = RaftStore::new(m.clone());
    let mut last = None;
    for _ in 0..100 {
        match s.list_jobs(None).await {
            Ok(jobs) => {
                let mut names: Vec<String> = jobs.into_iter().map(|j| format!("{}@{}", j.name, j.version)).collect();
                names.sort();
                return names;
            }
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("member {} served no read in 20 s: {last:?}", m.id)
}

/// `None` while the member cannot serve a linearizable read (no leader yet).
async fn try_job_names(m: &Arc<Member>) -> Option<Vec<String>> {
    let s = RaftStore::new(m.clone());
    let mut names: Vec<String> = s.list_jobs(None).await.ok()?.into_iter().map(|j| format!("{}@{}", j.name, j.version)).collect();
    names.sort();
    Some(names)
}

async fn put_jobs(store: &RaftStore, prefix: &str, n: usize) {
    for i in 0..n {
        let spec = gnomon_backend::testing::conformance::job_spec(&format!("{prefix}-{i}"));
        store.put_job(&spec, gnomon_backend::Precondition::None, 1_000 + i as i64).await.expect("put");
    }
}

/// Jobs whose specs carry a 40 KB payload each (a snapshot of many chunks).
async fn put_heavy_jobs(store: &RaftStore, prefix: &str, n: usize) {
    let payload = "p".repeat(40_000);
    for i in 0..n {
        let json = format!(
            r#"{{"name":"{prefix}-{i}","schedule":{{"every":"1s"}},"executor":{{"handler":{{"name":"noop","payload":"{payload}"}}}}}}"#
        );
        let spec = gnomon_core::spec::parse_job_json(json.as_bytes()).and_then(|s| s.compile()).expect("valid spec").spec;
        store.put_job(&spec, gnomon_backend::Precondition::None, 1_000 + i as i64).await.expect("put");
    }
}

/// The size of the largest snapshot file in a member's directory.
fn snapshot_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("snapshot-"))
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .max()
        .unwrap_or(0)
}

/// A member cut off while the others wrote (and compacted their logs past
/// what it has) catches up by snapshot; a member restarted from its
/// directory comes back with everything (its snapshot, then the log).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_catch_up_by_snapshot_and_restart_from_their_directory() {
    let mut c = cluster_with(40).await;
    let leader = wait_leader(&c.members).await;
    let lagging = (1..=3).find(|id| *id != leader).expect("a follower");
    for m in &c.members {
        if m.id == lagging {
            for other in 1..=3 {
                m.set_cut(other, other != lagging);
            }
        } else {
            m.set_cut(lagging, true);
        }
    }
    let on_leader = RaftStore::new(c.members[leader as usize - 1].clone());
    put_heavy_jobs(&on_leader, "while-cut", 150).await;
    // The leader's log no longer holds the start: the lagging member needs
    // the snapshot.
    let purged = c.members[leader as usize - 1].raft.metrics().borrow().purged;
    assert!(purged.is_some_and(|p| p.index > 10), "the leader compacted its log: {purged:?}");
    for m in &c.members {
        for other in 1..=3 {
            m.set_cut(other, false);
        }
    }
    let want = job_names(&c.members[leader as usize - 1]).await;
    assert_eq!(want.len(), 150);
    let lag = c.members[lagging as usize - 1].clone();
    let mut caught_up = false;
    for _ in 0..100 {
        if lag.raft.metrics().borrow().snapshot.is_some() && try_job_names(&lag).await.as_ref() == Some(&want) {
            caught_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(caught_up, "the cut-off member caught up by snapshot");
    // Streamed in many chunks, kept as a file.
    let got = snapshot_bytes(c.dirs[lagging as usize - 1].path());
    assert!(got > 4 << 20, "the snapshot it received holds the jobs' 6 MB of payloads: {got} bytes");

    // Restart a follower from its directory while the others write on.
    let restart = (1..=3).find(|id| *id != leader).expect("a follower");
    let i = restart as usize - 1;
    c.members[i].shutdown().await;
    c.servers[i].abort();
    put_jobs(&on_leader, "while-down", 30).await;
    let addr = c.peers[&restart].clone();
    let mut listener = None;
    for _ in 0..50 {
        match tokio::net::TcpListener::bind(&addr).await {
            Ok(l) => {
                listener = Some(l);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let member = Member::start(config(restart, c.dirs[i].path(), &c.peers, 40)).await.expect("restarts");
    c.servers[i] = serve(&member, listener.expect("the address is free again"));
    c.members[i] = member.clone();
    let want = job_names(&c.members[leader as usize - 1]).await;
    assert_eq!(want.len(), 180);
    let mut back = false;
    for _ in 0..100 {
        if try_job_names(&member).await.as_ref() == Some(&want) {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if !back {
        for m in &c.members {
            eprintln!("{}", m.raft.metrics().borrow().clone());
        }
        eprintln!("{:?}", try_job_names(&member).await.map(|v| v.len()));
    }
    assert!(back, "the restarted member has every job");
    for m in &c.members {
        m.shutdown().await;
    }
}

/// Pre-vote: a member cut off for many election timeouts never raises the
/// term (a majority would not vote for it while the leader lives), so when
/// it comes back the leader keeps leading, in the same term.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_that_was_cut_off_does_not_unseat_the_leader_when_it_returns() {
    let c = cluster().await;
    let leader = wait_leader(&c.members).await;
    let term = c.members[leader as usize - 1].raft.metrics().borrow().current_term;
    let lone = (1..=3).find(|id| *id != leader).expect("a follower");
    let set_cut = |cut: bool| {
        for m in &c.members {
            if m.id == lone {
                for other in (1..=3).filter(|o| *o != lone) {
                    m.set_cut(other, cut);
                }
            } else {
                m.set_cut(lone, cut);
            }
        }
    };
    set_cut(true);
    // Many election timeouts (about 2 s each with the lease).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let lone_term = c.members[lone as usize - 1].raft.metrics().borrow().current_term;
    assert_eq!(lone_term, term, "the cut-off member did not raise the term");
    set_cut(false);
    let on_leader = RaftStore::new(c.members[leader as usize - 1].clone());
    put_jobs(&on_leader, "after", 5).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    for m in &c.members {
        let x = m.raft.metrics().borrow().clone();
        assert_eq!((x.current_term, x.current_leader), (term, Some(leader)), "member {} sees the same leader and term", m.id);
    }
    assert_eq!(job_names(&c.members[lone as usize - 1]).await.len(), 5, "the returned member caught up");
    for m in &c.members {
        m.shutdown().await;
    }
}
