//! A private etcd cluster for the tests that stop members, compact the
//! history or need frequent progress notifications — things a test must not
//! do to the shared cluster (`scripts/etcd.sh`) other tests are using.
//!
//! It runs the `etcd` binary `scripts/etcd.sh` installs, as N members on
//! free loopback ports under a temporary directory, with the shared
//! cluster's timing (`--heartbeat-interval 100 --election-timeout 1000`)
//! and a progress notification every [`PROGRESS_EVERY`]. Members are ended
//! by the child handles (PIDs) it started, when stopped or dropped.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The members' `--experimental-watch-progress-notify-interval`.
pub(crate) const PROGRESS_EVERY: &str = "500ms";

struct Member {
    client: u16,
    peer: u16,
    child: Option<Child>,
}

pub(crate) struct EtcdCluster {
    dir: tempfile::TempDir,
    token: String,
    members: Vec<Member>,
}

/// Ports handed out in this process, never handed out twice.
static TAKEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// `n` free loopback ports below the kernel's ephemeral range (so no
/// outgoing connection takes one before etcd binds it), none handed out
/// before in this process.
fn free_ports(n: usize) -> Vec<u16> {
    let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    while out.len() < n {
        let port = 24000 + (rand::random::<u16>() % 8000);
        if taken.contains(&port) || std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        taken.push(port);
        out.push(port);
    }
    out
}

impl EtcdCluster {
    /// Starts `size` members and waits (up to 60 s) until each answers a
    /// linearizable read as a member of this cluster. A member that exits
    /// at once (its port taken meanwhile) is tried again on other ports.
    pub async fn start(size: usize) -> Self {
        let mut failures = Vec::new();
        for _ in 0..3 {
            let ports = free_ports(2 * size);
            let members = (0..size).map(|i| Member { client: ports[2 * i], peer: ports[2 * i + 1], child: None }).collect();
            let dir = tempfile::Builder::new().prefix("gnomon-etcd-test").tempdir().expect("temp dir");
            let token = format!("gnomon-test-{:08x}", rand::random::<u32>());
            let mut c = Self { dir, token, members };
            for i in 0..size {
                c.spawn(i);
            }
            let mut ready = Ok(());
            for i in 0..size {
                ready = ready.and(c.wait_ready(i).await);
            }
            match ready {
                Ok(()) => return c,
                Err(e) => failures.push(e),
            }
        }
        panic!("a private etcd cluster did not start: {failures:#?}")
    }

    fn spawn(&mut self, i: usize) {
        let initial: Vec<String> = self.members.iter().enumerate().map(|(j, m)| format!("m{j}=http://127.0.0.1:{}", m.peer)).collect();
        let m = &self.members[i];
        let (client, peer) = (format!("http://127.0.0.1:{}", m.client), format!("http://127.0.0.1:{}", m.peer));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join(format!("m{i}.log"))).expect("log file");
        let child = Command::new("etcd")
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("m{i}")))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial.join(","), "--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .args(["--experimental-watch-progress-notify-interval", PROGRESS_EVERY])
            .env("ETCD_UNSUPPORTED_ARCH", std::env::var("ETCD_UNSUPPORTED_ARCH").unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("etcd (scripts/etcd.sh installs it)");
        self.members[i].child = Some(child);
    }

    /// Waits until member `i` answers a linearizable read and lists its
    /// own peer URL (not some other etcd that took the port); an error if
    /// it exits first.
    async fn wait_ready(&mut self, i: usize) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let opts = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(2)).with_require_leader(true);
        let peer = format!("http://127.0.0.1:{}", self.members[i].peer);
        loop {
            if let Some(Ok(Some(status))) = self.members[i].child.as_mut().map(Child::try_wait) {
                return Err(format!("etcd member m{i} exited ({status}); its log ends:\n{}", self.log_tail(i)));
            }
            let probe = async {
                let mut c = etcd_client::Client::connect([self.endpoint(i)], Some(opts.clone())).await.ok()?;
                c.get("/ready", None).await.ok()?;
                let members = c.member_list().await.ok()?;
                Some(members.members().iter().any(|m| m.peer_urls().contains(&peer)))
            };
            match tokio::time::timeout(Duration::from_secs(3), probe).await {
                Ok(Some(true)) => return Ok(()),
                Ok(Some(false)) => return Err(format!("another etcd answers on m{i}'s port {}", self.members[i].client)),
                _ => {}
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!("etcd member m{i} did not answer within 60 s; its log ends:\n{}", self.log_tail(i)));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn log_tail(&self, i: usize) -> String {
        let log = std::fs::read_to_string(self.dir.path().join(format!("m{i}.log"))).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client)
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Every member's client URL but member `i`'s.
    pub fn endpoints_but(&self, i: usize) -> Vec<String> {
        (0..self.members.len()).filter(|j| *j != i).map(|j| self.endpoint(j)).collect()
    }

    /// A member that is not the raft leader (stopping it elects no one).
    pub async fn a_follower(&self) -> usize {
        for i in 0..self.members.len() {
            let mut c = etcd_client::Client::connect([self.endpoint(i)], None).await.expect("connect");
            let s = c.status().await.expect("status");
            if s.header().is_some_and(|h| h.member_id() != s.leader()) {
                return i;
            }
        }
        panic!("every member says it leads")
    }

    /// Ends member `i` (SIGKILL to the PID it started) and reaps it.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data and waits until it answers.
    pub async fn restart(&mut self, i: usize) {
        self.stop(i);
        self.spawn(i);
        if let Err(e) = self.wait_ready(i).await {
            panic!("{e}");
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.stop(i);
        }
    }
}
