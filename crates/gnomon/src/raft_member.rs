//! `gnomon server --store raft://DIR`: this server is a member of an
//! embedded Raft cluster that replicates the store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use gnomon_backend::raft::{Member, RaftConfig};

/// The flags of a `raft://` member.
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct RaftArgs {
    /// This member's id in the cluster (with --store raft://DIR).
    #[arg(long, value_name = "N", env = "GNOMON_RAFT_ID")]
    pub raft_id: Option<u64>,
    /// Every voting member, `ID=HOST:PORT` separated by commas (this one
    /// included): the address is the member's gnomon listener.
    #[arg(long, value_name = "ID=HOST:PORT,…", env = "GNOMON_RAFT_PEERS")]
    pub raft_peers: Option<String>,
    /// Make the --raft-peers a new cluster if this member has no data yet
    /// (give it on one member, the first time; a member that already
    /// belongs to a cluster ignores it).
    #[arg(long, env = "GNOMON_RAFT_BOOTSTRAP")]
    pub raft_bootstrap: bool,
    /// A follower that hears nothing from its leader for this long (up to
    /// 1.5× this, at random) stands for election; heartbeats go out at a
    /// fifth of it. Every member of a cluster should use the same value.
    #[arg(long, value_name = "DURATION", env = "GNOMON_RAFT_ELECTION_TIMEOUT", value_parser = crate::leader_args::duration_arg)]
    pub raft_election_timeout: Option<String>,
    /// Log entries between snapshots (default 5,000); a member that falls
    /// further behind than the entries kept after one is sent a snapshot.
    #[arg(long, value_name = "N", env = "GNOMON_RAFT_SNAPSHOT_EVERY")]
    pub raft_snapshot_every: Option<u64>,
    /// A file holding the member credential this member presents to the
    /// others (a `member` entry of their --auth-file). Without it, the
    /// credential every member derives from the shared --token/--token-file.
    #[arg(long, value_name = "FILE", env = "GNOMON_RAFT_TOKEN_FILE")]
    pub raft_token_file: Option<PathBuf>,
}

/// The directory of a `raft://DIR` store URL.
pub fn raft_dir(url: &str) -> anyhow::Result<PathBuf> {
    let path = url.strip_prefix("raft://").ok_or_else(|| anyhow!("not a raft:// store URL"))?;
    if path.is_empty() || path.contains('?') {
        bail!("--store raft://DIR takes a directory, e.g. raft:///var/lib/gnomon/raft");
    }
    Ok(PathBuf::from(path))
}

/// Parses `1=h1:7400,2=h2:7400,3=h3:7400`.
pub fn parse_peers(list: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item.split_once('=').ok_or_else(|| anyhow!("--raft-peers: {item:?} is not ID=HOST:PORT"))?;
        let id: u64 =
            id.trim().parse().ok().filter(|n| *n > 0).ok_or_else(|| anyhow!("--raft-peers: {id:?} is not a member id (1 or more)"))?;
        let addr = addr.trim();
        if !gnomon_backend::raft::valid_address(addr) {
            bail!("--raft-peers: {addr:?} (member {id}) is not HOST:PORT");
        }
        if peers.insert(id, addr.to_string()).is_some() {
            bail!("--raft-peers: member {id} is listed twice");
        }
    }
    if peers.is_empty() {
        bail!("--raft-peers lists no member");
    }
    Ok(peers)
}

/// How this member reaches the others: HTTPS when the listener has TLS
/// (trusting `ca`, else the web roots).
fn connect(tls: bool, ca: Option<&Path>) -> anyhow::Result<Option<gnomon_backend::raft::Connect>> {
    if !tls {
        return Ok(None);
    }
    let mut config = tonic::transport::ClientTlsConfig::new().with_enabled_roots();
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).with_context(|| format!("reading --ca {}", ca.display()))?;
        config = config.ca_certificate(tonic::transport::Certificate::from_pem(pem));
    }
    Ok(Some(Arc::new(move |addr: &str| {
        tonic::transport::Channel::from_shared(format!("https://{addr}"))
            .map_err(|e| e.to_string())?
            .tls_config(config.clone())
            .map(|e| e.connect_timeout(std::time::Duration::from_secs(2)).tcp_nodelay(true).connect_lazy())
            .map_err(|e| e.to_string())
    })))
}

