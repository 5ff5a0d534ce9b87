// The report spool: persisted before it is sent, kept until acked (across
// reconnects and restarts), deleted on ack.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { Peer, until, assign } from "./peer";
import { startWorker, capture } from "./helpers";
import { Spool } from "../src/spool";
import { Outcome, type Report } from "../src/proto";

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), "gnomon-spool-"));
const reportFiles = (dir: string) => fs.readdirSync(dir).filter((n) => n.startsWith("report-"));
const onDisk = (dir: string) => reportFiles(dir).map((n) => JSON.parse(fs.readFileSync(path.join(dir, n), "utf8")) as Report);

function report(run: string): Report {
  return { run_id: run, attempt: 1, outcome: Outcome.SUCCEEDED, output: "x", started_at_ms: 1, ended_at_ms: 2, token: "18446744073709551615", no_retry: false, retry_after_ms: "0" };
}

test("spool files: one per report, atomic, reloaded, deleted when removed", async () => {
  const dir = tmp();
  const a = new Spool(dir, capture());
  assert.equal(await a.load(), 0);
  for (const r of ["r1", "r2", "r3"]) a.commit(await a.write(report(r)));
  assert.equal(reportFiles(dir).length, 3);
  a.remove("1:r2");
  await a.settle();
  assert.equal(reportFiles(dir).length, 2);
  // Leftovers of a crash mid-write are ignored and cleaned up; a corrupt file is set aside.
  fs.writeFileSync(path.join(dir, ".tmp-deadbeef-x"), "{");
  fs.writeFileSync(path.join(dir, "report-bad-1.json"), "{not json");
  const b = new Spool(dir, capture());
  assert.equal(await b.load(), 2);
  assert.deepEqual(b.reports().map((r) => r.run_id).sort(), ["r1", "r3"]);
  assert.equal(b.get("1:r1")!.token, "18446744073709551615", "uint64 tokens survive");
  assert.ok(!fs.existsSync(path.join(dir, ".tmp-deadbeef-x")));
  assert.ok(fs.existsSync(path.join(dir, "report-bad-1.json.corrupt")));
  // Memory only without a directory.
  const m = new Spool(undefined, capture());
  m.commit(await m.write(report("m")));
  assert.equal(m.size, 1);
});

test("a report is on disk before it is sent, re-sent after a restart, and deleted on ack", async () => {
  const dir = tmp();
  const peer = await new Peer().start();
  peer.ackReports = false;
  const seenOnDisk: boolean[] = [];
  // Checked the moment the report arrives: it was persisted before it was sent.
  const origPush = peer.log.push.bind(peer.log);
  peer.log.push = (...items) => {
    for (const e of items) if (e.msg.report) seenOnDisk.push(onDisk(dir).some((r) => r.run_id === e.msg.report!.run_id));
    return origPush(...items);
  };
  const first = startWorker(peer, { spoolDir: dir, workerId: undefined as unknown as string, drainTimeoutMs: 0 }, (w) => w.handler("h", () => "out"));
  const a = assign("h");
  try {
    await until("session", () => peer.sessions.length === 1);
    assert.match(peer.current.hello!.worker_id, /^ts-/, "generated id");
    peer.current.send({ assign: a });
    await until("reported", () => peer.reports(a.run_id).length === 1);
    assert.deepEqual(seenOnDisk, [true]);
    assert.equal(first.worker.unacked, 1);
  } finally {
    // Stopping with an unacked report: the drain waits 5 s for its ack, then gives up.
    await first.stop();
  }
  assert.deepEqual(onDisk(dir).map((r) => [r.run_id, r.output]), [[a.run_id, "out"]], "still on disk after the process ends");
  const id = peer.sessions[0]!.hello!.worker_id;
  // A new process on the same spool: the same id, the report sent again after its Welcome, deleted once acked.
  peer.ackReports = true;
  const second = startWorker(peer, { spoolDir: dir, workerId: undefined as unknown as string }, (w) => w.handler("h", () => "out"));
  try {
    await until("second session", () => peer.sessions.length === 2);
    assert.equal(peer.current.hello!.worker_id, id);
    await until("re-sent", () => peer.current.of("report").length === 1);
    assert.equal(peer.current.of("report")[0]!.run_id, a.run_id);
    const welcomeFirst = peer.current.messages.findIndex((m) => m.report) > peer.current.messages.findIndex((m) => m.hello);
    assert.ok(welcomeFirst);
    await until("deleted on ack", () => second.worker.unacked === 0 && reportFiles(dir).length === 0);
  } finally {
    await second.stop();
    await peer.stop();
  }
});
