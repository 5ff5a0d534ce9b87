//! Three `gnomon server --store raft://…` members on loopback, each with
//! an embedded worker: starting, finding the leader, reading runs.

#![allow(dead_code)]

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

/// The shared admin credential of every member (the members derive
/// the credential they present to each other from it).
pub const TOKEN: &str = "raft-test-admin-credential-0123456789";

pub fn http(addr: &str, method: &str, path: &str, body: Option<&[u8]>) -> std::io::Result<(u16, Value)> {
    http_as(Some(TOKEN), addr, method, path, body)
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub ports: Vec<u16>,
    pub procs: Vec<Option<Proc>>,
    /// The addresses members reach each other at (proxies), if not `ports`.
    pub peer_addrs: Option<Vec<String>>,
    /// Extra environment of a member (a skewed clock), by index.
    pub env: Vec<(usize, String, String)>,
}

/// The job every test fires: every second, every missed second caught up.
/// A job every second. An attempt whose worker goes down with its member
/// (killed, or stopping with a result it could not hand on) is `lost` and
/// retried, as a user would configure it: the checks are on fires.
pub fn tick_job() -> String {
    json!({"name": "tick", "schedule": {"every": "1s"}, "misfire": "fire_all", "executor": {"shell": {"command": "true"}},
           "retry": {"max_attempts": 5, "backoff": {"initial": "100ms", "max": "1s"}}})
    .to_string()
}

impl Cluster {
    /// Starts the three founding members on `ports` (more are for members
    /// that join later) and waits for a leader.
    pub fn launch(ports: Vec<u16>, peer_addrs: Option<Vec<String>>) -> Cluster {
        Cluster::launch_with(ports, peer_addrs, Vec::new())
    }

    pub fn launch_with(ports: Vec<u16>, peer_addrs: Option<Vec<String>>, env: Vec<(usize, String, String)>) -> Cluster {
        let procs = ports.iter().map(|_| None).collect();
        let mut c = Cluster { dir: tempfile::tempdir().unwrap(), ports, procs, peer_addrs, env };
        for i in 0..3 {
            c.start(i);
        }
        wait_until("a leader", Duration::from_secs(30), || c.leader().is_some());
        c
    }

    /// The three founding members.
    pub fn peers(&self) -> String {
        match &self.peer_addrs {
            Some(a) => a.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect::<Vec<_>>().join(","),
            None => self.ports.iter().take(3).enumerate().map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1)).collect::<Vec<_>>().join(","),
        }
    }

    pub fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i])
    }

    pub fn start(&mut self, i: usize) {
        let peers = if i < 3 { self.peers() } else { format!("{}={}", i + 1, self.addr(i)) };
        let mut args: Vec<String> = vec![
            "server".into(),
            "--store".into(),
            format!("raft://{}", self.dir.path().join(format!("m{}", i + 1)).display()),
            "--raft-id".into(),
            (i + 1).to_string(),
            "--raft-peers".into(),
            peers,
            "--listen".into(),
            self.addr(i),
            "--node-id".into(),
            format!("n{}", i + 1),
            "--capacity".into(),
            "4".into(),
            "--misfire-grace".into(),
            "1h".into(),
            "--token".into(),
            TOKEN.into(),
            // Snapshots often, so a member that joins or falls behind is
            // sent one.
            "--raft-snapshot-every".into(),
            "50".into(),
        ];
        if i == 0 {
            args.push("--raft-bootstrap".into());
        }
        let env: Vec<(String, String)> = self.env.iter().filter(|(m, _, _)| *m == i).map(|(_, k, v)| (k.clone(), v.clone())).collect();
        self.procs[i] = Some(Proc::spawn_env(self.dir.path(), &format!("m{}", i + 1), &args, &env));
    }

    /// The member that leads, as the live ones agree (index into `procs`).
    pub fn leader(&self) -> Option<usize> {
        let mut seen = None;
        for i in 0..self.procs.len() {
            if self.procs[i].is_none() {
                continue;
            }
            if let Ok((200, v)) = http(&self.addr(i), "GET", "/v1/leader", None) {
                if v["is_self"] == json!(true) {
                    seen = Some(i);
                }
            }
        }
        seen
    }

    pub fn any_live(&self) -> usize {
        (0..self.procs.len()).find(|i| self.procs[*i].is_some()).expect("a live member")
    }

    pub fn runs(&self, at: usize) -> Vec<Value> {
        match http(&self.addr(at), "GET", "/v1/runs?job=tick&limit=1000", None) {
            // Scheduled runs only (the history checks); manual ones are triggers.
            Ok((200, v)) => v["runs"].as_array().cloned().unwrap_or_default().into_iter().filter(|r| r["manual"] != json!(true)).collect(),
            _ => Vec::new(),
        }
    }
}
