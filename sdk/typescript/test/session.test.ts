// Sessions: redirects, refusals and backoff, reconnects (spool re-sent,
// attempts reclaimed or superseded), and the drain.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { Peer, until, assign } from "./peer";
import { startWorker, Gate, aborted, capture } from "./helpers";
import { Outcome } from "../src/proto";

test("NotLeader with an address is followed at once; an empty one means back off and retry", async () => {
  const leader = await new Peer().start();
  let asked = 0;
  const follower = await new Peer({
    answer: () => (++asked === 1 ? { notLeader: "" } : { notLeader: leader.address }),
  }).start();
  const w = startWorker([follower.address], {}, (w) => w.handler("h", () => "ok"));
  try {
    await until("welcomed by the leader", () => leader.sessions.length === 1 && leader.current.of("heartbeat").length > 0);
    assert.equal(follower.sessions.length, 2);
    assert.ok(w.log.has("info", "following the redirect"));
    assert.ok(w.log.has("warn", "no leader yet"));
    const a = assign("h");
    leader.current.send({ assign: a });
    await until("report", () => leader.reports(a.run_id).length === 1);
  } finally {
    await w.stop();
    await leader.stop();
    await follower.stop();
  }
});

test("a refused Hello is logged as an error with the server's message and retried with growing backoff", async () => {
  const times: number[] = [];
  const peer = await new Peer({
    answer: (_h, i) => {
      times.push(Date.now());
      return i < 4 ? { status: grpc.status.PERMISSION_DENIED, details: "not on the list" } : { welcome: {} };
    },
  }).start();
  const w = startWorker(peer, {}, (w) => w.handler("h", () => "ok"));
  try {
    await until("welcomed", () => peer.sessions.length === 5 && peer.current.of("heartbeat").length > 0);
    assert.ok(w.log.records.some((r) => r.level === "error" && r.message === "session refused" && String(r.fields?.["why"]).includes("not on the list")));
    // 100, 200, 400, 800 ms, each jittered by at most 15%.
    const gaps = times.slice(1).map((t, i) => t - times[i]!);
    [100, 200, 400, 800].forEach((b, i) => assert.ok(gaps[i]! >= b * 0.85 - 5, `gap ${i}: ${gaps[i]} >= ${b * 0.85}`));
  } finally {
    await w.stop();
    await peer.stop();
  }
});

test("a throw while handling a leader's message is logged; the session carries on", async () => {
  const peer = await new Peer().start();
  // A logger that fails on one kind of record (a broken transport, say).
  const log = capture();
  const logger = {
    ...log,
    warn: (message: string, fields?: Record<string, unknown>) => {
      if (message.includes("stale token")) throw new Error("log transport down");
      log.warn(message, fields);
    },
  };
  const w = startWorker(peer, { logger }, (w) => w.handler("h", () => "ok"));
  try {
    await until("session", () => peer.sessions.length === 1 && peer.current.of("heartbeat").length > 0);
    const s = peer.current;
    s.send({ assign: assign("h", { token: "5" }) });
    s.send({ cancel: { run_id: "gone", attempt: 1, token: "2" } });
    await until("logged", () => log.has("error", "cannot handle a message from the leader"));
    assert.ok(log.has("error", "log transport down"));
    const a = assign("h", { token: "5" });
    s.send({ assign: a });
    await until("still served", () => peer.reports(a.run_id).length === 1);
    assert.equal(peer.sessions.length, 1, "the same session");
  } finally {
    await w.stop();
    await peer.stop();
  }
});

test("servers are tried in turn; other errors are transient losses", async () => {
  const peer = await new Peer().start();
  const dead = await new Peer({ answer: () => ({ status: grpc.status.UNAVAILABLE, details: "down" }) }).start();
  const w = startWorker([dead.address, peer.address], {}, (w) => w.handler("h", () => "ok"));
  try {
    await until("welcomed by the second", () => peer.sessions.length === 1);
    assert.ok(w.log.has("warn", "session ended; reconnecting"));
    assert.ok(!w.log.records.some((r) => r.level === "error"));
  } finally {
    await w.stop();
    await peer.stop();
    await dead.stop();
  }
});

