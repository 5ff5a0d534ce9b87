//! Live output: what running attempts have written so far, as their workers
//! stream it (`Output` messages), kept on the leader for readers
//! (`GET /v1/runs/{id}/output`, `gnomon run logs -f`, the console).
//!
//! Owned here, written only by the leader (for attempts it has live on the
//! worker that sends), read by the API. It is memory only and best effort:
//! a new leader starts empty and shows what arrives from then on; the
//! output kept with an ended attempt (its last 64 KiB) is the record.
//!
//! # Invariants
//! - An attempt keeps at most [`LIVE_BYTES_PER_ATTEMPT`]; all attempts
//!   together at most [`LIVE_BYTES_TOTAL`] (the least recently written
//!   attempts are forgotten first).
//! - Offsets are this log's own: every byte appended (markers included)
//!   moves `end` by one, so a reader's cursor only moves forward. Bytes a
//!   worker dropped (a gap in its offsets) become one marker line; bytes
//!   it sends twice (a piece re-sent after a reconnect) are appended once.
//! - A read never starts or ends inside a UTF-8 character.
//! - A log outlives its attempt by [`LIVE_KEEP_ENDED_MS`] (or until the
//!   run's next attempt starts), so a reader following it reads on to its
//!   very end: a worker sends the rest of an attempt's output ahead of its
//!   report.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Most bytes kept per live attempt (the newest).
pub const LIVE_BYTES_PER_ATTEMPT: usize = 64 * 1024;
/// Most bytes kept for all live attempts together.
pub const LIVE_BYTES_TOTAL: usize = 32 * 1024 * 1024;
/// Most bytes one read returns.
pub const LIVE_READ_MAX: usize = 64 * 1024;
/// Most bytes of `data` the leader takes from one `Output` piece.
pub const LIVE_PIECE_MAX: usize = 16 * 1024;
/// How long an ended attempt's log stays readable.
pub const LIVE_KEEP_ENDED_MS: Millis = 60_000;

use gnomon_core::Millis;

/// The live logs of one leader term. Cheap to clone.
#[derive(Clone, Default, Debug)]
pub struct LiveOutputs(Arc<Mutex<Inner>>);

#[derive(Default, Debug)]
struct Inner {
    /// By run: a run has at most one live attempt.
    logs: HashMap<String, Log>,
    bytes: usize,
    /// Write counter: the last write of each log, for eviction.
    clock: u64,
    /// When ended logs are next looked at for expiry.
    next_sweep: Millis,
}

#[derive(Default, Debug)]
struct Log {
    attempt: u32,
    /// This log's offset of `buf[0]`.
    start: u64,
    buf: VecDeque<u8>,
    /// The worker's offset just past the last byte taken from it.
    worker_end: u64,
    touched: u64,
    /// When its attempt ended (the log is kept a while for readers).
    ended_at: Option<Millis>,
}

impl Log {
    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }
}

/// What a read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRead {
    /// Where `text` starts (at or after the requested `from`).
    pub from: u64,
    /// Where the next read should start.
    pub next: u64,
    /// Bytes between the requested `from` and `from` that are no longer
    /// kept.
    pub skipped: u64,
    pub text: String,
}

impl LiveOutputs {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts an attempt's log, unless it has one (a log of an earlier
    /// attempt of the run is replaced); appends go only to started logs.
    pub fn start(&self, run_id: &str, attempt: u32, now: Millis) {
        let mut inner = self.lock();
        inner.sweep(now);
        inner.clock += 1;
        let touched = inner.clock;
        if inner.logs.get(run_id).is_some_and(|l| l.attempt == attempt) {
            return;
        }
        if let Some(old) = inner.logs.insert(run_id.to_string(), Log { attempt, touched, ..Log::default() }) {
            inner.bytes -= old.buf.len();
        }
    }

