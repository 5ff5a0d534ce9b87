/**
 * Starting an attempt the leader assigned (refusing what this worker cannot
 * run), waiting for a slot, running its handler to an outcome, and
 * reporting it (persisted first).
 *
 * @packageDocumentation
 */
import { makeContext, type Handler } from "./context";
import { NonRetryable, RetryAfter } from "./errors";
import { LiveBuffer } from "./live";
import { keyOf, Outcome, type Assign, type Report } from "./proto";
import type { Held, Runtime } from "./runtime";
import { OutputTail } from "./tail";

/** How long an attempt runs before the worker sends its `Started`. */
export const STARTED_AFTER_MS = 20;

/** The longest delay a Node.js timer holds. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** What an Assign asks for, or why it cannot be run. */
type Plan = { handler: Handler; name: string; payload: unknown; params: Record<string, unknown> } | { refusal: string };

/** The end of an attempt, before stops and fencing are applied. */
interface Ended {
  outcome: number;
  text: string;
  noRetry: boolean;
  retryAfterMs: number;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function message(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

/** Reads an Assign's executor and params. */
export function plan(rt: Runtime, a: Assign): Plan {
  let executor: unknown;
  try {
    executor = JSON.parse(a.executor_json);
  } catch (e) {
    return { refusal: `worker cannot read the executor spec: ${message(e)}` };
  }
  if (!isObject(executor) || Object.keys(executor).length !== 1) {
    return { refusal: `worker cannot read the executor spec: expected one executor kind, got ${a.executor_json}` };
  }
  const kind = Object.keys(executor)[0]!;
  if (kind !== "handler") {
    return { refusal: `worker ${rt.opts.workerId} does not run ${kind} jobs (this SDK runs handler jobs only)` };
  }
  const spec = executor["handler"];
  if (!isObject(spec) || typeof spec["name"] !== "string") {
    return { refusal: `worker cannot read the executor spec: handler.name is missing` };
  }
  const name = spec["name"];
  const handler = rt.handlers.get(name);
  if (!handler) {
    const has = [...rt.handlers.keys()].sort().join(", ");
    return { refusal: `no handler named ${JSON.stringify(name)} on worker ${rt.opts.workerId} (it has: ${has})` };
  }
  let params: Record<string, unknown> = {};
  if (a.params_json !== "") {
    let parsed: unknown;
    try {
      parsed = JSON.parse(a.params_json);
    } catch (e) {
      return { refusal: `worker cannot read the run's params: ${message(e)}` };
    }
    if (!isObject(parsed)) return { refusal: `worker cannot read the run's params: not a JSON object` };
    params = parsed;
  }
  return { handler, name, payload: spec["payload"] ?? null, params };
}

/** Takes an Assign that passed the token and fence checks. */
export function startAttempt(rt: Runtime, a: Assign): void {
  const key = keyOf(a.run_id, a.attempt);
  if (rt.held.has(key) || rt.spool.has(key)) {
    rt.log.debug("duplicate assignment ignored", { run: a.run_id, attempt: a.attempt });
    return;
  }
  const p = plan(rt, a);
  const held: Held = {
    key,
    runId: a.run_id,
    attempt: a.attempt,
    token: BigInt(a.token),
    controller: new AbortController(),
    aborted: false,
    lost: false,
    lostWhy: null,
    stopped: null,
    executing: false,
    tail: null,
    live: null,
  };
  rt.held.set(key, held);
  void runAttempt(rt, held, a, p).catch((e) => rt.log.error("attempt bookkeeping failed", { run: a.run_id, attempt: a.attempt, error: String(e) }));
}

async function runAttempt(rt: Runtime, held: Held, a: Assign, p: Plan): Promise<void> {
  let started = rt.clocks.wall();
  let ended: Ended;
  let ran = true;
  let endedAt: number | undefined;
  if ("refusal" in p) {
    rt.log.warn("assignment refused", { run: a.run_id, attempt: a.attempt, why: p.refusal });
    ended = { outcome: Outcome.FAILED, text: p.refusal, noRetry: false, retryAfterMs: 0 };
  } else {
    // Wait for a slot (FIFO); a Cancel, Abort or self-fence while queued
    // ends the attempt without running it.
    let slot = await rt.slots.acquire(held.controller.signal);
    if (slot && held.controller.signal.aborted) {
      rt.slots.release();
      slot = false;
    }
    if (slot && rt.fenceLapsed()) {
      rt.slots.release();
      slot = false;
      held.lost = true;
      held.lostWhy = "no heartbeat acknowledged within the safety fraction of the lease";
    }
    started = rt.clocks.wall();
    if (slot) {
      try {
        ended = await execute(rt, held, a, p, started);
      } finally {
        // Stamped before the slot is given back, so the next attempt's
        // start never precedes this one's end.
        endedAt = rt.clocks.wall();
        rt.slots.release();
      }
    } else {
      ran = false;
      ended = { outcome: Outcome.CANCELLED, text: "", noRetry: false, retryAfterMs: 0 };
    }
  }
  endedAt ??= rt.clocks.wall();
  if (held.aborted) return forget(rt, held);
  // A stop decides the outcome, and its reason replaces the handler's result.
  if (held.lost) {
    const why = held.lostWhy ?? "stopped by the worker";
    ended = { outcome: Outcome.LOST, text: ran ? `lost: ${why}\n` : `lost before it started: ${why}`, noRetry: false, retryAfterMs: 0 };
  } else if (held.stopped === "cancel" || !ran) {
    ended = { outcome: Outcome.CANCELLED, text: ran ? "cancelled\n" : "cancelled before it started", noRetry: false, retryAfterMs: 0 };
  } else if (held.stopped === "timeout") {
    ended = { outcome: Outcome.TIMED_OUT, text: `timed out after ${Number(a.timeout_ms) / 1000} s\n`, noRetry: false, retryAfterMs: 0 };
  }
  const report: Report = {
    run_id: held.runId,
    attempt: held.attempt,
    outcome: ended.outcome,
    output: (held.tail ?? new OutputTail()).text(ended.text),
    started_at_ms: started,
    ended_at_ms: endedAt,
    token: held.token.toString(),
    no_retry: ended.outcome === Outcome.FAILED && ended.noRetry,
    retry_after_ms: String(ended.outcome === Outcome.FAILED ? ended.retryAfterMs : 0),
  };
  // Persist, then send.
  const entry = await rt.spool.write(report);
  if (held.aborted) {
    rt.spool.discard(entry);
    return forget(rt, held);
  }
  // The attempt's last words (its result, or why it stopped) end its live
  // stream too, and what is pending goes out whole, ahead of the report.
  if (held.live && ended.text) held.live.append(Buffer.from(ended.text, "utf8"));
  rt.flushLive(held, true);
  held.live = null;
  // Out of the held attempts and into the spool (and the stream) at once:
  // every heartbeat either lists it or follows its report.
  rt.held.delete(held.key);
  rt.spool.commit(entry);
  rt.send({ report });
}

function forget(rt: Runtime, held: Held): void {
  rt.held.delete(held.key);
  rt.log.info("superseded attempt stopped; not reported", { run: held.runId, attempt: held.attempt });
}

/** Runs the handler; the attempt ends when it returns or throws. */
async function execute(rt: Runtime, held: Held, a: Assign, p: Exclude<Plan, { refusal: string }>, started: number): Promise<Ended> {
  held.executing = true;
  held.tail = new OutputTail();
  held.live = new LiveBuffer();
  const tail = held.tail;
  const live = held.live;
  const open = makeContext({
    runId: a.run_id,
    attempt: a.attempt,
    job: a.job,
    namespace: a.namespace,
    workerId: rt.opts.workerId,
    scheduledAtMs: Number(a.scheduled_at_ms),
    params: p.params,
    payload: p.payload,
    runPayload: a.payload === "" ? null : a.payload,
    token: held.token,
    signal: held.controller.signal,
    idempotencyKey: a.idempotency_key,
    write: (line) => {
      const bytes = Buffer.from(line, "utf8");
      tail.push(bytes);
      live.append(bytes);
    },
  });
  // `Started` goes out once the attempt has run for a moment; one that ends
  // sooner is reported by its Report alone (which carries its start time).
  const startedTimer = setTimeout(() => {
    if (held.executing) rt.send({ started: { run_id: a.run_id, attempt: a.attempt, started_at_ms: started } });
  }, STARTED_AFTER_MS);
  const timeoutMs = Number(a.timeout_ms);
  // (A timeout beyond what a timer can hold, about 24.8 days, is none.)
  const timeoutTimer =
    timeoutMs > 0 && timeoutMs <= MAX_TIMER_MS
      ? setTimeout(() => rt.stopAttempt(a.run_id, a.attempt, "timeout", `timed out after ${timeoutMs} ms`), timeoutMs)
      : undefined;
  try {
    const value = await p.handler(open.ctx);
    return { outcome: Outcome.SUCCEEDED, text: render(value), noRetry: false, retryAfterMs: 0 };
  } catch (e) {
    return failure(e);
  } finally {
    clearTimeout(startedTimer);
    if (timeoutTimer) clearTimeout(timeoutTimer);
    held.executing = false;
    open.close();
  }
}

/** A handler's return value as output: a string as is, another value as JSON. */
export function render(value: unknown): string {
  if (value === undefined || value === null) return "";
  if (typeof value === "string") return value;
  if (typeof value === "bigint") return value.toString();
  try {
    return JSON.stringify(value, (_k, v) => (typeof v === "bigint" ? v.toString() : v)) ?? String(value);
  } catch {
    return String(value);
  }
}

/** What a thrown value means: NonRetryable, RetryAfter or an ordinary failure. */
export function failure(e: unknown): Ended {
  if (NonRetryable.is(e)) return { outcome: Outcome.FAILED, text: `NonRetryable: ${e.message}\n`, noRetry: true, retryAfterMs: 0 };
  if (RetryAfter.is(e)) return { outcome: Outcome.FAILED, text: `RetryAfter: ${e.message}\n`, noRetry: false, retryAfterMs: e.retryAfterMs };
  const text = (e instanceof Error ? (e.stack ?? `${e.name}: ${e.message}`) : `thrown: ${render(e)}`) + "\n";
  return { outcome: Outcome.FAILED, text, noRetry: false, retryAfterMs: 0 };
}
