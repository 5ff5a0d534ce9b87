//! Database-lock electors (MySQL/MariaDB `GET_LOCK`, PostgreSQL advisory
//! locks), the opt-in fallback to the local elector, and what they share.
//!
//! # The lock electors
//! A candidate holds one **dedicated connection** (never a pool connection)
//! and takes a server-side lock on it. The lock lives exactly as long as the
//! connection does, so:
//! - a crashed leader's connection is closed by its kernel and the lock is
//!   released at once;
//! - a leader that is paused (SIGSTOP) or cut off from the database stops
//!   talking on the connection, and the server closes it after the
//!   configured TTL (MySQL `wait_timeout`, PostgreSQL
//!   `idle_session_timeout`), releasing the lock;
//! - the leader pings the connection every second and declares its
//!   leadership lost the moment a ping fails, times out, or shows the lock
//!   gone (invariant 5). Either way a deposed leader's writes are rejected
//!   by the store's fencing check: the token is the store's epoch, bumped
//!   while holding the lock, and `fence`d before any leader work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};

pub mod local;

use crate::{ElectionError, Elector, Fence, LeaderInfo, Leadership, Store};
pub use local::LocalElector;

/// Counts one election event in `gnomon_leader_election_total`.
pub fn count_election(backend: &'static str, result: &'static str) {
    metrics::counter!("gnomon_leader_election_total", "backend" => backend, "result" => result).increment(1);
}

/// A duration of `base` ± 25 %, so candidates do not retry in lockstep.
pub(crate) fn jitter(base: Duration) -> Duration {
    use rand::Rng;
    let f: f64 = rand::thread_rng().gen_range(0.75..1.25);
    base.mul_f64(f)
}

/// Settings shared by every elector.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// How long a silent leader keeps its lease or lock: the etcd lease TTL,
    /// the MySQL `wait_timeout` and the PostgreSQL `idle_session_timeout` of
    /// the lock connection.
    pub ttl: Duration,
    /// How often a lock holder pings its connection.
    pub ping_every: Duration,
    /// Retry delay (jittered ±25 %) after a failed lock call (seed: 2 s).
    pub retry: Duration,
}

impl Default for ElectionConfig {
    fn default() -> Self {
        Self { ttl: Duration::from_secs(5), ping_every: Duration::from_secs(1), retry: Duration::from_secs(2) }
    }
}

impl ElectionConfig {
    /// A ping that takes longer than this means we can no longer be sure we
    /// hold the lock.
    pub fn ping_timeout(&self) -> Duration {
        (self.ttl / 2).clamp(Duration::from_millis(500), Duration::from_secs(2))
    }
}

/// One dedicated connection that can hold the election lock.
#[async_trait]
pub trait LockSession: Send {
    /// Tries to take the lock, waiting up to `wait` for a holder to release it.
    async fn acquire(&mut self, wait: Duration) -> Result<bool, String>;
    /// Whether this connection still holds the lock.
    async fn holds(&mut self) -> Result<bool, String>;
    async fn release(&mut self) -> Result<(), String>;
}

/// Opens lock sessions for one scope.
#[async_trait]
pub trait LockConnector: Send + Sync + std::fmt::Debug {
    fn backend(&self) -> &'static str;
    async fn connect(&self, scope: &str) -> Result<Box<dyn LockSession>, String>;
}

/// An elector over a database lock held on a dedicated connection.
#[derive(Debug)]
pub struct DbLockElector {
    connector: Arc<dyn LockConnector>,
    store: Arc<dyn Store>,
    config: ElectionConfig,
    terms: Mutex<HashMap<u64, oneshot::Sender<()>>>,
}

/// How long one lock call waits before the candidate re-checks its state.
const LOCK_WAIT: Duration = Duration::from_secs(1);

impl DbLockElector {
    pub fn new(connector: Arc<dyn LockConnector>, store: Arc<dyn Store>, config: ElectionConfig) -> Self {
        Self { connector, store, config, terms: Mutex::new(HashMap::new()) }
    }

    /// Takes the lock once and releases it: a start-up check that this
    /// database user may use the lock functions at all.
    pub async fn probe(&self) -> Result<(), ElectionError> {
        let backend = self.connector.backend();
        let mut s = self.connector.connect("probe").await.map_err(ElectionError::Refused)?;
        match s.acquire(Duration::ZERO).await {
            Ok(_) => {}
            Err(e) => return Err(ElectionError::Refused(format!("the {backend} election lock cannot be used by this database user: {e}"))),
        }
        let _ = s.release().await;
        Ok(())
    }