    /// Appends a piece the worker sent at its `offset`. Pieces of
    /// attempts without a started log are ignored.
    pub fn append(&self, run_id: &str, attempt: u32, offset: u64, data: &[u8], now: Millis) {
        let data = &data[..data.len().min(LIVE_PIECE_MAX)];
        let mut inner = self.lock();
        inner.sweep(now);
        inner.clock += 1;
        let touched = inner.clock;
        let Some(log) = inner.logs.get_mut(run_id).filter(|l| l.attempt == attempt && l.ended_at.is_none()) else { return };
        let piece_end = offset.saturating_add(data.len() as u64);
        if piece_end <= log.worker_end {
            return; // sent before
        }
        let mut added = 0usize;
        let data = if offset < log.worker_end {
            &data[usize::try_from(log.worker_end - offset).unwrap_or(data.len()).min(data.len())..]
        } else {
            if offset > log.worker_end {
                let marker = format!("\n[gnomon: {} bytes of output dropped by the worker]\n", offset - log.worker_end);
                log.buf.extend(marker.as_bytes());
                added += marker.len();
            }
            data
        };
        log.buf.extend(data);
        added += data.len();
        log.worker_end = piece_end;
        log.touched = touched;
        let excess = log.buf.len().saturating_sub(LIVE_BYTES_PER_ATTEMPT);
        log.buf.drain(..excess);
        log.start += excess as u64;
        inner.bytes = inner.bytes + added - excess;
        while inner.bytes > LIVE_BYTES_TOTAL {
            let Some(oldest) = inner.logs.iter().min_by_key(|(_, l)| l.touched).map(|(k, _)| k.clone()) else { break };
            if let Some(l) = inner.logs.remove(&oldest) {
                inner.bytes -= l.buf.len();
            }
        }
    }

    /// Ends a run's log (its attempt ended, or was taken from its
    /// worker): it takes nothing more, and is forgotten
    /// [`LIVE_KEEP_ENDED_MS`] later.
    pub fn end(&self, run_id: &str, now: Millis) {
        let mut inner = self.lock();
        if let Some(l) = inner.logs.get_mut(run_id) {
            l.ended_at.get_or_insert(now);
        }
        inner.sweep(now);
    }

    /// Whether the attempt's log is kept and its attempt runs.
    pub fn is_live(&self, run_id: &str, attempt: u32) -> bool {
        self.live_attempt(run_id) == Some(attempt)
    }

    /// The run's running attempt with a log, if any.
    pub fn live_attempt(&self, run_id: &str) -> Option<u32> {
        self.lock().logs.get(run_id).filter(|l| l.ended_at.is_none()).map(|l| l.attempt)
    }

    /// Up to [`LIVE_READ_MAX`] bytes of an attempt's log from `from`
    /// (running, or ended and still kept); `None` when it is not kept.
    pub fn read(&self, run_id: &str, attempt: u32, from: u64) -> Option<LiveRead> {
        let inner = self.lock();
        let log = inner.logs.get(run_id).filter(|l| l.attempt == attempt)?;
        let end = log.end();
        let mut at = from.clamp(log.start, end);
        let skipped = at.saturating_sub(from);
        let index = |o: u64| usize::try_from(o - log.start).unwrap_or(0);
        // Not inside a character: skip continuation bytes.
        while at < end && is_continuation(log.buf[index(at)]) {
            at += 1;
        }
        let mut stop = end.min(at + LIVE_READ_MAX as u64);
        // Not past a character's start whose rest is not here.
        let mut back = stop;
        while back > at && is_continuation(log.buf[index(back - 1)]) {
            back -= 1;
        }
        if back > at {
            let lead = log.buf[index(back - 1)];
            if char_len(lead) > usize::try_from(stop - back + 1).unwrap_or(0) {
                stop = back - 1;
            }
        }
        let bytes: Vec<u8> = log.buf.range(index(at)..index(stop)).copied().collect();
        Some(LiveRead { from: at, next: stop, skipped, text: String::from_utf8_lossy(&bytes).into_owned() })
    }

