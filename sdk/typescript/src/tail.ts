/**
 * The bounded tail of an attempt's output that its Report carries.
 *
 * @packageDocumentation
 */

/** The most output a Report carries: 64 KiB. */
export const MAX_OUTPUT_BYTES = 64 * 1024;

/**
 * The last `max` bytes of `bytes` as text, cut forward to a UTF-8 character
 * boundary; when bytes were dropped the text starts with
 * `[gnomon: N earlier bytes dropped]` and the whole, marker included, still
 * fits in `max` bytes.
 */
export function tailText(bytes: Buffer, max = MAX_OUTPUT_BYTES, droppedBefore = 0): string {
  if (bytes.length <= max && droppedBefore === 0) return bytes.toString("utf8");
  // The marker's length with the largest count it could show bounds it.
  const bound = Buffer.byteLength(marker(droppedBefore + bytes.length));
  const keep = bytes.length <= max - bound ? bytes.length : Math.max(0, max - bound);
  let start = bytes.length - keep;
  while (start < bytes.length && (bytes[start]! & 0xc0) === 0x80) start++;
  const dropped = droppedBefore + start;
  const body = bytes.subarray(start).toString("utf8");
  return dropped > 0 ? marker(dropped) + body : body;
}

function marker(n: number): string {
  return `[gnomon: ${n} earlier bytes dropped]\n`;
}

/**
 * An attempt's output as it is written: keeps at least the last
 * {@link MAX_OUTPUT_BYTES} and counts what it dropped before them.
 */
export class OutputTail {
  private chunks: Buffer[] = [];
  private size = 0;
  private dropped = 0;

  /** Appends bytes, trimming the front once it holds twice the limit. */
  push(bytes: Buffer): void {
    if (bytes.length === 0) return;
    this.chunks.push(bytes);
    this.size += bytes.length;
    if (this.size > 2 * MAX_OUTPUT_BYTES) {
      const all = Buffer.concat(this.chunks);
      const keep = all.subarray(all.length - MAX_OUTPUT_BYTES);
      this.dropped += all.length - keep.length;
      this.chunks = [Buffer.from(keep)];
      this.size = keep.length;
    }
  }

  /** The Report's `output`: what was written, then `extra`, cut to the limit. */
  text(extra = ""): string {
    const parts = extra ? [...this.chunks, Buffer.from(extra, "utf8")] : this.chunks;
    return tailText(Buffer.concat(parts), MAX_OUTPUT_BYTES, this.dropped);
  }
}