    async fn hold_lock(&self, scope: &str) -> Box<dyn LockSession> {
        let backend = self.connector.backend();
        let mut contended = false;
        loop {
            let mut session = match tokio::time::timeout(self.config.ttl + LOCK_WAIT, self.connector.connect(scope)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    count_election(backend, "error");
                    tracing::warn!(backend, error = %e, "election: cannot open the lock connection; retrying");
                    tokio::time::sleep(jitter(self.config.retry)).await;
                    continue;
                }
                Err(_) => {
                    count_election(backend, "error");
                    tracing::warn!(backend, "election: opening the lock connection timed out; retrying");
                    tokio::time::sleep(jitter(self.config.retry)).await;
                    continue;
                }
            };
            loop {
                match tokio::time::timeout(LOCK_WAIT + self.config.ping_timeout(), session.acquire(LOCK_WAIT)).await {
                    Ok(Ok(true)) => return session,
                    Ok(Ok(false)) => {
                        if !contended {
                            contended = true;
                            count_election(backend, "contended");
                            tracing::info!(backend, scope, "election: another server leads; waiting on the lock");
                        }
                    }
                    Ok(Err(e)) => {
                        count_election(backend, "error");
                        tracing::warn!(backend, error = %e, "election: lock call failed; reconnecting");
                        tokio::time::sleep(jitter(self.config.retry)).await;
                        break;
                    }
                    Err(_) => {
                        count_election(backend, "error");
                        tracing::warn!(backend, "election: lock call timed out; reconnecting");
                        tokio::time::sleep(jitter(self.config.retry)).await;
                        break;
                    }
                }
            }
        }
    }
}

#[async_trait]
impl Elector for DbLockElector {
    fn backend(&self) -> &'static str {
        self.connector.backend()
    }

    async fn campaign(&self, scope: &str, me: &LeaderInfo) -> Result<Leadership, ElectionError> {
        let backend = self.connector.backend();
        let mut session = self.hold_lock(scope).await;
        // Holding the lock: a new term. The token is the store's epoch,
        // bumped now, and fenced before any leader work.
        let fenced = async {
            let token = self.store.next_epoch(scope).await?;
            let info = LeaderInfo { backend: backend.into(), ..me.clone() };
            self.store.fence(&Fence { scope: scope.to_string(), token }, &info, gnomon_core::chrono::Utc::now().timestamp_millis()).await?;
            Ok::<u64, ElectionError>(token)
        }
        .await;
        let token = match fenced {
            Ok(t) => t,
            Err(e) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), session.release()).await;
                return Err(e);
            }
        };
        let (lost_tx, lost_rx) = watch::channel(false);
        let (resign_tx, mut resign_rx) = oneshot::channel::<()>();
        self.terms.lock().unwrap_or_else(|p| p.into_inner()).insert(token, resign_tx);
        let config = self.config.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(config.ping_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let verdict = match tokio::time::timeout(config.ping_timeout(), session.holds()).await {
                            Ok(Ok(true)) => None,
                            Ok(Ok(false)) => Some("the lock is no longer held by this connection".to_string()),
                            Ok(Err(e)) => Some(format!("ping failed: {e}")),
                            Err(_) => Some(format!("ping took longer than {:?}", config.ping_timeout())),
                        };
                        if let Some(why) = verdict {
                            tracing::warn!(backend, token, why, "election: leadership lost");
                            let _ = lost_tx.send(true);
                            // Dropping the connection releases whatever the
                            // server still thinks we hold.
                            return;
                        }
                    }
                    _ = &mut resign_rx => {
                        let _ = tokio::time::timeout(Duration::from_secs(1), session.release()).await;
                        let _ = lost_tx.send(true);
                        return;
                    }
                }
            }
        });
        Ok(Leadership { scope: scope.to_string(), token, lost: lost_rx })
    }

    async fn resign(&self, leadership: &Leadership) -> Result<(), ElectionError> {
        let tx = self.terms.lock().unwrap_or_else(|p| p.into_inner()).remove(&leadership.token);
        if let Some(tx) = tx {
            let _ = tx.send(());
        }
        // Wait (briefly) until the holder task has let go of the lock.
        let mut lost = leadership.lost.clone();
        let _ = tokio::time::timeout(Duration::from_secs(2), lost.wait_for(|l| *l)).await;
        Ok(())
    }
}

/// The degradation to the local elector, opt-in with `--election-fallback local`: when
/// the primary elector cannot be reached, lead locally (with a `WARN` and
/// `gnomon_leader_election_total{result="fallback_local"}`) instead of
/// waiting. Two servers that both fall back both lead; the store's fencing
/// keeps their writes apart, but they do not coordinate.
#[derive(Debug)]
pub struct FallbackElector {
    primary: Arc<dyn Elector>,
    local: LocalElector,
    local_terms: Mutex<Vec<u64>>,
}

