/**
 * The worker's state shared by its sessions and attempts: the attempts it
 * holds, the report spool, tokens, the lease and the self-fence, and the
 * handling of what the leader sends.
 *
 * @packageDocumentation
 */
import { performance } from "node:perf_hooks";
import { startAttempt } from "./attempts";
import type { Handler } from "./context";
import { LIVE_FLUSH_MS, type LiveBuffer } from "./live";
import type { Logger } from "./logger";
import type { ResolvedOptions } from "./options";
import { keyOf, PROTOCOL_VERSION, type Hello, type ServerMessage, type WorkerMessage } from "./proto";
import { Slots } from "./slots";
import { Spool } from "./spool";
import type { OutputTail } from "./tail";

/** How an attempt was told to stop. */
export type StopKind = "cancel" | "timeout" | "lost" | "abort";

/** An attempt the worker holds: from its Assign until its Report is sent. */
export interface Held {
  key: string;
  runId: string;
  attempt: number;
  token: bigint;
  controller: AbortController;
  /** Superseded: stop it and do not report it. */
  aborted: boolean;
  /** Stopped by self-fencing or a drain: report it `lost`. */
  lost: boolean;
  /** Why it was reported lost. */
  lostWhy: string | null;
  /** Cancelled or timed out (whichever came first). */
  stopped: "cancel" | "timeout" | null;
  /** Executing its handler (holding a slot). */
  executing: boolean;
  /** When its handler started (wall-clock ms); `undefined` until then. */
  startedAt: number | undefined;
  /** Reported lost while its handler ignored the stop (a drain's end): its result is dropped. */
  abandoned: boolean;
  tail: OutputTail | null;
  live: LiveBuffer | null;
}

/** Clocks, replaceable in tests. */
export interface Clocks {
  /** Monotonic milliseconds. */
  now(): number;
  /** Wall-clock milliseconds since the epoch. */
  wall(): number;
}

const SYSTEM_CLOCKS: Clocks = { now: () => performance.now(), wall: () => Date.now() };

/** The worker's runtime state. One per {@link Worker.run}. */
export class Runtime {
  readonly held = new Map<string, Held>();
  readonly spool: Spool;
  readonly slots: Slots;
  readonly log: Logger;
  /** Sends on the current session, if one is up. */
  outbound: ((m: WorkerMessage) => void) | null = null;
  maxToken = 0n;
  /** When the newest acknowledged heartbeat (or the Hello) was sent, monotonic ms. */
  lastAck: number;
  /** Send times of heartbeats not yet acknowledged, by sequence. */
  readonly heartbeatsSent = new Map<number, number>();
  /** Sessions established so far. */
  welcomes = 0;
  leaseTtlMs = 10_000;
  draining = false;
  /** When a drain stops what is still running (monotonic ms); `null`: not draining. */
  drainDeadline: number | null = null;
  private readonly wakers = new Set<() => void>();
  private timers: NodeJS.Timeout[] = [];

  constructor(
    readonly opts: ResolvedOptions,
    readonly handlers: ReadonlyMap<string, Handler>,
    readonly clocks: Clocks = SYSTEM_CLOCKS,
  ) {
    this.log = opts.logger;
    this.spool = new Spool(opts.spoolDir, opts.logger);
    this.slots = new Slots(opts.capacity);
    this.lastAck = clocks.now();
  }

  /** Monotonic milliseconds. */
  now(): number {
    return this.clocks.now();
  }

  /** Attempts held, executing or queued. */
  running(): number {
    return this.held.size;
  }

  /** Attempts executing (holding a slot). */
  executing(): number {
    return this.slots.inUse;
  }

  /** Reports persisted and not yet acked. */
  unacked(): number {
    return this.spool.size;
  }

  /** Sends a message on the current session, if one is up. */
  send(m: WorkerMessage): boolean {
    if (!this.outbound) return false;
    try {
      this.outbound(m);
      return true;
    } catch (e) {
      this.log.debug("send failed", { error: String(e) });
      return false;
    }
  }

  /** No heartbeat sent within the safety fraction of the lease has been acknowledged. */
  fenceLapsed(): boolean {
    return this.now() - this.lastAck > this.leaseTtlMs * this.opts.selfFenceFraction;
  }

  /** Self-fencing (or a drain's end): stops every held attempt and reports it lost. */
  fenceSelf(why: string): void {
    const fresh = [...this.held.values()].filter((h) => !h.lost && !h.aborted);
    if (fresh.length === 0) return;
    this.log.warn("self-fencing: stopping held attempts", { attempts: fresh.length, why });
    for (const h of fresh) this.stopAttempt(h.runId, h.attempt, "lost", why);
  }

  /**
   * Stops an attempt: `abort` silently, `cancel`/`timeout`/`lost` with that
   * report (`why`: the reason a lost one's report gives).
   */
  stopAttempt(runId: string, attempt: number, kind: StopKind, why?: string): void {
    const h = this.held.get(keyOf(runId, attempt));
    if (!h) return;
    if (kind === "abort") h.aborted = true;
    else if (kind === "lost") {
      if (!h.lost) h.lostWhy = why ?? "stopped by the worker";
      h.lost = true;
    } else if (h.stopped === null) {
      h.stopped = kind;
    }
    if (!h.controller.signal.aborted) {
      const reason = new Error(kind === "abort" ? "aborted: superseded" : kind === "lost" ? `lost: ${why ?? ""}` : kind === "cancel" ? "cancelled" : "timed out");
      reason.name = "AbortError";
      h.controller.abort(reason);
    }
  }

