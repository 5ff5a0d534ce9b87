//! A watch that survives broken streams and compaction: every etcd watch of
//! the store and the election is one [`Resumable`].
//!
//! - **Resume**: it remembers the next revision it needs — the last event
//!   revision seen + 1, or, from a progress notification, the response
//!   header's revision + 1 — and re-watches from there when the stream
//!   breaks, is cancelled or is cut, so no event is lost or seen twice.
//!   Only events and progress notifications move it: the header of a
//!   response carrying events may be ahead of them (etcd sends a catching-up
//!   watcher its history in batches, each headed by the current revision).
//! - **Progress**: every watch asks for progress notifications, so an idle
//!   watch (nothing written under its key) still learns the current revision
//!   and resumes from near it, not from a revision compaction may since have
//!   removed. etcd sends them every `--experimental-watch-progress-notify-interval`
//!   (10 minutes by default).
//! - **Compaction**: when its start revision has been compacted the watch
//!   says so ([`Next::Reload`]); the owner re-reads the current state in
//!   full and hands back the revision of that read
//!   ([`Resumable::reloaded`]), and the watch goes on from the next one.
//!   It never re-watches a compacted revision.
//!
//! [`WatchStats`] counts the streams opened and the reloads, and can cut the
//! current stream, for tests and the `gnomon_etcd_watch_*` metrics.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Event, WatchOptions, WatchResponse, WatchStream, Watcher};

/// How long opening a watch may take.
const OPEN_WITHIN: Duration = Duration::from_secs(3);
/// The wait before re-watching after a failed open.
const REOPEN_AFTER_FAILURE: Duration = Duration::from_millis(500);
/// The wait before re-watching after a stream broke or was cancelled.
const REOPEN_AFTER_BREAK: Duration = Duration::from_millis(200);

/// What a watch has done: streams opened, full re-reads after compaction,
/// the revision it knows; and a way to cut its stream.
#[derive(Debug, Default)]
pub struct WatchStats {
    opened: AtomicU64,
    reloads: AtomicU64,
    revision: AtomicI64,
    cut: tokio::sync::Notify,
}

impl WatchStats {
    /// Watch streams opened (the first included).
    #[cfg(test)]
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::SeqCst)
    }

    /// Full re-reads asked for because the start revision was compacted.
    #[cfg(test)]
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::SeqCst)
    }

    /// The revision the watch has seen everything up to (0 before any).
    #[cfg(test)]
    pub fn revision(&self) -> i64 {
        self.revision.load(Ordering::SeqCst)
    }

    /// Drops the current stream as if it broke (or the next one, if none
    /// is open); the watch resumes as after any break.
    #[cfg(test)]
    pub fn cut(&self) {
        self.cut.notify_one();
    }
}

/// What the owner of a [`Resumable`] must handle next.
#[derive(Debug)]
pub enum Next {
    /// Re-read the watched state in full, then call [`Resumable::reloaded`]
    /// with the revision of that read. Asked first by a watch made with
    /// [`Resumable::new`], and after a compaction.
    Reload,
    /// Events in revision order, each exactly once.
    Events(Vec<Event>),
}

/// A watch on a key (or prefix) that resumes after breaks (see the module docs).
pub struct Resumable {
    client: Client,
    key: Vec<u8>,
    options: WatchOptions,
    /// The next revision to watch from; 0 until a full read.
    from: i64,
    stream: Option<(Watcher, WatchStream)>,
    stats: Arc<WatchStats>,
    name: &'static str,
}

/// A progress notification: no events, and neither the answer to a create
/// nor a cancellation nor a compaction.
fn is_progress(r: &WatchResponse) -> bool {
    r.events().is_empty() && !r.created() && !r.canceled() && r.compact_revision() == 0
}

