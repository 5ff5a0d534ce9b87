// Pure units: options, output tail, live buffer, slots, errors, fence, context.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { resolveOptions, parseServers } from "../src/options";
import { tailText, OutputTail, MAX_OUTPUT_BYTES } from "../src/tail";
import { LiveBuffer, LIVE_BUFFER_BYTES, LIVE_PIECE_BYTES, LIVE_RATE_BYTES } from "../src/live";
import { Slots } from "../src/slots";
import { NonRetryable, RetryAfter } from "../src/errors";
import { Fence } from "../src/fence";
import { makeContext } from "../src/context";
import { failure, render } from "../src/attempts";
import { retryAfterField } from "../src/ending";
import { Outcome } from "../src/proto";
import { Worker } from "../src/worker";
import { silentLogger } from "../src/logger";

test("options: defaults and validation", () => {
  const o = resolveOptions({ servers: "a:1, b:2", logger: silentLogger });
  assert.deepEqual(o.servers, ["a:1", "b:2"]);
  assert.equal(o.capacity, 16);
  assert.equal(o.prefetch, 0);
  assert.equal(o.drainTimeoutMs, 30000);
  assert.equal(o.selfFenceFraction, 0.7);
  assert.equal(o.workerId, `ts-${os.hostname()}-${process.pid}`);
  const bad: Array<[object, RegExp]> = [
    [{ servers: [] }, /at least one/],
    [{ servers: "" }, /at least one/],
    [{ servers: ["http://x:1"] }, /not host:port/],
    [{ servers: ["x"] }, /not host:port/],
    [{ servers: ["x:1"], capacity: 0 }, /capacity must be an integer in 1\.\.4096/],
    [{ servers: ["x:1"], capacity: 4097 }, /capacity/],
    [{ servers: ["x:1"], capacity: 1.5 }, /capacity/],
    [{ servers: ["x:1"], prefetch: -1 }, /prefetch must be an integer in 0\.\.65536/],
    [{ servers: ["x:1"], prefetch: 65537 }, /prefetch/],
    [{ servers: ["x:1"], selfFenceFraction: 1 }, /selfFenceFraction must be in \(0, 1\)/],
    [{ servers: ["x:1"], selfFenceFraction: 0 }, /selfFenceFraction/],
    [{ servers: ["x:1"], tls: { cert: "c" } }, /cert and tls.key/],
    [{ servers: ["x:1"], workerId: " " }, /workerId/],
  ];
  for (const [opts, re] of bad) assert.throws(() => new Worker(opts as never), re, JSON.stringify(opts));
  assert.deepEqual(parseServers(["[::1]:7400", "h:1"]), ["[::1]:7400", "h:1"]);
});

test("options: a generated worker id is kept in the spool directory", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gnomon-id-"));
  const a = new Worker({ servers: "x:1", spoolDir: dir, logger: silentLogger });
  const b = new Worker({ servers: "x:1", spoolDir: dir, logger: silentLogger });
  assert.match(a.workerId, /^ts-/);
  assert.equal(a.workerId, b.workerId);
  assert.equal(fs.readFileSync(path.join(dir, "worker-id"), "utf8").trim(), a.workerId);
  assert.equal(new Worker({ servers: "x:1", spoolDir: dir, workerId: "explicit" }).workerId, "explicit");
});

test("handler registration checks names", () => {
  const w = new Worker({ servers: "x:1", logger: silentLogger });
  w.handler("b", () => 1).handler("a.x-y_z", () => 2);
  assert.deepEqual(w.handlerNames, ["a.x-y_z", "b"]);
  assert.throws(() => w.handler("b", () => 1), /already registered/);
  assert.throws(() => w.handler("-x", () => 1), /handler name/);
  assert.throws(() => w.handler("x".repeat(129), () => 1), /handler name/);
});

test("output tail: the last 64 KiB, cut at a UTF-8 character boundary", () => {
  assert.equal(tailText(Buffer.from("héllo")), "héllo");
  // 3-byte characters: any cut point is inside one two times out of three.
  for (const extra of [0, 1, 2]) {
    const text = "a".repeat(extra) + "€".repeat(40000);
    const out = tailText(Buffer.from(text));
    assert.ok(Buffer.byteLength(out) <= MAX_OUTPUT_BYTES, `fits: ${Buffer.byteLength(out)}`);
    assert.ok(Buffer.byteLength(out) > MAX_OUTPUT_BYTES - 64, "nearly full");
    assert.ok(!out.includes("\uFFFD"), "no broken character");
    const m = /^\[gnomon: (\d+) earlier bytes dropped\]\n/.exec(out);
    assert.ok(m, "marker first");
    const body = out.slice(m[0].length);
    assert.equal(Number(m[1]) + Buffer.byteLength(body), Buffer.byteLength(text), "the count is exact");
    assert.ok(text.endsWith(body));
  }
  const t = new OutputTail();
  for (let i = 0; i < 5000; i++) t.push(Buffer.from(`line ${i} ${"ü".repeat(20)}\n`));
  const out = t.text("result");
  assert.ok(Buffer.byteLength(out) <= MAX_OUTPUT_BYTES);
  assert.ok(out.endsWith("line 4999 " + "ü".repeat(20) + "\nresult"));
  assert.ok(!out.includes("\uFFFD"));
});

