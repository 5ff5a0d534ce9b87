/**
 * Starting an attempt the leader assigned (refusing what this worker cannot
 * run), waiting for a slot, running its handler to an outcome, and
 * reporting it (persisted first).
 *
 * @packageDocumentation
 */
import { makeContext, type Handler } from "./context";
import { describe, failure, render, retryAfterField, type Ended } from "./ending";
import { LiveBuffer } from "./live";
import { keyOf, Outcome, type Assign, type Report } from "./proto";
import type { Held, Runtime } from "./runtime";
import { OutputTail } from "./tail";

export { describe, failure, render } from "./ending";

/** How long an attempt runs before the worker sends its `Started`. */
export const STARTED_AFTER_MS = 20;

/** The longest delay a Node.js timer holds. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** What an Assign asks for, or why it cannot be run. */
type Plan = { handler: Handler; name: string; payload: unknown; params: Record<string, unknown> } | { refusal: string };

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
    startedAt: undefined,
    abandoned: false,
    tail: null,
    live: null,
  };
  rt.held.set(key, held);
  void runAttempt(rt, held, a, p).catch((e) => {
    // Last resort (the FAILED report could not be made): never leave the
    // attempt held, listed in every heartbeat and never reported.
    rt.held.delete(held.key);
    try {
      rt.log.error("attempt bookkeeping failed; attempt dropped", { run: a.run_id, attempt: a.attempt, error: describe(e) });
    } catch {
      // a logger that throws: nothing more to do
    }
  });
}

/** What an attempt holds while it runs, so that a failure of the worker's own bookkeeping can give it back. */
interface Hold {
  slot: boolean;
  started: number | undefined;
}

/**
 * Runs an attempt to its report. Should the worker's own bookkeeping throw
 * (a logger, a clock), the attempt still ends: out of the held attempts,
 * its slot given back, reported FAILED.
 */
async function runAttempt(rt: Runtime, held: Held, a: Assign, p: Plan): Promise<void> {
  const hold: Hold = { slot: false, started: undefined };
  try {
    await attempt(rt, held, a, p, hold);
  } catch (e) {
    if (hold.slot) {
      hold.slot = false;
      rt.slots.release();
    }
    held.executing = false;
    // Abandoned, or reported already: nothing more to report.
    if (held.abandoned || rt.held.get(held.key) !== held) return;
    if (held.aborted) return forget(rt, held);
    const text = `the worker could not finish the attempt: ${describe(e)}\n`;
    let now: number;
    try {
      now = rt.clocks.wall();
    } catch {
      now = Date.now();
    }
    const report: Report = {
      run_id: held.runId,
      attempt: held.attempt,
      outcome: Outcome.FAILED,
      output: (held.tail ?? new OutputTail()).text(text),
      started_at_ms: hold.started ?? now,
      ended_at_ms: now,
      token: held.token.toString(),
      no_retry: false,
      retry_after_ms: "0",
    };
    await deliver(rt, held, report, text);
  }
}

async function attempt(rt: Runtime, held: Held, a: Assign, p: Plan, hold: Hold): Promise<void> {
  const release = () => {
    if (!hold.slot) return;
    hold.slot = false;
    rt.slots.release();
  };
  let started = rt.clocks.wall();
  hold.started = started;
  let ended: Ended;
  let ran = true;
  let endedAt: number | undefined;
  if ("refusal" in p) {
    rt.log.warn("assignment refused", { run: a.run_id, attempt: a.attempt, why: p.refusal });
    ended = { outcome: Outcome.FAILED, text: p.refusal, noRetry: false, retryAfterMs: 0 };
  } else {
    // Wait for a slot (FIFO); a Cancel, Abort or self-fence while queued
    // ends the attempt without running it.
    hold.slot = await rt.slots.acquire(held.controller.signal);
    if (hold.slot && held.controller.signal.aborted) release();
    if (hold.slot && rt.fenceLapsed()) {
      release();
      held.lost = true;
      held.lostWhy = "no heartbeat acknowledged within the safety fraction of the lease";
    }
    started = rt.clocks.wall();
    hold.started = started;
    if (hold.slot) {
      try {
        ended = await execute(rt, held, a, p, started);
      } finally {
        // Stamped before the slot is given back, so the next attempt's
        // start never precedes this one's end.
        try {
          endedAt = rt.clocks.wall();
        } finally {
          release();
        }
      }
    } else {
      ran = false;
      ended = { outcome: Outcome.CANCELLED, text: "", noRetry: false, retryAfterMs: 0 };
    }
  }
  endedAt ??= rt.clocks.wall();
  // Reported lost already, its handler having ignored the stop (a drain's end).
  if (held.abandoned) return;
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
    retry_after_ms: retryAfterField(ended.outcome === Outcome.FAILED ? ended.retryAfterMs : 0),
  };
  await deliver(rt, held, report, ended.text);
}

/**
 * Persists an attempt's report, then sends it (with what is left of its
 * live output, `lastWords` included), unless the attempt is aborted
 * meanwhile.
 */
async function deliver(rt: Runtime, held: Held, report: Report, lastWords: string): Promise<void> {
  // Persist, then send.
  const entry = await rt.spool.write(report);
  if (held.aborted) {
    rt.spool.discard(entry);
    return forget(rt, held);
  }
  // The attempt's last words (its result, or why it stopped) end its live
  // stream too, and what is pending goes out whole, ahead of the report.
  if (held.live && lastWords) held.live.append(Buffer.from(lastWords, "utf8"));
  rt.flushLive(held, true);
  held.live = null;
  // Out of the held attempts and into the spool (and the stream) at once:
  // every heartbeat either lists it or follows its report.
  rt.held.delete(held.key);
  rt.spool.commit(entry);
  rt.send({ report });
}

/**
 * The end of a drain: attempts whose handlers still run though they were
 * stopped are reported LOST now and left behind (their handlers' eventual
 * results are dropped), so the leader need not wait out their lease.
 * Returns the attempts abandoned; their reports are persisted and sent
 * asynchronously, and each leaves the held attempts when it is sent.
 */
export function abandonStuck(rt: Runtime): number {
  const stuck = [...rt.held.values()].filter((h) => h.executing && !h.abandoned);
  for (const h of stuck) {
    h.abandoned = true;
    // A superseded one is never reported: it is only left behind.
    if (h.aborted) {
      forget(rt, h);
      continue;
    }
    h.lost = true;
    h.lostWhy ??= "did not stop when asked";
    const text = `lost: ${h.lostWhy} (the handler did not stop when asked)\n`;
    const now = rt.clocks.wall();
    const report: Report = {
      run_id: h.runId,
      attempt: h.attempt,
      outcome: Outcome.LOST,
      output: (h.tail ?? new OutputTail()).text(text),
      started_at_ms: h.startedAt ?? now,
      ended_at_ms: now,
      token: h.token.toString(),
      no_retry: false,
      retry_after_ms: "0",
    };
    void deliver(rt, h, report, text).catch(() => rt.held.delete(h.key));
  }
  return stuck.length;
}

function forget(rt: Runtime, held: Held): void {
  rt.held.delete(held.key);
  rt.log.info("superseded attempt stopped; not reported", { run: held.runId, attempt: held.attempt });
}

/** Runs the handler; the attempt ends when it returns or throws. */
async function execute(rt: Runtime, held: Held, a: Assign, p: Exclude<Plan, { refusal: string }>, started: number): Promise<Ended> {
  held.executing = true;
  held.startedAt = started;
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