    /// Bytes kept now, for all attempts.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

impl Inner {
    /// Forgets ended logs past their keep (looked at every few seconds).
    fn sweep(&mut self, now: Millis) {
        if now < self.next_sweep {
            return;
        }
        self.next_sweep = now + 5_000;
        let before = self.logs.len();
        let mut freed = 0;
        self.logs.retain(|_, l| {
            let keep = l.ended_at.is_none_or(|at| now - at < LIVE_KEEP_ENDED_MS);
            if !keep {
                freed += l.buf.len();
            }
            keep
        });
        if self.logs.len() != before {
            self.bytes -= freed;
        }
    }
}

fn is_continuation(b: u8) -> bool {
    b & 0b1100_0000 == 0b1000_0000
}

/// The length of the character a lead byte starts (1 for ASCII and for a
/// byte that starts none).
fn char_len(lead: u8) -> usize {
    match lead {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(l: &LiveOutputs, from: u64) -> LiveRead {
        l.read("r", 1, from).expect("live")
    }

    #[test]
    fn appends_in_order_skip_repeats_and_mark_gaps() {
        let l = LiveOutputs::default();
        l.append("r", 1, 0, b"ignored: not started", 0);
        assert!(l.read("r", 1, 0).is_none());
        l.start("r", 1, 0);
        l.append("r", 1, 0, b"hello ", 0);
        l.append("r", 1, 0, b"hello ", 0); // re-sent
        l.append("r", 1, 3, b"lo world\n", 0); // overlaps
        assert_eq!(text(&l, 0).text, "hello world\n");
        l.append("r", 1, 100, b"late\n", 0);
        let r = text(&l, 12);
        assert_eq!(r.text, "\n[gnomon: 88 bytes of output dropped by the worker]\nlate\n");
        assert_eq!(r.next, 12 + r.text.len() as u64);
        assert_eq!(text(&l, r.next).text, "");
        // A later attempt replaces the log.
        l.start("r", 2, 0);
        assert!(l.read("r", 1, 0).is_none());
        assert_eq!(l.read("r", 2, 0).unwrap().text, "");
        l.end("r", 1_000);
        assert!(!l.is_live("r", 2));
        // Ended, it is still read (to its end) for a while, and takes no more.
        l.append("r", 2, 0, b"late", 1_000);
        assert_eq!(l.read("r", 2, 0).map(|r| r.text), Some(String::new()));
        l.start("s", 1, 1_000 + LIVE_KEEP_ENDED_MS);
        assert!(l.read("r", 2, 0).is_none(), "forgotten after its keep");
        assert_eq!(l.bytes(), 0);
    }

    #[test]
    fn keeps_the_newest_bytes_of_each_attempt_and_a_total() {
        let l = LiveOutputs::default();
        l.start("r", 1, 0);
        let mut off = 0u64;
        for _ in 0..10 {
            let piece = vec![b'a'; LIVE_PIECE_MAX];
            l.append("r", 1, off, &piece, 0);
            off += piece.len() as u64;
        }
        let r = text(&l, 0);
        assert_eq!(r.skipped, off - LIVE_BYTES_PER_ATTEMPT as u64);
        assert_eq!(r.text.len(), LIVE_BYTES_PER_ATTEMPT);
        assert_eq!(l.bytes(), LIVE_BYTES_PER_ATTEMPT);
        // Over the total, the least recently written go first.
        let n = LIVE_BYTES_TOTAL / LIVE_BYTES_PER_ATTEMPT + 1;
        for i in 0..n {
            let run = format!("x{i}");
            l.start(&run, 1, 0);
            for k in 0..4u64 {
                l.append(&run, 1, k * LIVE_PIECE_MAX as u64, &[b'b'; LIVE_PIECE_MAX], 0);
            }
        }
        assert!(l.bytes() <= LIVE_BYTES_TOTAL);
        assert!(!l.is_live("r", 1), "the oldest went first");
        assert!(l.is_live(&format!("x{}", n - 1), 1));
    }

    #[test]
    fn a_read_never_cuts_a_character() {
        let l = LiveOutputs::default();
        l.start("r", 1, 0);
        let s = "é".repeat(40_000); // 80,000 bytes
        let mut off = 0u64;
        for chunk in s.as_bytes().chunks(LIVE_PIECE_MAX - 1) {
            l.append("r", 1, off, chunk, 0);
            off += chunk.len() as u64;
        }
        // The kept window starts mid-character (80,000 - 65,536 is even,
        // but the cursor below is odd).
        let r = text(&l, 14_465);
        assert!(r.text.chars().all(|c| c == 'é'), "{:?}", &r.text[..8]);
        let r2 = text(&l, r.next);
        assert!(r2.text.chars().all(|c| c == 'é'));
        // A piece that ends inside a character holds it back.
        l.start("q", 1, 0);
        l.append("q", 1, 0, &"aé".as_bytes()[..2], 0);
        let q = l.read("q", 1, 0).unwrap();
        assert_eq!((q.text.as_str(), q.next), ("a", 1));
        l.append("q", 1, 2, &"aé".as_bytes()[2..], 0);
        assert_eq!(l.read("q", 1, q.next).unwrap().text, "é");
    }
}