test("live buffer: pieces of at most 16 KiB, in order, offsets counting every byte", () => {
  const b = new LiveBuffer();
  b.append(Buffer.alloc(40 * 1024, 1));
  const pieces = b.take(0);
  assert.deepEqual(pieces.map((p) => [p.offset, p.data.length]), [
    [0, LIVE_PIECE_BYTES],
    [LIVE_PIECE_BYTES, LIVE_PIECE_BYTES],
    [2 * LIVE_PIECE_BYTES, 8 * 1024],
  ]);
  assert.equal(b.unsent, 0);
  b.append(Buffer.from("next"));
  assert.deepEqual(b.take(10).map((p) => [p.offset, p.data.toString()]), [[40 * 1024, "next"]]);
});

test("live buffer: a full buffer drops its oldest unsent bytes; the offset skips them", () => {
  const b = new LiveBuffer();
  const total = LIVE_BUFFER_BYTES + 1000;
  const data = Buffer.alloc(total);
  for (let i = 0; i < total; i++) data[i] = i % 251;
  for (let i = 0; i < total; i += 7000) b.append(data.subarray(i, Math.min(total, i + 7000)));
  assert.equal(b.unsent, LIVE_BUFFER_BYTES);
  assert.equal(b.total, total);
  const first = b.take(0)[0]!;
  assert.equal(first.offset, 1000, "the first 1000 bytes were dropped");
  assert.deepEqual(first.data, data.subarray(1000, 1000 + LIVE_PIECE_BYTES));
});

test("live buffer: at most 64 KiB per second", () => {
  const b = new LiveBuffer();
  b.append(Buffer.alloc(200 * 1024));
  const sent = (ps: { data: Buffer }[]) => ps.reduce((n, p) => n + p.data.length, 0);
  assert.equal(sent(b.take(0)), LIVE_RATE_BYTES);
  assert.equal(sent(b.take(250)), 0, "the budget is spent for a second");
  assert.equal(sent(b.take(999)), 0);
  const later = b.take(1000);
  assert.equal(sent(later), LIVE_RATE_BYTES);
  assert.equal(later[0]!.offset, LIVE_RATE_BYTES, "continues where it stopped");
});

test("slots: FIFO, bounded, and a wait ends when its signal aborts", async () => {
  const s = new Slots(1);
  const order: number[] = [];
  const c = [new AbortController(), new AbortController(), new AbortController()];
  assert.equal(await s.acquire(new AbortController().signal), true);
  const waits = c.map((ctl, i) => s.acquire(ctl.signal).then((ok) => (ok ? order.push(i) : order.push(-i))));
  assert.equal(s.waiting, 3);
  c[1]!.abort();
  await waits[1];
  s.release();
  await waits[0];
  s.release();
  await waits[2];
  assert.deepEqual(order, [-1, 0, 2]);
  assert.equal(s.inUse, 1);
  s.release();
  assert.equal(s.inUse, 0);
  const gone = new AbortController();
  gone.abort();
  assert.equal(await s.acquire(gone.signal), false, "an aborted signal never gets a slot");
});

test("errors: NonRetryable, RetryAfter and ordinary failures", () => {
  const nr = failure(new NonRetryable("bad input"));
  assert.deepEqual([nr.outcome, nr.noRetry, nr.retryAfterMs, nr.text], [Outcome.FAILED, true, 0, "NonRetryable: bad input\n"]);
  const ra = failure(new RetryAfter(1.5, "later"));
  assert.deepEqual([ra.outcome, ra.noRetry, ra.retryAfterMs, ra.text], [Outcome.FAILED, false, 1500, "RetryAfter: later\n"]);
  assert.equal(new RetryAfter(2).message, "retry after 2 s");
  assert.throws(() => new RetryAfter(-1), /seconds/);
  const e = failure(new TypeError("boom"));
  assert.match(e.text, /^TypeError: boom\n\s+at /);
  assert.equal(failure("plain").text, "thrown: plain\n");
  assert.ok(NonRetryable.is(new NonRetryable("x")) && !NonRetryable.is(new Error("x")));
  assert.equal(render("s"), "s");
  assert.equal(render(undefined), "");
  assert.equal(render(null), "");
  assert.equal(render({ a: 1n }), '{"a":"1"}');
  assert.equal(render(42), "42");
});

