/**
 * Errors a handler throws to steer what happens to its run.
 *
 * @packageDocumentation
 */

const NON_RETRYABLE = Symbol.for("gnomon-worker.NonRetryable");
const RETRY_AFTER = Symbol.for("gnomon-worker.RetryAfter");

/** The longest retry delay a report carries: 24 hours, the leader's cap. */
export const MAX_RETRY_AFTER_MS = 86_400_000;

/**
 * Thrown by a handler to end its run now: the attempt is reported FAILED
 * with `no_retry`, and the run fails whatever attempts its retry policy has
 * left (bad input, a permanent refusal).
 */
export class NonRetryable extends Error {
  /** @param message why the run cannot succeed; it ends the attempt's output. */
  constructor(message: string) {
    super(message);
    this.name = "NonRetryable";
    Object.defineProperty(this, NON_RETRYABLE, { value: true });
  }

  /** Whether `e` is a NonRetryable (also one from another copy of this package). */
  static is(e: unknown): e is NonRetryable {
    return typeof e === "object" && e !== null && (e as Record<symbol, unknown>)[NON_RETRYABLE] === true;
  }
}

/**
 * Thrown by a handler to ask for the next attempt no sooner than `seconds`
 * after this one ended, in place of the job's backoff (the job's
 * `max_attempts` still bounds the attempts; the delay is capped at 24 hours,
 * as the leader caps it). The attempt is reported FAILED with
 * `retry_after_ms`.
 */
export class RetryAfter extends Error {
  /** The delay asked for, in seconds. */
  declare readonly seconds: number;

  /**
   * @param seconds the delay before the next attempt, in seconds (a finite
   *   number >= 0; fractions allowed; more than 24 hours counts as 24 hours).
   * @param message why; defaults to "retry after <seconds> s".
   * @throws TypeError if `seconds` is not a finite number >= 0.
   */
  constructor(seconds: number, message?: string) {
    if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds < 0) {
      const got = typeof seconds === "number" ? String(seconds) : typeof seconds;
      throw new TypeError(`RetryAfter: seconds must be a finite number >= 0, got ${got}`);
    }
    super(message ?? `retry after ${seconds} s`);
    this.name = "RetryAfter";
    // Read-only at run time too: the delay checked is the delay reported.
    Object.defineProperty(this, "seconds", { value: seconds, enumerable: true, writable: false, configurable: false });
    Object.defineProperty(this, RETRY_AFTER, { value: true });
  }

  /** The delay in whole milliseconds, at most 24 hours (`Report.retry_after_ms`). */
  get retryAfterMs(): number {
    return Math.min(Math.round(this.seconds * 1000), MAX_RETRY_AFTER_MS);
  }

  /** Whether `e` is a RetryAfter (also one from another copy of this package). */
  static is(e: unknown): e is RetryAfter {
    return typeof e === "object" && e !== null && (e as Record<symbol, unknown>)[RETRY_AFTER] === true;
  }
}
