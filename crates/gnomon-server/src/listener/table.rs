//! The table of open connections, counted per client address: who is
//! admitted, who is shed to make room, and what each connection's own task
//! watches (requests in flight, idle time, a request to close).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The address a client is counted under: IPv4 as is, IPv6 by its /64.
pub(super) fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

/// One open connection, as the table and its own task see it.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) id: u64,
    pub(super) client: IpAddr,
    pub(super) opened: Instant,
    /// Requests whose answer is not finished (a stream counts until it ends).
    pub(super) in_flight: AtomicUsize,
    /// Whether a request ever started.
    pub(super) served: AtomicBool,
    /// Milliseconds after `opened` when the last request finished.
    pub(super) idle_since_ms: AtomicU64,
    /// Asked to close (to make room, or at shutdown).
    pub(super) shed: Notify,
}

impl Conn {
    pub(super) fn idle(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0
    }

    /// Whether this connection has been idle past its allowance: the first
    /// request's (`first`) or the one between requests (`between`).
    pub(super) fn expired(&self, now: Instant, first: Duration, between: Duration) -> bool {
        if !self.idle() {
            return false;
        }
        if !self.served.load(Ordering::SeqCst) {
            return now.duration_since(self.opened) >= first;
        }
        let since = self.opened + Duration::from_millis(self.idle_since_ms.load(Ordering::SeqCst));
        now.saturating_duration_since(since) >= between
    }
}

/// A request in flight on a connection (dropped with its answer's body).
pub(super) struct Busy(pub(super) Arc<Conn>);

impl Busy {
    pub(super) fn new(conn: Arc<Conn>) -> Self {
        conn.served.store(true, Ordering::SeqCst);
        conn.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(conn)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let ms = self.0.opened.elapsed().as_millis().min(u64::MAX as u128) as u64;
        self.0.idle_since_ms.store(ms, Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Debug, Default)]
pub(super) struct Inner {
    pub(super) next_id: u64,
    pub(super) conns: HashMap<u64, Arc<Conn>>,
    pub(super) per_client: HashMap<IpAddr, usize>,
    /// Refusals since the last warning, and when it was logged.
    pub(super) refused: u64,
    pub(super) warned: Option<Instant>,
}

impl Inner {
    pub(super) fn evict(&mut self, id: u64) -> Option<Arc<Conn>> {
        let c = self.conns.remove(&id)?;
        if let Some(n) = self.per_client.get_mut(&c.client) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&c.client);
            }
        }
        Some(c)
    }
}

/// Every open connection, by client: the limits are enforced here.
#[derive(Debug)]
pub(super) struct Table {
    pub(super) inner: Mutex<Inner>,
    pub(super) emptied: Notify,
    pub(super) max: usize,
    pub(super) per_client: usize,
}

impl Table {
    pub(super) fn new(max: usize, per_client: usize) -> Self {
        Table { inner: Mutex::default(), emptied: Notify::new(), max: max.max(1), per_client: per_client.max(1) }
    }

    /// Room for a new connection from `client`: making it by shedding an
    /// idle connection if a limit is reached, or a refusal saying why.
    pub(super) fn admit(&self, client: IpAddr) -> Result<Arc<Conn>, String> {
        let mut t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let held = t.per_client.get(&client).copied().unwrap_or(0);
        let victim = if held >= self.per_client {
            // The client's own oldest idle connection.
            match t.conns.values().filter(|c| c.client == client && c.idle()).min_by_key(|c| (c.opened, c.id)) {
                Some(v) => Some(v.id),
                None => {
                    return Err(format!("{client} holds {held} connections, all busy (--max-connections-per-client {})", self.per_client))
                }
            }
        } else if t.conns.len() >= self.max {
            // The oldest idle connection of the client holding the most.
            let counts = &t.per_client;
            match t
                .conns
                .values()
                .filter(|c| c.idle())
                .max_by_key(|c| (counts.get(&c.client).copied().unwrap_or(0), std::cmp::Reverse((c.opened, c.id))))
            {
                Some(v) => Some(v.id),
                None => return Err(format!("{} connections open, all busy (--max-connections {})", t.conns.len(), self.max)),
            }
        } else {
            None
        };
        if let Some(v) = victim.and_then(|id| t.evict(id)) {
            tracing::debug!(client = %v.client, "closing an idle connection to make room for a new one");
            metrics::counter!("gnomon_connections_closed_total", "reason" => "shed").increment(1);
            v.shed.notify_one();
        }
        t.next_id += 1;
        let conn = Arc::new(Conn {
            id: t.next_id,
            client,
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            shed: Notify::new(),
        });
        t.conns.insert(conn.id, conn.clone());
        *t.per_client.entry(client).or_default() += 1;
        Ok(conn)
    }

    pub(super) fn leave(&self, id: u64) {
        let mut t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        t.evict(id);
        if t.conns.is_empty() {
            self.emptied.notify_waiters();
        }
    }

    /// Logs a refusal, at most one line every 10 s.
    pub(super) fn refused(&self, why: &str) {
        metrics::counter!("gnomon_connections_closed_total", "reason" => "refused").increment(1);
        let mut t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        t.refused += 1;
        if t.warned.is_none_or(|w| w.elapsed() >= Duration::from_secs(10)) {
            tracing::warn!(refused = t.refused, "new connection closed at once: {why}");
            t.refused = 0;
            t.warned = Some(Instant::now());
        }
    }

    pub(super) async fn wait_empty(&self) {
        loop {
            let notified = self.emptied.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.lock().unwrap_or_else(|e| e.into_inner()).conns.is_empty() {
                return;
            }
            notified.await;
        }
    }
}

/// Takes a connection out of the table when its task ends, however it ends.
pub(super) struct Leave(pub(super) Arc<Table>, pub(super) u64);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0.leave(self.1);
    }
}
