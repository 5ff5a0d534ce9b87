// The worker's own failures, driven on a Runtime without a server: values
// that cannot be printed, a logger or a clock that throws, huge retry
// delays, handlers that ignore a drain's stop, live output after a stop.
import { test } from "node:test";
import assert from "node:assert/strict";
import { until, assign } from "./peer";
import { capture, Gate } from "./helpers";
import { Runtime, type Clocks } from "../src/runtime";
import { resolveOptions } from "../src/options";
import { Outcome, type Report, type WorkerMessage } from "../src/proto";
import { RetryAfter } from "../src/errors";
import { drainDone, DRAIN_ACK_WAIT_MS } from "../src/session";
import type { Handler } from "../src/context";
import type { Logger } from "../src/logger";

/** A runtime for `handlers` whose messages to the leader are kept in `sent`. */
function runtime(handlers: Record<string, Handler>, opts: { logger?: Logger; clocks?: Clocks; capacity?: number } = {}) {
  const log = capture();
  const rt = new Runtime(
    resolveOptions({ servers: "x:1", logger: opts.logger ?? log, capacity: opts.capacity ?? 4 }),
    new Map(Object.entries(handlers)),
    opts.clocks,
  );
  const sent: WorkerMessage[] = [];
  rt.outbound = (m) => void sent.push(m);
  const reports = (run?: string): Report[] => sent.filter((m) => m.report && (run === undefined || m.report.run_id === run)).map((m) => m.report!);
  const outputs = (run: string) => sent.filter((m) => m.output?.run_id === run).map((m) => m.output!);
  return { rt, log, sent, reports, outputs };
}

test("a handler throwing a circular, prototype-less object is reported FAILED, its slot freed", async () => {
  const weird: Record<string, unknown> = Object.create(null);
  weird["self"] = weird;
  const { rt, reports } = runtime(
    {
      h: () => {
        throw weird;
      },
      ok: () => "fine",
    },
    { capacity: 1 },
  );
  const a = assign("h");
  rt.handle({ msg: "assign", assign: a });
  await until("report", () => reports(a.run_id).length === 1, 2000);
  const r = reports(a.run_id)[0]!;
  assert.deepEqual([r.outcome, r.output], [Outcome.FAILED, "thrown: [object Object]\n"]);
  assert.equal(rt.running(), 0, "not held");
  assert.equal(rt.slots.inUse, 0, "its slot given back");
  const b = assign("ok");
  rt.handle({ msg: "assign", assign: b });
  await until("the next one runs", () => reports(b.run_id).length === 1, 2000);
});

test("should the worker's own bookkeeping throw, the attempt still ends: not held, slot given back, reported FAILED", async () => {
  // A clock that breaks once, as the handler returns (the slot is held then).
  let breakClock = false;
  const clocks: Clocks = {
    now: () => performance.now(),
    wall: () => {
      if (breakClock) {
        breakClock = false;
        throw new Error("clock broke");
      }
      return Date.now();
    },
  };
  // A logger that throws on refusals.
  const log = capture();
  const logger: Logger = {
    ...log,
    warn: (message, fields) => {
      if (message.includes("refused")) throw new Error("log transport down");
      log.warn(message, fields);
    },
  };
  const { rt, reports } = runtime(
    {
      h: () => {
        breakClock = true;
        return "done";
      },
      ok: () => "fine",
    },
    { clocks, logger, capacity: 1 },
  );
  const a = assign("h");
  rt.handle({ msg: "assign", assign: a });
  await until("report", () => reports(a.run_id).length === 1, 2000);
  const r = reports(a.run_id)[0]!;
  assert.equal(r.outcome, Outcome.FAILED);
  assert.match(r.output, /^the worker could not finish the attempt: Error: clock broke\n/);
  assert.equal(rt.running(), 0);
  assert.equal(rt.slots.inUse, 0);
  const refused = assign("nope");
  rt.handle({ msg: "assign", assign: refused });
  await until("refusal reported", () => reports(refused.run_id).length === 1, 2000);
  assert.match(reports(refused.run_id)[0]!.output, /log transport down/);
  assert.equal(rt.running(), 0);
  const b = assign("ok");
  rt.handle({ msg: "assign", assign: b });
  await until("the next one runs", () => reports(b.run_id).length === 1, 2000);
  assert.equal(reports(b.run_id)[0]!.outcome, Outcome.SUCCEEDED);
});

