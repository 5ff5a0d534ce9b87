/**
 * The fencing value of an attempt.
 *
 * @packageDocumentation
 */

/**
 * What identifies one attempt's right to write: its run, its attempt number
 * and the fencing token of its assignment (the token of the leader that
 * assigned it). A later attempt of the same run carries a token at least as
 * high, and the same token only with a higher attempt number: order fences
 * by (token, attempt), as {@link Fence.supersedes} does. Store both next to
 * the side effects an attempt makes and refuse a write whose (token,
 * attempt) is lower than the one stored, and two attempts of a run that
 * overlap (a paused worker that wakes up) cannot both win. For writes to
 * PostgreSQL or MySQL/MariaDB, the exactly-once steps (`runStep`, `guard`)
 * do this, and record the step's result.
 */
export class Fence {
  /** The run. */
  readonly runId: string;
  /** The attempt number (1, 2, …). */
  readonly attempt: number;
  /** The fencing token of the attempt's assignment (a uint64). */
  readonly token: bigint;

  /**
   * @param runId the run.
   * @param attempt the attempt number.
   * @param token the fencing token.
   */
  constructor(runId: string, attempt: number, token: bigint) {
    this.runId = runId;
    this.attempt = attempt;
    this.token = token;
    Object.freeze(this);
  }

  /** Whether this fence supersedes `other`: a higher token, or the same token and a later attempt. */
  supersedes(other: Fence): boolean {
    return this.token > other.token || (this.token === other.token && this.attempt > other.attempt);
  }

  /** Whether both fences name the same attempt with the same token. */
  equals(other: Fence): boolean {
    return this.runId === other.runId && this.attempt === other.attempt && this.token === other.token;
  }

  /** JSON form: the token as a decimal string (JSON has no 64-bit integers). */
  toJSON(): { runId: string; attempt: number; token: string } {
    return { runId: this.runId, attempt: this.attempt, token: this.token.toString() };
  }

  /** `Fence(<runId>, <attempt>, <token>)`. */
  toString(): string {
    return `Fence(${this.runId}, ${this.attempt}, ${this.token})`;
  }
}