  /** Forgets a report: acked by the leader, or its attempt aborted. */
  acked(runId: string, attempt: number): void {
    this.spool.remove(keyOf(runId, attempt));
  }

  /** Handles one message from the leader (after the Welcome). */
  handle(m: ServerMessage): void {
    switch (m.msg) {
      case "assign": {
        const a = m.assign!;
        const token = BigInt(a.token);
        if (token < this.maxToken) {
          this.log.warn("assignment with a stale token ignored", { run: a.run_id, attempt: a.attempt, token: a.token, max: this.maxToken.toString() });
          return;
        }
        this.maxToken = token;
        // A worker whose fence has lapsed may have been declared dead and its
        // attempts given to another: drop (do not queue) what arrives now.
        if (this.fenceLapsed()) {
          this.log.warn("assignment dropped: no heartbeat acknowledged within the fence", { run: a.run_id, attempt: a.attempt });
          return;
        }
        startAttempt(this, a);
        return;
      }
      case "cancel": {
        const c = m.cancel!;
        if (BigInt(c.token) >= this.maxToken) this.stopAttempt(c.run_id, c.attempt, "cancel");
        else this.log.warn("cancel with a stale token ignored", { run: c.run_id, attempt: c.attempt, token: c.token });
        return;
      }
      case "abort": {
        const a = m.abort!;
        if (BigInt(a.token) >= this.maxToken) {
          this.log.warn("attempt aborted by the leader", { run: a.run_id, attempt: a.attempt, reason: a.reason });
          this.stopAttempt(a.run_id, a.attempt, "abort");
          this.acked(a.run_id, a.attempt);
        } else {
          this.log.warn("abort with a stale token ignored", { run: a.run_id, attempt: a.attempt, token: a.token });
        }
        return;
      }
      case "ack": {
        const ack = m.ack!;
        if (ack.heartbeat_seq != null) {
          const seq = Number(ack.heartbeat_seq);
          const sent = this.heartbeatsSent.get(seq);
          if (sent !== undefined) this.lastAck = Math.max(this.lastAck, sent);
          for (const s of [...this.heartbeatsSent.keys()]) if (s <= seq) this.heartbeatsSent.delete(s);
        }
        if (ack.report != null) {
          if (ack.rejected_reason) {
            this.log.warn("report rejected by the leader", { run: ack.report.run_id, attempt: ack.report.attempt, reason: ack.rejected_reason });
          }
          this.acked(ack.report.run_id, ack.report.attempt);
        }
        return;
      }
      default:
        return; // Welcome/NotLeader mid-session, or a message this SDK does not know.
    }
  }

  /** The Hello of a new session. */
  hello(): Hello {
    return {
      worker_id: this.opts.workerId,
      labels: { ...this.opts.labels },
      capacity: this.opts.capacity,
      executors: ["handler"],
      handlers: [...this.handlers.keys()].sort(),
      running: [...this.held.values()].filter((h) => !h.lost).map((h) => ({ run_id: h.runId, attempt: h.attempt })),
      protocol_version: PROTOCOL_VERSION,
      prefetch: this.opts.prefetch,
    };
  }

  /** Sends what the budget allows of each attempt's live output. */
  flushLive(h: Held, all = false): void {
    if (!h.live || !this.outbound) return;
    for (const piece of h.live.take(this.now(), all)) {
      this.send({ output: { run_id: h.runId, attempt: h.attempt, token: h.token.toString(), offset: String(piece.offset), data: piece.data } });
    }
  }

  /** Starts a drain: heartbeats say draining; running attempts get `drainTimeoutMs` to finish. */
  requestStop(deadline = this.now() + this.opts.drainTimeoutMs): void {
    if (this.drainDeadline === null) {
      this.log.info("draining: no new assignments; waiting for running attempts", { running: this.running() });
    }
    this.drainDeadline = Math.min(this.drainDeadline ?? Infinity, deadline);
    this.draining = true;
    this.wake();
  }

  /** Waits `ms`, or less if a stop is requested meanwhile. */
  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        this.wakers.delete(done);
        resolve();
      };
      const t = setTimeout(done, ms);
      this.wakers.add(done);
    });
  }

  private wake(): void {
    for (const w of [...this.wakers]) w();
  }

  /** Starts the self-fence watchdog (every 100 ms) and the live-output flusher (every 250 ms). */
  startTimers(): void {
    this.timers.push(
      setInterval(() => {
        if (this.fenceLapsed()) this.fenceSelf("no heartbeat acknowledged within the safety fraction of the lease");
      }, 100),
      setInterval(() => {
        // (Nothing more of an attempt that was superseded or stopped as lost
        // goes out live; a lost one's report ends its stream.)
        for (const h of this.held.values()) if (!h.aborted && !h.lost) this.flushLive(h);
      }, LIVE_FLUSH_MS),
    );
  }

  /** Stops the timers. */
  stopTimers(): void {
    for (const t of this.timers) clearInterval(t);
    this.timers = [];
  }
}