impl FallbackElector {
    pub fn new(primary: Arc<dyn Elector>, store: Arc<dyn Store>) -> Self {
        Self { primary, local: LocalElector::new(store), local_terms: Mutex::new(Vec::new()) }
    }

    /// Leads locally: the degradation itself.
    pub async fn fall_back(&self, scope: &str, me: &LeaderInfo, why: &str) -> Result<Leadership, ElectionError> {
        let backend = self.primary.backend();
        tracing::warn!(
            backend,
            why,
            "election backend unreachable: FALLING BACK TO THE LOCAL ELECTOR (no mutual exclusion between servers)"
        );
        count_election(backend, "fallback_local");
        let l = self.local.campaign(scope, me).await?;
        self.local_terms.lock().unwrap_or_else(|p| p.into_inner()).push(l.token);
        Ok(l)
    }
}

#[async_trait]
impl Elector for FallbackElector {
    fn backend(&self) -> &'static str {
        self.primary.backend()
    }

    async fn campaign(&self, scope: &str, me: &LeaderInfo) -> Result<Leadership, ElectionError> {
        match self.primary.campaign(scope, me).await {
            Err(ElectionError::Unavailable(why)) => self.fall_back(scope, me, &why).await,
            other => other,
        }
    }

    async fn resign(&self, leadership: &Leadership) -> Result<(), ElectionError> {
        let local = {
            let mut terms = self.local_terms.lock().unwrap_or_else(|p| p.into_inner());
            let before = terms.len();
            terms.retain(|t| *t != leadership.token);
            terms.len() != before
        };
        if local {
            self.local.resign(leadership).await
        } else {
            self.primary.resign(leadership).await
        }
    }

    async fn current_leader(&self, scope: &str) -> Option<String> {
        self.primary.current_leader(scope).await
    }
}

/// FNV-1a, for lock names and keys derived from a scope.
pub(crate) fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_a_quarter() {
        for _ in 0..1000 {
            let d = jitter(Duration::from_secs(2));
            assert!(d >= Duration::from_millis(1500) && d <= Duration::from_millis(2500), "{d:?}");
        }
    }

    #[test]
    fn ping_timeout_is_bounded() {
        let c = |s| ElectionConfig { ttl: Duration::from_secs(s), ..Default::default() };
        assert_eq!(c(1).ping_timeout(), Duration::from_millis(500));
        assert_eq!(c(3).ping_timeout(), Duration::from_millis(1500));
        assert_eq!(c(60).ping_timeout(), Duration::from_secs(2));
    }
}

/// `--election`: which elector a server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElectionKind {
    /// etcd if endpoints are given, else the store's own lock, else local.
    Auto,
    Etcd,
    MySql,
    Postgres,
    Local,
}

impl std::str::FromStr for ElectionKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => Self::Auto,
            "etcd" => Self::Etcd,
            "mysql" | "mariadb" => Self::MySql,
            "postgres" | "postgresql" => Self::Postgres,
            "local" => Self::Local,
            _ => return Err(format!("--election {s:?} is not one of: auto, etcd, mysql, postgres, local")),
        })
    }
}

/// What a server does when etcd cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Keep campaigning as a follower; never become a second leader.
    None,
    /// The degraded mode: lead locally (logged, counted).
    Local,
}

impl std::str::FromStr for Fallback {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "local" => Ok(Self::Local),
            _ => Err(format!("--election-fallback {s:?} is not one of: none, local")),
        }
    }
}

/// The elector a server will build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElectionPlan {
    Etcd {
        fallback_local: bool,
    },
    /// The store's database lock (`GET_LOCK` or an advisory lock).
    StoreLock,
    Local,
}

