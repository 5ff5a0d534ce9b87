// Live output: Output pieces as the attempt writes, bounded and rate-limited.
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Peer, until, assign } from "./peer";
import { startWorker, Gate } from "./helpers";
import { LIVE_BUFFER_BYTES, LIVE_PIECE_BYTES, LIVE_RATE_BYTES } from "../src/live";
import type { Output } from "../src/proto";

let peer: Peer;
before(async () => {
  peer = await new Peer().start();
});
after(async () => {
  await peer.stop();
});

const outputs = (run: string): Output[] => peer.all("output").filter((o) => o.run_id === run);

test("lines stream as Output pieces while the attempt runs, before its Report", async () => {
  const gate = new Gate();
  const w = startWorker(peer, { workerId: "w-live" }, (w) => {
    w.handler("talk", async (ctx) => {
      ctx.log.info("one");
      ctx.log.warn("two");
      await gate.wait();
      ctx.log.error("three");
      return "done";
    });
  });
  try {
    await until("session", () => peer.sessions.some((s) => s.hello?.worker_id === "w-live"));
    const a = assign("talk", { token: "1" });
    peer.current.send({ assign: a });
    await until("live output", () => outputs(a.run_id).length >= 1);
    assert.equal(peer.reports(a.run_id).length, 0, "sent while running");
    const first = outputs(a.run_id)[0]!;
    assert.deepEqual([first.offset, first.token, first.data.toString()], ["0", "1", "INFO one\nWARNING two\n"]);
    gate.open();
    await until("report", () => peer.reports(a.run_id).length === 1);
    const all = outputs(a.run_id);
    // The stream ends with the attempt's last words (its result), as its report does.
    assert.equal(Buffer.concat(all.map((o) => o.data)).toString(), "INFO one\nWARNING two\nERROR three\ndone");
    assert.equal(all.at(-1)!.offset, String("INFO one\nWARNING two\n".length));
    // Flushed just before the Report.
    const s = peer.current;
    const lastOut = s.messages.map((m) => m.output?.run_id === a.run_id).lastIndexOf(true);
    const rep = s.messages.findIndex((m) => m.report?.run_id === a.run_id);
    assert.ok(lastOut < rep);
  } finally {
    gate.open();
    await w.stop();
  }
});

test("a flood: pieces of at most 16 KiB, the oldest unsent bytes dropped past 256 KiB, at most 64 KiB a second", async () => {
  const gate = new Gate();
  const line = "y".repeat(1018); // 1 KiB lines with "INFO " and the newline
  const lines = 400;
  const w = startWorker(peer, { workerId: "w-flood" }, (w) => {
    w.handler("flood", async (ctx) => {
      for (let i = 0; i < lines; i++) ctx.log.info(line);
      await gate.wait();
      return "";
    });
  });
  try {
    await until("session", () => peer.sessions.some((s) => s.hello?.worker_id === "w-flood"));
    const a = assign("flood");
    const sentAt = Date.now();
    peer.current.send({ assign: a });
    await until("a second's worth", () => outputs(a.run_id).reduce((n, o) => n + o.data.length, 0) >= LIVE_RATE_BYTES);
    const within = Date.now() - sentAt;
    const got = outputs(a.run_id);
    const total = lines * 1024;
    assert.equal(Number(got[0]!.offset), total - LIVE_BUFFER_BYTES, "the oldest unsent bytes were dropped");
    for (const o of got) assert.ok(o.data.length <= LIVE_PIECE_BYTES);
    for (let i = 1; i < got.length; i++) {
      assert.equal(Number(got[i]!.offset), Number(got[i - 1]!.offset) + got[i - 1]!.data.length, "contiguous after the gap");
    }
    const sent = got.reduce((n, o) => n + o.data.length, 0);
    if (within < 900) assert.equal(sent, LIVE_RATE_BYTES, "no more than the budget within the first second");
    gate.open();
    await until("report", () => peer.reports(a.run_id).length === 1);
  } finally {
    gate.open();
    await w.stop();
  }
});
