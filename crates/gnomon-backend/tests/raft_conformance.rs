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
use gnomon_backend::testing::conformance::{contested_elector_suite, store_suite, ElectorFixture};
use gnomon_backend::{Elector, Store};
use gnomon_proto::raft::raft_server::RaftServer;

struct Cluster {
    members: Vec<Arc<Member>>,
    _dirs: Vec<tempfile::TempDir>,
}

async fn cluster() -> Cluster {
    let mut listeners = Vec::new();
    let mut peers = BTreeMap::new();
    for id in 1..=3u64 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        peers.insert(id, l.local_addr().expect("addr").to_string());
        listeners.push(l);
    }
    let mut members = Vec::new();
    let mut dirs = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let id = i as u64 + 1;
        let dir = tempfile::tempdir().expect("tempdir");
        let member = Member::start(RaftConfig::new(id, dir.path().to_path_buf(), peers.clone())).await.expect("member starts");
        let svc = RaftServer::new(member.service()).max_decoding_message_size(usize::MAX);
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l))
                .await
                .expect("serve");
        });
        members.push(member);
        dirs.push(dir);
    }
    members[0].bootstrap().await.expect("bootstrap");
    // Refused over a cluster that exists.
    assert!(members[0].bootstrap().await.is_err(), "a second bootstrap is refused");
    wait_leader(&members).await;
    Cluster { members, _dirs: dirs }
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
        async move { Arc::new(RaftStore { member: m }) as Arc<dyn Store> }
    })
    .await;
    // Every member applied the same history: the same jobs everywhere.
    let lists: Vec<Vec<String>> = {
        let mut v = Vec::new();
        for m in &c.members {
            let s = RaftStore { member: m.clone() };
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
        Arc::new(RaftStore { member: self.cluster.members[self.order[0]].clone() })
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
    contested_elector_suite(&fx).await;
    for m in &fx.cluster.members {
        m.shutdown().await;
    }
}
