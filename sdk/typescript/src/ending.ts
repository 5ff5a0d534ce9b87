/**
 * How an attempt's handler ended, as a report gives it: its return value
 * rendered, what it threw (NonRetryable, RetryAfter, another error), and the
 * retry delay. None of these functions throws, whatever the handler gave.
 *
 * @packageDocumentation
 */
import { MAX_RETRY_AFTER_MS, NonRetryable, RetryAfter } from "./errors";
import { Outcome } from "./proto";

/** The end of an attempt, before stops and fencing are applied. */
export interface Ended {
  outcome: number;
  text: string;
  noRetry: boolean;
  retryAfterMs: number;
}

/**
 * A handler's return value as output: a string as is, another value as JSON,
 * else as `String()` gives it, else its `[object …]` tag. Never throws.
 */
export function render(value: unknown): string {
  if (value === undefined || value === null) return "";
  if (typeof value === "string") return value;
  if (typeof value === "bigint") return value.toString();
  try {
    const json = JSON.stringify(value, (_k, v) => (typeof v === "bigint" ? v.toString() : v));
    if (json !== undefined) return json;
  } catch {
    // circular, a throwing toJSON, …
  }
  try {
    return String(value);
  } catch {
    // no prototype, a throwing toString, …
  }
  try {
    return Object.prototype.toString.call(value);
  } catch {
    return "[unprintable value]";
  }
}

/** A thrown value as text: an Error's stack (or name and message), another value rendered. Never throws. */
export function describe(e: unknown): string {
  try {
    if (e instanceof Error) return String(e.stack ?? `${e.name}: ${e.message}`);
  } catch {
    // a throwing getter
  }
  return render(e);
}

/** `Report.retry_after_ms`: whole milliseconds, at most {@link MAX_RETRY_AFTER_MS}, as a decimal string. */
export function retryAfterField(ms: number): string {
  if (!(ms > 0)) return "0";
  return String(Math.min(Math.round(ms), MAX_RETRY_AFTER_MS));
}

/** What a thrown value means: NonRetryable, RetryAfter or an ordinary failure. Never throws. */
export function failure(e: unknown): Ended {
  try {
    if (NonRetryable.is(e)) return { outcome: Outcome.FAILED, text: `NonRetryable: ${e.message}\n`, noRetry: true, retryAfterMs: 0 };
    if (RetryAfter.is(e)) {
      // (A RetryAfter checks its seconds when made; one changed since, or
      // made by another copy of this package, may not have valid ones.)
      const seconds: unknown = e.seconds;
      if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds < 0) {
        const text = `RetryAfter: ${e.message}\n(no retry delay: RetryAfter seconds must be a finite number >= 0, got ${typeof seconds === "number" ? String(seconds) : typeof seconds === "string" ? JSON.stringify(seconds) : render(seconds)})\n`;
        return { outcome: Outcome.FAILED, text, noRetry: false, retryAfterMs: 0 };
      }
      return { outcome: Outcome.FAILED, text: `RetryAfter: ${e.message}\n`, noRetry: false, retryAfterMs: Math.min(Math.round(seconds * 1000), MAX_RETRY_AFTER_MS) };
    }
  } catch {
    // a thrown value whose properties throw: an ordinary failure
  }
  let isError = false;
  try {
    isError = e instanceof Error;
  } catch {
    // a proxy whose prototype lookup throws
  }
  const text = (isError ? describe(e) : `thrown: ${describe(e)}`) + "\n";
  return { outcome: Outcome.FAILED, text, noRetry: false, retryAfterMs: 0 };
}
