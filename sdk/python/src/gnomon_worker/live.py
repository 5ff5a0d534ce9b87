"""An attempt's output: the bounded tail that its Report carries, and the
live stream of ``Output`` pieces sent while it runs.

Writers (handler threads and coroutines) only append to memory under a lock;
the event loop takes pieces out at each flush. Nothing here blocks a handler.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Deque, List, Tuple

#: The output a Report carries: the last this many bytes.
MAX_OUTPUT_BYTES = 64 * 1024
#: The most ``data`` in one Output piece.
PIECE_BYTES = 16 * 1024
#: The most unsent live output kept per attempt; older bytes are dropped.
LIVE_BUFFER_BYTES = 256 * 1024
#: The most live output sent per attempt in any one second.
LIVE_RATE_BYTES = 64 * 1024
#: How often live output is flushed, in seconds.
FLUSH_INTERVAL = 0.25


def tail_text(data: bytes, total: int, limit: int = MAX_OUTPUT_BYTES) -> str:
    """The last bytes of ``data`` (the end of ``total`` bytes written) as text
    of at most ``limit`` UTF-8 bytes, cut at a character boundary, with a note
    in front when earlier bytes were dropped."""
    if total <= limit and len(data) == total:
        return data.decode("utf-8", "replace")
    room = limit - len(f"[gnomon: {total} earlier bytes dropped]\n".encode())
    start = max(0, len(data) - room)
    # Never start inside a multi-byte character (continuation bytes 10xxxxxx).
    while start < len(data) and (data[start] & 0xC0) == 0x80:
        start += 1
    kept = data[start:]
    dropped = total - len(kept)
    return f"[gnomon: {dropped} earlier bytes dropped]\n" + kept.decode("utf-8", "replace")


class OutputBuffer:
    """One attempt's output. Thread-safe; writes never block on I/O."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tail = bytearray()
        self._pending = bytearray()
        #: Stream offset of the first pending (unsent) byte.
        self._pending_start = 0
        #: Every byte written, sent or dropped.
        self._total = 0
        #: (time, bytes) of the pieces taken within the last second.
        self._sent: Deque[Tuple[float, int]] = deque()

    @property
    def total(self) -> int:
        """Bytes written so far."""
        with self._lock:
            return self._total

    def write(self, text: str) -> None:
        """Appends text to the output (its tail and its live stream)."""
        if not text:
            return
        data = text.encode("utf-8", "replace")
        with self._lock:
            self._total += len(data)
            self._tail += data
            if len(self._tail) > 2 * MAX_OUTPUT_BYTES:
                del self._tail[: len(self._tail) - MAX_OUTPUT_BYTES]
            self._pending += data
            over = len(self._pending) - LIVE_BUFFER_BYTES
            if over > 0:
                # Full: the oldest unsent bytes go; the stream skips them.
                del self._pending[:over]
                self._pending_start += over

    def take_pieces(self, now: float, everything: bool = False) -> List[Tuple[int, bytes]]:
        """The pieces to send now, as ``(offset, data)``: at most
        :data:`PIECE_BYTES` each, within the rate budget of
        :data:`LIVE_RATE_BYTES` per second (``now``: a monotonic time in
        seconds); with ``everything``, all that is pending (the attempt's
        end: the buffer is bounded already)."""
        with self._lock:
            while self._sent and now - self._sent[0][0] >= 1.0:
                self._sent.popleft()
            budget = LIVE_RATE_BYTES - sum(n for _, n in self._sent)
            if everything:
                budget = len(self._pending)
            pieces: List[Tuple[int, bytes]] = []
            while self._pending and budget > 0:
                n = min(PIECE_BYTES, len(self._pending), budget)
                pieces.append((self._pending_start, bytes(self._pending[:n])))
                del self._pending[:n]
                self._pending_start += n
                budget -= n
                self._sent.append((now, n))
            return pieces

    def text(self) -> str:
        """The output a Report carries: the last 64 KiB, UTF-8 safe."""
        with self._lock:
            return tail_text(bytes(self._tail), self._total)
