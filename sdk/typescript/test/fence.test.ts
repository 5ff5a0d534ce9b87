// The lease and the self-fence: counted from heartbeat send times; a lapsed
// fence stops what the worker holds, reports it lost, and drops Assigns.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Peer, until, assign } from "./peer";
import { startWorker, Gate, aborted, capture } from "./helpers";
import { Outcome } from "../src/proto";
import { Runtime } from "../src/runtime";
import { resolveOptions } from "../src/options";

function fakeRuntime() {
  let t = 100_000;
  const rt = new Runtime(resolveOptions({ servers: "x:1", logger: capture() }), new Map([["h", () => "ok"]]), {
    now: () => t,
    wall: () => Date.now(),
  });
  return { rt, set: (v: number) => (t = v) };
}

test("an ack counts from its heartbeat's send time, not from its arrival", () => {
  const { rt, set } = fakeRuntime();
  rt.leaseTtlMs = 10_000;
  rt.lastAck = 90_000;
  rt.heartbeatsSent.set(6, 93_000);
  rt.heartbeatsSent.set(7, 94_000);
  rt.heartbeatsSent.set(8, 99_000);
  set(100_000);
  rt.handle({ msg: "ack", ack: { heartbeat_seq: "7", rejected_reason: "" } });
  assert.equal(rt.lastAck, 94_000, "the send time of seq 7");
  assert.deepEqual([...rt.heartbeatsSent.keys()], [8], "seqs up to the acked one are forgotten");
  assert.equal(rt.fenceLapsed(), false, "6 s < 7 s");
  set(101_001);
  assert.equal(rt.fenceLapsed(), true, "7.001 s > 0.7 x 10 s");
  // An ack of a heartbeat it never sent (or already forgot) moves nothing.
  rt.handle({ msg: "ack", ack: { heartbeat_seq: "99", rejected_reason: "" } });
  rt.handle({ msg: "ack", ack: { heartbeat_seq: "6", rejected_reason: "" } });
  assert.equal(rt.lastAck, 94_000);
  // Never backwards.
  rt.heartbeatsSent.set(9, 80_000);
  rt.handle({ msg: "ack", ack: { heartbeat_seq: "9", rejected_reason: "" } });
  assert.equal(rt.lastAck, 94_000);
});

test("assignments arriving while the fence has lapsed are dropped, not queued", () => {
  const { rt, set } = fakeRuntime();
  rt.leaseTtlMs = 1000;
  rt.lastAck = 100_000;
  set(100_701);
  rt.handle({ msg: "assign", assign: assign("h", { token: "9" }) });
  assert.equal(rt.running(), 0);
  assert.equal(rt.unacked(), 0);
  assert.equal(rt.maxToken, 9n, "the token still counts");
  set(100_600);
  rt.handle({ msg: "assign", assign: assign("h", { token: "9" }) });
  assert.equal(rt.running(), 1);
});

test("unacked heartbeats: the worker stops its attempts, reports them lost, drops Assigns until acks resume", async () => {
  const peer = await new Peer({ welcome: { lease_ttl_ms: "600", heartbeat_interval_ms: "50" } }).start();
  const gate = new Gate();
  const ran: string[] = [];
  const w = startWorker(peer, { workerId: "w-fence", capacity: 1, prefetch: 2 }, (w) => {
    w.handler("hold", async (ctx) => {
      ran.push(ctx.runId);
      await gate.wait(ctx.signal);
      if (ctx.signal.aborted) ctx.log.info(`stopped: ${ctx.signal.reason.message}`);
      return "held";
    });
  });
  try {
    await until("session", () => peer.sessions.length === 1 && peer.current.of("heartbeat").length > 0);
    const s = peer.current;
    const [a, q1, q2] = [assign("hold"), assign("hold"), assign("hold")];
    for (const x of [a, q1, q2]) s.send({ assign: x });
    await until("one executing, two queued", () => ran.length === 1 && s.of("heartbeat").some((h) => h.queued === 2));
    peer.ackHeartbeats = false;
    await until("all reported lost", () => [a, q1, q2].every((x) => peer.reports(x.run_id).length === 1), 5000);
    for (const x of [a, q1, q2]) assert.equal(peer.reports(x.run_id)[0]!.outcome, Outcome.LOST);
    assert.match(peer.reports(a.run_id)[0]!.output, /^INFO stopped: lost: no heartbeat acknowledged.*\nlost: no heartbeat acknowledged within the safety fraction of the lease\n$/);
    assert.match(peer.reports(q1.run_id)[0]!.output, /^lost before it started: no heartbeat acknowledged/);
    assert.deepEqual(ran, [a.run_id], "the queued ones never ran");
    assert.ok(w.log.has("warn", "self-fencing"));
    // Still lapsed: an Assign is dropped (not queued, not reported).
    const dropped = assign("hold");
    s.send({ assign: dropped });
    const n = s.of("heartbeat").length;
    await until("two more heartbeats", () => s.of("heartbeat").length >= n + 2);
    assert.ok(s.of("heartbeat").slice(n).every((h) => h.attempts.length === 0));
    assert.equal(peer.reports(dropped.run_id).length, 0);
    assert.ok(ran.length === 1 && w.log.has("warn", "assignment dropped"));
    // Acks resume: assignments run again.
    peer.ackHeartbeats = true;
    gate.open();
    const m = s.of("heartbeat").length;
    await until("an acked heartbeat", () => s.of("heartbeat").length >= m + 2);
    const fresh = assign("hold");
    s.send({ assign: fresh });
    await until("fresh reported", () => peer.reports(fresh.run_id).length === 1);
    assert.equal(peer.reports(fresh.run_id)[0]!.outcome, Outcome.SUCCEEDED);
  } finally {
    gate.open();
    await w.stop();
    await peer.stop();
  }
});

test("acks that arrive later than the fence, however regular, do not keep it", async () => {
  // lease 1000 ms: the fence is 700 ms; every ack arrives 800 ms after its
  // heartbeat was sent, so the newest acked send time is always older than it.
  const peer = await new Peer({ welcome: { lease_ttl_ms: "1000", heartbeat_interval_ms: "50" } }).start();
  peer.ackDelayMs = 800;
  const w = startWorker(peer, { workerId: "w-late-acks" }, (w) => {
    w.handler("hold", async (ctx) => {
      await aborted(ctx.signal);
    });
  });
  try {
    await until("session", () => peer.sessions.length === 1);
    const a = assign("hold");
    peer.current.send({ assign: a });
    await until("reported lost", () => peer.reports(a.run_id).length === 1, 5000);
    assert.equal(peer.reports(a.run_id)[0]!.outcome, Outcome.LOST);
  } finally {
    await w.stop();
    await peer.stop();
  }
});