/// The member credential this member presents to the others: the contents
/// of `--raft-token-file`, or the one every member derives from the shared
/// `--token` or `--token-file` (never the admin token itself, which a
/// member refuses).
pub fn own_credential(raft_token_file: Option<&Path>, token: Option<&str>, token_file: Option<&Path>) -> anyhow::Result<Option<String>> {
    let read = |f: &Path, flag: &str| -> anyhow::Result<String> {
        let t = std::fs::read_to_string(f).with_context(|| format!("reading {flag} {}", f.display()))?.trim().to_string();
        if t.is_empty() {
            bail!("{flag} {} is empty", f.display());
        }
        Ok(t)
    };
    if let Some(f) = raft_token_file {
        return read(f, "--raft-token-file").map(Some);
    }
    let shared = match (token, token_file) {
        (Some(t), _) => Some(t.to_string()),
        (None, Some(f)) => Some(read(f, "--token-file")?),
        (None, None) => None,
    };
    Ok(shared.map(|t| gnomon_server::auth::Derived::Member.token(&t)))
}

/// Starts this member (and bootstraps the cluster when asked and new).
pub async fn start(url: &str, args: &RaftArgs, token: Option<&str>, tls: bool, ca: Option<&Path>) -> anyhow::Result<Arc<Member>> {
    let dir = raft_dir(url)?;
    let id = args.raft_id.ok_or_else(|| anyhow!("--store raft:// needs --raft-id (this member's id)"))?;
    let peers = parse_peers(args.raft_peers.as_deref().ok_or_else(|| anyhow!("--store raft:// needs --raft-peers"))?)?;
    if !peers.contains_key(&id) {
        bail!("--raft-peers does not list this member's id {id}");
    }
    let mut config = RaftConfig::new(id, dir, peers);
    if let Some(t) = &args.raft_election_timeout {
        let t = gnomon_core::duration::parse_duration(t).map_err(|e| anyhow!("--raft-election-timeout: {e}"))?;
        if !(std::time::Duration::from_millis(200)..=std::time::Duration::from_secs(60)).contains(&t) {
            bail!("--raft-election-timeout must be between 200ms and 60s");
        }
        config.election_timeout = (t, t.mul_f64(1.5));
        config.heartbeat = t / 5;
    }
    if let Some(n) = args.raft_snapshot_every {
        if !(10..=10_000_000).contains(&n) {
            bail!("--raft-snapshot-every must be between 10 and 10000000");
        }
        config.snapshot_every = n;
    }
    config.token = token.map(str::to_string);
    config.connect = connect(tls, ca)?;
    let member = Member::start(config).await.map_err(|e| anyhow!("cannot start the raft member: {e}"))?;
    if args.raft_bootstrap {
        if member.raft.is_initialized().await.unwrap_or(true) {
            tracing::info!("this member already belongs to a raft cluster; --raft-bootstrap is ignored");
        } else {
            member.bootstrap().await.map_err(|e| anyhow!("{e}"))?;
            tracing::info!("bootstrapped a new raft cluster");
        }
    }
    Ok(member)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_and_bad_ones_are_explained() {
        let p = parse_peers("1=h1:7400, 2=h2:7401,3=[::1]:7402").unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[&3], "[::1]:7402");
        for (bad, says) in [
            ("1=h1", "HOST:PORT"),
            ("0=h:1", "member id"),
            ("x=h:1", "member id"),
            ("1=h:1,1=h:2", "twice"),
            ("", "no member"),
            ("1=:80", "HOST:PORT"),
            ("1=h:0", "HOST:PORT"),
        ] {
            let e = parse_peers(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        assert!(raft_dir("raft://").is_err());
        assert_eq!(raft_dir("raft:///var/lib/g").unwrap(), PathBuf::from("/var/lib/g"));
    }
}