impl Resumable {
    /// A watch whose owner reads the state first: the first [`Resumable::next`]
    /// is [`Next::Reload`]. `options` may set a prefix, filters or prev_kv;
    /// the start revision and progress notification are the watch's own.
    /// `name` labels its metrics.
    pub fn new(client: Client, key: impl Into<Vec<u8>>, options: WatchOptions, stats: Arc<WatchStats>, name: &'static str) -> Self {
        Self { client, key: key.into(), options, from: 0, stream: None, stats, name }
    }

    /// A watch from `revision` on (the owner knows the state before it).
    pub fn starting_at(mut self, revision: i64) -> Self {
        self.from = revision.max(1);
        self.stats.revision.store(self.from - 1, Ordering::SeqCst);
        self
    }

    /// The owner has read the state in full at `revision`: watch from the next.
    pub fn reloaded(&mut self, revision: i64) {
        self.from = revision + 1;
        self.stats.revision.store(revision, Ordering::SeqCst);
    }

    fn seen(&mut self, revision: i64) {
        if revision + 1 > self.from {
            self.from = revision + 1;
            self.stats.revision.store(revision, Ordering::SeqCst);
        }
    }

    async fn open(&mut self) -> bool {
        let opts = self.options.clone().with_start_revision(self.from).with_progress_notify();
        let watched = tokio::time::timeout(OPEN_WITHIN, self.client.watch(self.key.clone(), Some(opts))).await;
        self.stats.opened.fetch_add(1, Ordering::SeqCst);
        metrics::counter!("gnomon_etcd_watch_opened_total", "watch" => self.name).increment(1);
        match watched {
            Ok(Ok(w)) => {
                self.stream = Some(w);
                true
            }
            Ok(Err(e)) => {
                tracing::debug!(watch = self.name, error = %e, from = self.from, "etcd watch: cannot open; retrying");
                false
            }
            Err(_) => false,
        }
    }

    /// Waits for what the owner must handle next. Cancel-safe: dropping
    /// the future loses nothing the watch has not handed out.
    pub async fn next(&mut self) -> Next {
        loop {
            if self.from == 0 {
                return Next::Reload;
            }
            if self.stream.is_none() && !self.open().await {
                tokio::time::sleep(REOPEN_AFTER_FAILURE).await;
                continue;
            }
            let Some((_, stream)) = self.stream.as_mut() else { continue };
            let msg = tokio::select! {
                // A cut drops the stream even with answers waiting in it.
                biased;
                _ = self.stats.cut.notified() => Ok(None),
                m = stream.message() => m,
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) | Err(_) => {
                    self.stream = None;
                    tokio::time::sleep(REOPEN_AFTER_BREAK).await;
                    continue;
                }
            };
            if resp.compact_revision() > 0 {
                tracing::warn!(
                    watch = self.name,
                    from = self.from,
                    compacted = resp.compact_revision(),
                    "etcd watch: history compacted; reading the state in full"
                );
                self.stream = None;
                self.from = 0;
                self.stats.reloads.fetch_add(1, Ordering::SeqCst);
                metrics::counter!("gnomon_etcd_watch_reloads_total", "watch" => self.name).increment(1);
                return Next::Reload;
            }
            if resp.canceled() {
                // Cancelled by etcd for another reason (e.g. the member lost
                // its leader): resume from where we are.
                tracing::debug!(watch = self.name, reason = resp.cancel_reason(), "etcd watch: cancelled; resuming");
                self.stream = None;
                tokio::time::sleep(REOPEN_AFTER_BREAK).await;
                continue;
            }
            if is_progress(&resp) {
                if let Some(h) = resp.header() {
                    self.seen(h.revision());
                }
                continue;
            }
            let events: Vec<Event> =
                resp.events().iter().filter(|e| e.kv().is_some_and(|kv| kv.mod_revision() >= self.from)).cloned().collect();
            if let Some(last) = events.iter().filter_map(|e| e.kv()).map(|kv| kv.mod_revision()).max() {
                self.seen(last);
                return Next::Events(events);
            }
        }
    }
}
