// What a worker does with Assign, Cancel and Abort, seen from a scripted peer.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Peer, until, assign } from "./peer";
import { startWorker, Gate, aborted } from "./helpers";
import { NonRetryable, RetryAfter } from "../src/errors";
import { Outcome } from "../src/proto";
import type { Context } from "../src/context";
import { MAX_OUTPUT_BYTES } from "../src/tail";

let peer: Peer;
before(async () => {
  peer = await new Peer().start();
});
after(async () => {
  await peer.stop();
});

test("hello, heartbeats, and the context a handler sees", async () => {
  let seen: Context | undefined;
  const w = startWorker(peer, { workerId: "w-hello", labels: { zone: "a" }, capacity: 3, prefetch: 5, token: "sekrit" }, (w) => {
    w.handler("zeta", () => "z");
    w.handler("echo", (ctx) => {
      seen = ctx;
      return { ok: true };
    });
  });
  try {
    await until("session", () => peer.sessions.length === 1 && peer.current.of("heartbeat").length >= 2);
    const s = peer.current;
    assert.deepEqual(s.hello, {
      worker_id: "w-hello",
      labels: { zone: "a" },
      capacity: 3,
      executors: ["handler"],
      handlers: ["echo", "zeta"],
      running: [],
      protocol_version: 1,
      prefetch: 5,
    });
    assert.deepEqual(s.metadata.get("authorization"), ["Bearer sekrit"]);
    const hbs = s.of("heartbeat");
    assert.deepEqual(hbs.slice(0, 2).map((h) => h.seq), ["1", "2"]);
    assert.deepEqual(hbs[0], { seq: "1", running: 0, load: 0, attempts: [], draining: false, queued: 0 });
    const a = assign("echo", { params_json: '{"image":"x.png"}', payload: "webhook body", idempotency_key: "idem", token: "4", scheduled_at_ms: "1700000000123" }, { p: [1] });
    s.send({ assign: a });
    await until("report", () => peer.reports(a.run_id).length === 1);
    const r = peer.reports(a.run_id)[0]!;
    assert.equal(r.outcome, Outcome.SUCCEEDED);
    assert.equal(r.output, '{"ok":true}');
    assert.equal(r.token, "4");
    assert.equal(r.no_retry, false);
    assert.equal(r.retry_after_ms, "0");
    assert.ok(Number(r.started_at_ms) <= Number(r.ended_at_ms));
    assert.ok(Math.abs(Number(r.ended_at_ms) - Date.now()) < 5000, "wall clock ms");
    assert.equal(s.of("started").length, 0, "no Started for an attempt that ends at once");
    const c = seen!;
    assert.equal(c.runId, a.run_id);
    assert.equal(c.attempt, 1);
    assert.equal(c.job, "job");
    assert.equal(c.namespace, "default");
    assert.equal(c.workerId, "w-hello");
    assert.equal(c.scheduledAtMs, 1700000000123);
    assert.equal(c.scheduledAt.getTime(), 1700000000123);
    assert.deepEqual(c.params, { image: "x.png" });
    assert.deepEqual(c.payload, { p: [1] });
    assert.equal(c.runPayload, "webhook body");
    assert.equal(c.shard, null);
    assert.equal(c.token, 4n);
    assert.equal(c.idempotencyKey, "idem");
    assert.deepEqual(c.fence.toJSON(), { runId: a.run_id, attempt: 1, token: "4" });
    assert.equal(c.signal.aborted, false);
    await until("acked", () => w.worker.unacked === 0);
  } finally {
    await w.stop();
  }
});

