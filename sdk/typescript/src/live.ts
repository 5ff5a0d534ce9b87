/**
 * Live output: each attempt's output is also streamed to the leader as it
 * is written, in `Output` pieces, best effort and never blocking the handler.
 *
 * @packageDocumentation
 */

/** The most `data` one `Output` message carries: 16 KiB. */
export const LIVE_PIECE_BYTES = 16 * 1024;
/** The most unsent live output kept per attempt: 256 KiB (the oldest is dropped). */
export const LIVE_BUFFER_BYTES = 256 * 1024;
/** The most live output sent per attempt in any one second: 64 KiB. */
export const LIVE_RATE_BYTES = 64 * 1024;
/** How often the worker flushes live output: every 250 ms. */
export const LIVE_FLUSH_MS = 250;

/** A piece ready to send: where it starts in the attempt's output, and its bytes. */
export interface LivePiece {
  offset: number;
  data: Buffer;
}

/**
 * One attempt's live send buffer. `offset`s count every byte the attempt
 * wrote, sent or dropped, so a reader sees a gap where bytes were dropped.
 */
export class LiveBuffer {
  private chunks: Buffer[] = [];
  private pending = 0;
  private written = 0;
  /** Recent sends, for the one-second rate budget. */
  private sends: Array<{ at: number; bytes: number }> = [];

  /** Bytes written so far (sent, pending or dropped). */
  get total(): number {
    return this.written;
  }

  /** Bytes written but not yet sent (nor dropped). */
  get unsent(): number {
    return this.pending;
  }

  /** Appends bytes; past {@link LIVE_BUFFER_BYTES} unsent, the oldest unsent bytes are dropped. */
  append(bytes: Buffer): void {
    if (bytes.length === 0) return;
    this.written += bytes.length;
    this.chunks.push(bytes);
    this.pending += bytes.length;
    let excess = this.pending - LIVE_BUFFER_BYTES;
    while (excess > 0) {
      const first = this.chunks[0]!;
      if (first.length <= excess) {
        this.chunks.shift();
        this.pending -= first.length;
        excess -= first.length;
      } else {
        this.chunks[0] = first.subarray(excess);
        this.pending -= excess;
        excess = 0;
      }
    }
  }

  /** What the one-second budget still allows at `now` (ms, monotonic). */
  budget(now: number): number {
    while (this.sends.length > 0 && this.sends[0]!.at <= now - 1000) this.sends.shift();
    let used = 0;
    for (const s of this.sends) used += s.bytes;
    return Math.max(0, LIVE_RATE_BYTES - used);
  }

  /**
   * Takes the pieces the budget allows at `now`, each at most
   * {@link LIVE_PIECE_BYTES}; with `all`, everything pending (the attempt's
   * end, when the buffer is bounded already).
   */
  take(now: number, all = false): LivePiece[] {
    const pieces: LivePiece[] = [];
    let allowed = all ? Number.MAX_SAFE_INTEGER : this.budget(now);
    while (this.pending > 0 && allowed > 0) {
      const n = Math.min(LIVE_PIECE_BYTES, allowed, this.pending);
      const offset = this.written - this.pending;
      const data = this.takeBytes(n);
      pieces.push({ offset, data });
      this.sends.push({ at: now, bytes: n });
      allowed -= n;
    }
    return pieces;
  }

  private takeBytes(n: number): Buffer {
    const parts: Buffer[] = [];
    let need = n;
    while (need > 0) {
      const first = this.chunks[0]!;
      if (first.length <= need) {
        parts.push(first);
        this.chunks.shift();
        need -= first.length;
      } else {
        parts.push(first.subarray(0, need));
        this.chunks[0] = first.subarray(need);
        need = 0;
      }
    }
    this.pending -= n;
    return parts.length === 1 ? Buffer.from(parts[0]!) : Buffer.concat(parts);
  }
}