test("after a reconnect: unacked reports are re-sent, held attempts listed, superseded ones stopped silently", async () => {
  let superseded: string | null = null;
  const peer = await new Peer({
    answer: (hello) => ({
      welcome: {
        leader_token: "1",
        superseded: superseded ? hello.running.filter((r) => r.run_id === superseded) : [],
        reclaimed: hello.running.filter((r) => r.run_id !== superseded),
      },
    }),
  }).start();
  const gate = new Gate();
  const stops: string[] = [];
  const w = startWorker(peer, {}, (w) =>
    w.handler("h", async (ctx) => {
      if (ctx.payload === "quick") return "quick";
      await gate.wait(ctx.signal);
      if (ctx.signal.aborted) stops.push(ctx.runId);
      return "kept";
    }),
  );
  try {
    await until("session", () => peer.sessions.length === 1);
    peer.ackReports = false;
    const [done, kept, gone] = [assign("h", {}, "quick"), assign("h"), assign("h")];
    superseded = gone.run_id;
    for (const a of [done, kept, gone]) peer.current.send({ assign: a });
    await until("the quick one reported", () => peer.reports(done.run_id).length === 1);
    await until("all held", () => peer.current.of("heartbeat").some((h) => h.attempts.length === 2));
    peer.current.end(grpc.status.UNAVAILABLE, "leader restarting");
    peer.ackReports = true;
    await until("second session", () => peer.sessions.length === 2 && peer.current.of("heartbeat").length > 0);
    const s = peer.current;
    assert.deepEqual(s.hello!.running.map((r) => r.run_id).sort(), [kept.run_id, gone.run_id].sort());
    assert.equal(s.of("report").filter((r) => r.run_id === done.run_id).length, 1, "re-sent after the Welcome");
    await until("re-sent report acked", () => w.worker.unacked === 0);
    await until("superseded stopped", () => stops.includes(gone.run_id));
    gate.open();
    await until("the kept one reported", () => peer.reports(kept.run_id).length === 1);
    assert.equal(peer.reports(kept.run_id)[0]!.outcome, Outcome.SUCCEEDED);
    const n = s.of("heartbeat").length;
    await until("two more heartbeats", () => s.of("heartbeat").length >= n + 2);
    assert.equal(peer.reports(gone.run_id).length, 0, "a superseded attempt is not reported");
    assert.deepEqual(s.of("heartbeat").at(-1)!.attempts, []);
  } finally {
    gate.open();
    await w.stop();
    await peer.stop();
  }
});

test("drain: heartbeats say draining, running attempts finish, reports are acked, then run() resolves", async () => {
  const peer = await new Peer().start();
  const gate = new Gate();
  const w = startWorker(peer, { drainTimeoutMs: 10_000 }, (w) =>
    w.handler("h", async () => {
      await gate.wait();
      return "finished";
    }),
  );
  let resolved = false;
  void w.done.then(() => (resolved = true));
  try {
    await until("session", () => peer.sessions.length === 1);
    const a = assign("h");
    peer.current.send({ assign: a });
    await until("held", () => w.worker.held === 1);
    w.worker.stop();
    await until("draining heartbeat", () => peer.current.of("heartbeat").some((h) => h.draining && h.attempts.length === 1));
    assert.equal(resolved, false);
    gate.open();
    await w.done;
    assert.equal(peer.reports(a.run_id)[0]!.outcome, Outcome.SUCCEEDED);
    await until("the session closed", () => peer.current.ended);
  } finally {
    gate.open();
    await w.stop();
    await peer.stop();
  }
});

test("drain timeout: what is still running is stopped and reported lost", async () => {
  const peer = await new Peer().start();
  const w = startWorker(peer, { drainTimeoutMs: 200 }, (w) =>
    w.handler("h", async (ctx) => {
      await aborted(ctx.signal);
      return "stopped";
    }),
  );
  try {
    await until("session", () => peer.sessions.length === 1);
    const a = assign("h");
    peer.current.send({ assign: a });
    await until("held", () => w.worker.held === 1);
    const t0 = Date.now();
    w.worker.stop();
    await w.done;
    assert.ok(Date.now() - t0 >= 190);
    const r = peer.reports(a.run_id)[0]!;
    assert.equal(r.outcome, Outcome.LOST);
    assert.equal(r.output, "lost: drain timeout\n");
  } finally {
    await peer.stop();
  }
});