test("outcomes: errors, NonRetryable, RetryAfter, timeout, Started, refusals", async () => {
  const w = startWorker(peer, { workerId: "w-outcomes", capacity: 8 }, (w) => {
    w.handler("boom", (ctx) => {
      ctx.log.info("about to fail");
      throw new Error("boom");
    });
    w.handler("async_boom", async () => {
      await new Promise((r) => setTimeout(r, 1));
      throw new TypeError("async boom");
    });
    w.handler("no_retry", () => {
      throw new NonRetryable("bad input");
    });
    w.handler("retry_after", () => {
      throw new RetryAfter(2.5);
    });
    w.handler("slow", async (ctx) => {
      await aborted(ctx.signal);
      ctx.log.info("saw %s", ctx.signal.reason?.message);
      return "stopped";
    });
    w.handler("sleep100", async () => {
      await new Promise((r) => setTimeout(r, 100));
      return "";
    });
  });
  try {
    await until("session", () => peer.sessions.some((s) => s.hello?.worker_id === "w-outcomes"));
    const s = peer.current;
    const runs = {
      boom: assign("boom"),
      asyncBoom: assign("async_boom"),
      noRetry: assign("no_retry"),
      retryAfter: assign("retry_after"),
      timeout: assign("slow", { timeout_ms: "100" }),
      started: assign("sleep100"),
      unknown: assign("nope"),
      shell: assign("x", { executor_json: '{"shell":{"command":["true"]}}' }),
      badJson: assign("x", { executor_json: "{" }),
      badParams: assign("boom", { params_json: "[1]" }),
    };
    for (const a of Object.values(runs)) s.send({ assign: a });
    await until("all reported", () => Object.values(runs).every((a) => peer.reports(a.run_id).length > 0));
    const r = (a: { run_id: string }) => peer.reports(a.run_id)[0]!;
    assert.equal(r(runs.boom).outcome, Outcome.FAILED);
    assert.match(r(runs.boom).output, /^INFO about to fail\nError: boom\n\s+at /);
    assert.equal(r(runs.boom).no_retry, false);
    assert.match(r(runs.asyncBoom).output, /^TypeError: async boom\n\s+at /);
    assert.deepEqual([r(runs.noRetry).outcome, r(runs.noRetry).no_retry, r(runs.noRetry).output], [Outcome.FAILED, true, "NonRetryable: bad input\n"]);
    assert.deepEqual([r(runs.retryAfter).outcome, r(runs.retryAfter).retry_after_ms, r(runs.retryAfter).no_retry], [Outcome.FAILED, "2500", false]);
    assert.equal(r(runs.timeout).outcome, Outcome.TIMED_OUT);
    assert.equal(r(runs.timeout).output, "INFO saw timed out\ntimed out after 0.1 s\n");
    assert.equal(r(runs.started).outcome, Outcome.SUCCEEDED);
    const started = s.of("started").filter((x) => x.run_id === runs.started.run_id);
    assert.equal(started.length, 1, "Started once, for an attempt running over 20 ms");
    assert.equal(started[0]!.started_at_ms, r(runs.started).started_at_ms);
    const startedAt = s.messages.findIndex((m) => m.started?.run_id === runs.started.run_id);
    const reportedAt = s.messages.findIndex((m) => m.report?.run_id === runs.started.run_id);
    assert.ok(startedAt < reportedAt);
    assert.equal(r(runs.unknown).outcome, Outcome.FAILED);
    assert.match(r(runs.unknown).output, /no handler named "nope" on worker w-outcomes \(it has: async_boom, boom, no_retry, retry_after, sleep100, slow\)/);
    assert.match(r(runs.shell).output, /does not run shell jobs/);
    assert.match(r(runs.badJson).output, /cannot read the executor spec/);
    assert.match(r(runs.badParams).output, /cannot read the run's params/);
  } finally {
    await w.stop();
  }
});

test("cancel reports CANCELLED; abort stops without a report; stale tokens are ignored; duplicates too", async () => {
  const calls = new Map<string, number>();
  const gate = new Gate();
  const w = startWorker(peer, { workerId: "w-cancel", capacity: 8 }, (w) => {
    w.handler("wait", async (ctx) => {
      calls.set(ctx.runId, (calls.get(ctx.runId) ?? 0) + 1);
      await gate.wait(ctx.signal);
      return ctx.signal.aborted ? "stopped" : "done";
    });
  });
  try {
    await until("session", () => peer.sessions.some((s) => s.hello?.worker_id === "w-cancel"));
    const s = peer.current;
    const [c, ab, dup, stale, staleCancel] = [assign("wait", { token: "3" }), assign("wait", { token: "3" }), assign("wait", { token: "3" }), assign("wait", { token: "2" }), assign("wait", { token: "3" })];
    for (const a of [c, ab, dup, staleCancel]) s.send({ assign: a });
    s.send({ assign: dup });
    s.send({ assign: stale });
    await until("four running", () => calls.size === 4);
    s.send({ cancel: { run_id: c.run_id, attempt: 1, token: "3" } });
    s.send({ abort: { run_id: ab.run_id, attempt: 1, token: "3", reason: "superseded" } });
    s.send({ cancel: { run_id: staleCancel.run_id, attempt: 1, token: "2" } });
    await until("cancelled", () => peer.reports(c.run_id).length === 1);
    assert.equal(peer.reports(c.run_id)[0]!.outcome, Outcome.CANCELLED);
    assert.equal(peer.reports(c.run_id)[0]!.output, "cancelled\n", "a stop's reason replaces the result");
    // After the Abort: it is no longer listed, and never reported.
    const listed = () => (s.of("heartbeat").at(-1)?.attempts ?? []).map((x) => x.run_id).sort();
    await until("the aborted one unlisted", () => JSON.stringify(listed()) === JSON.stringify([dup.run_id, staleCancel.run_id].sort()));
    const n = s.of("heartbeat").length;
    await until("two more heartbeats", () => s.of("heartbeat").length >= n + 2);
    assert.equal(peer.reports(ab.run_id).length, 0);
    assert.equal(calls.get(dup.run_id), 1, "a duplicate Assign while running is ignored");
    assert.equal(calls.has(stale.run_id), false, "an Assign with a stale token is ignored");
    assert.ok(w.log.has("warn", "stale token"));
    gate.open();
    await until("rest reported", () => peer.reports(dup.run_id).length === 1 && peer.reports(staleCancel.run_id).length === 1);
    assert.equal(peer.reports(staleCancel.run_id)[0]!.outcome, Outcome.SUCCEEDED, "a Cancel with a stale token is ignored");
    // A duplicate of a reported attempt whose report is still unacked is ignored too.
    peer.ackReports = false;
    const late = assign("wait", { token: "3" });
    s.send({ assign: late });
    await until("late reported", () => peer.reports(late.run_id).length === 1);
    s.send({ assign: late });
    await until("two more heartbeats", () => s.of("heartbeat").length >= n + 6);
    assert.equal(calls.get(late.run_id), 1);
    assert.equal(peer.reports(late.run_id).length, 1);
    // An Abort forgets a spooled report.
    assert.equal(w.worker.unacked, 1);
    s.send({ abort: { run_id: late.run_id, attempt: 1, token: "3", reason: "" } });
    await until("forgotten", () => w.worker.unacked === 0);
  } finally {
    peer.ackReports = true;
    gate.open();
    await w.stop();
  }
});

test("capacity bounds execution; the prefetch queue runs in order; a cancelled queued attempt never runs", async () => {
  const order: string[] = [];
  let now = 0;
  let peak = 0;
  const gate = new Gate();
  const w = startWorker(peer, { workerId: "w-cap", capacity: 2, prefetch: 3 }, (w) => {
    w.handler("gate", async (ctx) => {
      order.push(ctx.runId);
      now++;
      peak = Math.max(peak, now);
      await gate.wait();
      now--;
    });
  });
  try {
    await until("session", () => peer.sessions.some((s) => s.hello?.worker_id === "w-cap"));
    const s = peer.current;
    const runs = [0, 1, 2, 3, 4].map(() => assign("gate"));
    for (const a of runs) s.send({ assign: a });
    await until("two executing", () => order.length === 2);
    await until("a heartbeat listing all five", () => s.of("heartbeat").some((h) => h.attempts.length === 5));
    const hb = s.of("heartbeat").find((h) => h.attempts.length === 5)!;
    assert.deepEqual([hb.running, hb.queued, hb.load], [2, 3, 1]);
    assert.equal(order.length, 2);
    s.send({ cancel: { run_id: runs[3]!.run_id, attempt: 1, token: "1" } });
    await until("the cancelled one reported", () => peer.reports(runs[3]!.run_id).length === 1);
    const rep = peer.reports(runs[3]!.run_id)[0]!;
    assert.deepEqual([rep.outcome, rep.output], [Outcome.CANCELLED, "cancelled before it started"]);
    gate.open();
    await until("all reported", () => runs.every((a) => peer.reports(a.run_id).length === 1));
    assert.equal(peak, 2, "never more than capacity at once");
    assert.deepEqual(order, [runs[0], runs[1], runs[2], runs[4]].map((a) => a!.run_id), "FIFO, without the cancelled one");
  } finally {
    gate.open();
    await w.stop();
  }
});

test("output: the report carries the last 64 KiB, cut at a character boundary", async () => {
  const w = startWorker(peer, { workerId: "w-tail" }, (w) => {
    w.handler("big", (ctx) => {
      for (let i = 0; i < 3000; i++) ctx.log.info(`${i} ${"€".repeat(30)}`);
      return "fin";
    });
  });
  try {
    await until("session", () => peer.sessions.some((s) => s.hello?.worker_id === "w-tail"));
    const a = assign("big");
    peer.current.send({ assign: a });
    await until("report", () => peer.reports(a.run_id).length === 1);
    const out = peer.reports(a.run_id)[0]!.output;
    assert.ok(Buffer.byteLength(out) <= MAX_OUTPUT_BYTES);
    assert.ok(Buffer.byteLength(out) > MAX_OUTPUT_BYTES - 100);
    assert.match(out, /^\[gnomon: \d+ earlier bytes dropped\]\n/);
    assert.ok(out.endsWith(`INFO 2999 ${"€".repeat(30)}\nfin`));
    assert.ok(!out.includes("\uFFFD"));
  } finally {
    await w.stop();
  }
});