test("a stale token's warning gives the logger strings, not bigints", () => {
  // A JSON logger (as winston's) throws on a bigint.
  const lines: string[] = [];
  const json = (message: string, fields?: object) => void lines.push(JSON.stringify({ message, ...fields }));
  const { rt } = runtime({ h: () => "ok" }, { logger: { debug: json, info: json, warn: json, error: json } });
  rt.handle({ msg: "assign", assign: assign("h", { token: "5" }) });
  assert.doesNotThrow(() => rt.handle({ msg: "assign", assign: assign("h", { token: "3" }) }));
  const warned = lines.map((l) => JSON.parse(l)).find((l) => l.message.includes("stale token"));
  assert.deepEqual([warned?.token, warned?.max], ["3", "5"]);
});

test("a huge RetryAfter is sent as 24 hours, as an integer", async () => {
  const { rt, reports } = runtime({
    huge: () => {
      throw new RetryAfter(1e20);
    },
    big: () => {
      throw new RetryAfter(2 ** 64 / 1000 + 1e6);
    },
  });
  const [a, b] = [assign("huge"), assign("big")];
  rt.handle({ msg: "assign", assign: a });
  rt.handle({ msg: "assign", assign: b });
  await until("reports", () => reports().length === 2, 2000);
  for (const x of [a, b]) {
    const r = reports(x.run_id)[0]!;
    assert.deepEqual([r.outcome, r.retry_after_ms], [Outcome.FAILED, "86400000"]);
  }
});

test("the end of a drain reports handlers that ignore the stop LOST, drops them, and the drain ends", async () => {
  let t = 1_000_000;
  const clocks: Clocks = { now: () => t, wall: () => Date.now() };
  const gate = new Gate();
  const { rt, reports, outputs } = runtime(
    {
      deaf: async (ctx) => {
        ctx.log.info("working");
        await gate.wait(); // never looks at ctx.signal
        return "late";
      },
    },
    { clocks },
  );
  try {
    const a = assign("deaf");
    rt.handle({ msg: "assign", assign: a });
    await until("executing", () => rt.executing() === 1, 2000);
    const deadline = t + 100;
    rt.requestStop(deadline);
    t = deadline;
    assert.equal(drainDone(rt, deadline), false);
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(rt.running(), 1, "still running: it ignored the stop");
    t = deadline + DRAIN_ACK_WAIT_MS;
    assert.equal(drainDone(rt, deadline), false, "not before its report is written");
    await until("reported", () => reports(a.run_id).length === 1, 2000);
    const r = reports(a.run_id)[0]!;
    assert.deepEqual([r.outcome, r.output], [Outcome.LOST, "INFO working\nlost: drain timeout (the handler did not stop when asked)\n"]);
    assert.equal(Buffer.concat(outputs(a.run_id).map((o) => o.data)).toString(), r.output, "its live stream ends as its report does");
    assert.equal(rt.running(), 0, "no longer held (nor listed in heartbeats)");
    assert.equal(rt.unacked(), 1, "spooled");
    assert.equal(drainDone(rt, deadline), true);
    // The handler's eventual result is dropped.
    gate.open();
    await until("slot given back", () => rt.slots.inUse === 0, 2000);
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(reports(a.run_id).length, 1);
  } finally {
    gate.open();
  }
});

test("live output of attempts superseded or stopped as lost is not flushed while their handlers run on", async () => {
  const gate = new Gate();
  const { rt, outputs } = runtime({
    talk: async (ctx) => {
      ctx.log.info("said");
      await gate.wait(); // ignores ctx.signal
      return "";
    },
  });
  const [superseded, lost, live] = [assign("talk"), assign("talk"), assign("talk")];
  try {
    rt.handle({ msg: "assign", assign: superseded });
    rt.handle({ msg: "assign", assign: lost });
    await until("both executing", () => rt.executing() === 2, 2000);
    rt.handle({ msg: "abort", abort: { run_id: superseded.run_id, attempt: 1, token: "1", reason: "superseded" } });
    rt.fenceSelf("test fence");
    rt.handle({ msg: "assign", assign: live });
    await until("three executing", () => rt.executing() === 3, 2000);
    rt.startTimers();
    await until("the running one's output flushed", () => outputs(live.run_id).length > 0, 2000);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(outputs(superseded.run_id).length, 0);
    assert.equal(outputs(lost.run_id).length, 0);
  } finally {
    rt.stopTimers();
    gate.open();
  }
});