/// Decides the elector from the flags and the store (`sqlite`, `mysql`,
/// `postgres`), refusing combinations that could make two leaders or that
/// do not make sense, with a message that says what to do instead.
pub fn plan_election(
    kind: ElectionKind,
    etcd_given: bool,
    store: crate::StoreKind,
    fallback: Fallback,
    single_server: bool,
) -> Result<ElectionPlan, String> {
    use crate::StoreKind;
    let shared = store.is_shared();
    if store == StoreKind::Etcd && fallback == Fallback::Local {
        return Err("--election-fallback local makes no sense with the etcd store: without etcd there is no store either".into());
    }
    let plan = match kind {
        ElectionKind::Auto if etcd_given || store == StoreKind::Etcd => ElectionPlan::Etcd { fallback_local: fallback == Fallback::Local },
        ElectionKind::Auto if shared => ElectionPlan::StoreLock,
        ElectionKind::Auto => ElectionPlan::Local,
        ElectionKind::Etcd if !etcd_given && store != StoreKind::Etcd => return Err("--election etcd needs the etcd endpoints: --etcd host:2379,host:2379,…".into()),
        ElectionKind::Etcd => ElectionPlan::Etcd { fallback_local: fallback == Fallback::Local },
        ElectionKind::MySql if store != StoreKind::MySql => {
            return Err(format!("--election mysql takes GET_LOCK in the store's database, but the store is {store}; use a mysql:// store or --election auto"))
        }
        ElectionKind::Postgres if store != StoreKind::Postgres => {
            return Err(format!("--election postgres takes an advisory lock in the store's database, but the store is {store}; use a postgres:// store or --election auto"))
        }
        ElectionKind::MySql | ElectionKind::Postgres => ElectionPlan::StoreLock,
        ElectionKind::Local => ElectionPlan::Local,
    };
    if etcd_given && !matches!(plan, ElectionPlan::Etcd { .. }) {
        return Err(format!("--etcd was given but --election is {kind:?}: drop one of them"));
    }
    if fallback == Fallback::Local && !matches!(plan, ElectionPlan::Etcd { .. }) {
        return Err("--election-fallback local only applies to the etcd elector (it is what etcd degrades to)".into());
    }
    if plan == ElectionPlan::Local && shared && !single_server {
        return Err(format!(
            "the local elector on a shared {store} store would make every server that uses this database a leader: use --election auto \
             (the {store} lock) or --etcd, or pass --single-server if this is the only gnomon server on this database"
        ));
    }
    Ok(plan)
}

#[cfg(test)]
mod plan_tests {
    use super::*;
    use crate::StoreKind;
    use ElectionKind::*;

    #[test]
    fn the_factory_chain_of_seed_000() {
        assert_eq!(plan_election(Auto, true, StoreKind::Postgres, Fallback::None, false), Ok(ElectionPlan::Etcd { fallback_local: false }));
        assert_eq!(plan_election(Auto, true, StoreKind::Sqlite, Fallback::Local, false), Ok(ElectionPlan::Etcd { fallback_local: true }));
        assert_eq!(plan_election(Auto, false, StoreKind::MySql, Fallback::None, false), Ok(ElectionPlan::StoreLock));
        assert_eq!(plan_election(Auto, false, StoreKind::Postgres, Fallback::None, false), Ok(ElectionPlan::StoreLock));
        assert_eq!(plan_election(Auto, false, StoreKind::Sqlite, Fallback::None, false), Ok(ElectionPlan::Local));
        assert_eq!(plan_election(MySql, false, StoreKind::MySql, Fallback::None, false), Ok(ElectionPlan::StoreLock));
    }

    #[test]
    fn unsafe_or_senseless_combinations_are_refused() {
        let e = plan_election(Local, false, StoreKind::MySql, Fallback::None, false).unwrap_err();
        assert!(e.contains("every server") && e.contains("--single-server"), "{e}");
        assert_eq!(plan_election(Local, false, StoreKind::MySql, Fallback::None, true), Ok(ElectionPlan::Local));
        assert!(plan_election(Etcd, false, StoreKind::Sqlite, Fallback::None, false).unwrap_err().contains("--etcd"));
        assert!(plan_election(MySql, false, StoreKind::Postgres, Fallback::None, false).unwrap_err().contains("mysql://"));
        assert!(plan_election(Postgres, false, StoreKind::Sqlite, Fallback::None, false).is_err());
        assert!(plan_election(Auto, false, StoreKind::MySql, Fallback::Local, false).unwrap_err().contains("only applies to the etcd"));
        assert!(plan_election(Local, true, StoreKind::Sqlite, Fallback::None, false).unwrap_err().contains("--etcd was given"));
        assert_eq!(plan_election(Auto, false, StoreKind::Etcd, Fallback::None, false), Ok(ElectionPlan::Etcd { fallback_local: false }));
        assert_eq!(plan_election(Etcd, false, StoreKind::Etcd, Fallback::None, false), Ok(ElectionPlan::Etcd { fallback_local: false }));
        assert!(plan_election(Auto, false, StoreKind::Etcd, Fallback::Local, false).unwrap_err().contains("etcd store"));
        assert!(plan_election(Local, false, StoreKind::Etcd, Fallback::None, false).unwrap_err().contains("--single-server"));
        assert!("raft".parse::<ElectionKind>().is_err());
        assert!("maybe".parse::<Fallback>().is_err());
    }
}