test("render and failure never throw, whatever a handler returns or throws", () => {
  const circular: Record<string, unknown> = Object.create(null);
  circular["self"] = circular;
  assert.equal(render(circular), "[object Object]");
  assert.equal(failure(circular).text, "thrown: [object Object]\n");
  const hostile = new Proxy(
    {},
    {
      get: () => {
        throw new Error("no get");
      },
      getPrototypeOf: () => {
        throw new Error("no prototype");
      },
    },
  );
  assert.equal(render(hostile), "[unprintable value]");
  const f = failure(hostile);
  assert.deepEqual([f.outcome, f.text, f.noRetry, f.retryAfterMs], [Outcome.FAILED, "thrown: [unprintable value]\n", false, 0]);
});

test("RetryAfter: a finite number of seconds >= 0, capped at 24 hours, sent as an integer", () => {
  for (const bad of [Infinity, -Infinity, NaN, -1, "10" as unknown as number, Object.create(null)]) {
    assert.throws(() => new RetryAfter(bad), /RetryAfter: seconds must be a finite number >= 0/);
  }
  assert.equal(new RetryAfter(1e20).retryAfterMs, 86_400_000);
  assert.equal(failure(new RetryAfter(1e20)).retryAfterMs, 86_400_000);
  assert.equal(failure(new RetryAfter(0.0004)).retryAfterMs, 0);
  // The seconds checked are the seconds reported.
  const ra = new RetryAfter(3);
  assert.throws(() => {
    (ra as { seconds: number }).seconds = Infinity;
  }, TypeError);
  assert.equal(ra.retryAfterMs, 3000);
  // One from another copy of the package, with a bad delay: FAILED, saying so.
  for (const [seconds, shown] of [[Infinity, "Infinity"], [NaN, "NaN"], [-5, "-5"], ["7", '"7"']] as const) {
    const forged = Object.assign(new Error("later"), { seconds, [Symbol.for("gnomon-worker.RetryAfter")]: true });
    const e = failure(forged);
    assert.deepEqual([e.outcome, e.noRetry, e.retryAfterMs], [Outcome.FAILED, false, 0]);
    assert.equal(e.text, `RetryAfter: later\n(no retry delay: RetryAfter seconds must be a finite number >= 0, got ${shown})\n`);
  }
  assert.equal(retryAfterField(1e23), "86400000");
  assert.equal(retryAfterField(2 ** 64 + 1), "86400000");
  assert.equal(retryAfterField(1500.4), "1500");
  assert.equal(retryAfterField(NaN), "0");
  assert.equal(retryAfterField(-3), "0");
});

test("fence: a value type", () => {
  const f = new Fence("r", 2, 7n);
  assert.deepEqual(f.toJSON(), { runId: "r", attempt: 2, token: "7" });
  assert.ok(new Fence("r", 3, 8n).supersedes(f));
  assert.ok(!f.supersedes(new Fence("r", 3, 8n)));
  assert.ok(f.equals(new Fence("r", 2, 7n)));
  assert.equal(String(f), "Fence(r, 2, 7)");
  assert.ok(Object.isFrozen(f));
});

test("context: log lines are '<LEVEL> <message>' and stop when closed", () => {
  const lines: string[] = [];
  const ctl = new AbortController();
  const open = makeContext({
    runId: "r",
    attempt: 1,
    job: "j",
    namespace: "n",
    workerId: "w",
    scheduledAtMs: 1700000000000,
    params: { a: 1 },
    payload: null,
    runPayload: null,
    token: 3n,
    signal: ctl.signal,
    idempotencyKey: "k",
    write: (l) => lines.push(l),
  });
  const { ctx } = open;
  ctx.log.debug("d");
  ctx.log.info("i %s=%d", "x", 5);
  ctx.log.warn("w");
  ctx.log.error("e");
  open.close();
  ctx.log.info("after");
  assert.deepEqual(lines, ["DEBUG d\n", "INFO i x=5\n", "WARNING w\n", "ERROR e\n"]);
  assert.equal(ctx.scheduledAt.toISOString(), "2023-11-14T22:13:20.000Z");
  assert.ok(ctx.fence.equals(new Fence("r", 1, 3n)));
  assert.equal(ctx.shard, null);
});
