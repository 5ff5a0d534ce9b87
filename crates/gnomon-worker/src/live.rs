//! A running attempt's output on its way to the leader (`Output` pieces):
//! a bounded buffer the job writes into without ever waiting, and the
//! session takes pieces from at a bounded rate.
//!
//! # Invariants
//! - At most [`LIVE_BUFFER_BYTES`] wait to be sent; past that the oldest
//!   unsent bytes are dropped, and the next piece's offset skips them.
//! - A piece holds at most [`LIVE_PIECE_BYTES`]; the session sends at most
//!   one piece per attempt every [`LIVE_FLUSH_EVERY`] (64 KiB/s).
//! - Offsets count every byte written, sent or dropped.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most bytes waiting to be sent, per attempt.
pub const LIVE_BUFFER_BYTES: usize = 256 * 1024;
/// Most bytes per `Output` piece.
pub const LIVE_PIECE_BYTES: usize = 16 * 1024;
/// How often the session sends each attempt's next piece.
pub const LIVE_FLUSH_EVERY: Duration = Duration::from_millis(250);

/// The live output of one attempt. Cheap to clone.
#[derive(Clone, Default, Debug)]
pub struct LiveSink(Arc<Mutex<Buf>>);

#[derive(Default, Debug)]
struct Buf {
    pending: VecDeque<u8>,
    /// The offset of `pending[0]`.
    start: u64,
}

impl LiveSink {
    fn lock(&self) -> std::sync::MutexGuard<'_, Buf> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds what the job wrote; never waits.
    pub fn push(&self, bytes: &[u8]) {
        let mut b = self.lock();
        b.pending.extend(bytes);
        let excess = b.pending.len().saturating_sub(LIVE_BUFFER_BYTES);
        if excess > 0 {
            b.pending.drain(..excess);
            b.start += excess as u64;
        }
    }

    /// Everything waiting, as pieces (the attempt's end: the buffer is
    /// bounded already).
    pub fn take_all(&self) -> Vec<(u64, Vec<u8>)> {
        std::iter::from_fn(|| self.take_piece()).collect()
    }

    /// The next piece to send: its offset and at most
    /// [`LIVE_PIECE_BYTES`] bytes; `None` when nothing waits.
    pub fn take_piece(&self) -> Option<(u64, Vec<u8>)> {
        let mut b = self.lock();
        if b.pending.is_empty() {
            return None;
        }
        let n = b.pending.len().min(LIVE_PIECE_BYTES);
        let offset = b.start;
        let piece: Vec<u8> = b.pending.drain(..n).collect();
        b.start += n as u64;
        Some((offset, piece))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_bounded_and_offsets_count_dropped_bytes() {
        let s = LiveSink::default();
        assert_eq!(s.take_piece(), None);
        s.push(b"abc");
        assert_eq!(s.take_piece(), Some((0, b"abc".to_vec())));
        s.push(&vec![b'x'; LIVE_BUFFER_BYTES + 10]);
        let (offset, piece) = s.take_piece().unwrap();
        assert_eq!(offset, 3 + 10, "the oldest 10 unsent bytes were dropped");
        assert_eq!(piece.len(), LIVE_PIECE_BYTES);
        let (next, _) = s.take_piece().unwrap();
        assert_eq!(next, offset + LIVE_PIECE_BYTES as u64);
    }
}
