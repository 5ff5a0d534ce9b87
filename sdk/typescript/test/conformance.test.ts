// The conformance worker CLI, run as a process against a scripted peer.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { Peer, until, assign } from "./peer";
import { Outcome } from "../src/proto";

test("conformance worker: flags, the standard handlers, SIGTERM drain", async () => {
  const peer = await new Peer().start();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gnomon-conf-"));
  const startLog = path.join(dir, "starts.log");
  const cli = path.resolve(__dirname, "..", "..", "dist", "conformance.js");
  const child = spawn(process.execPath, [cli, "--server", `127.0.0.1:1,${peer.address}`, "--id", "conf-1", "--capacity", "3", "--prefetch", "2", "--label", "lang=ts", "--label", "k=v=w", "--token", "t0k", "--spool", path.join(dir, "spool")], {
    env: { ...process.env, GNOMON_CONFORMANCE_LOG: startLog },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  try {
    await until("session", () => peer.sessions.length === 1 && peer.current.of("heartbeat").length > 0, 15_000);
    const s = peer.current;
    assert.deepEqual(s.hello, {
      worker_id: "conf-1",
      labels: { lang: "ts", k: "v=w" },
      capacity: 3,
      executors: ["handler"],
      handlers: ["echo", "fail", "fenced_step", "log", "no_retry", "retry_after", "sleep"],
      running: [],
      protocol_version: 1,
      prefetch: 2,
    });
    assert.deepEqual(s.metadata.get("authorization"), ["Bearer t0k"]);
    const echo = assign("echo", { params_json: '{"n":1}', token: "12345678901234567890", idempotency_key: "idem" }, { a: 1 });
    const T = { token: "12345678901234567890" };
    const fail = assign("fail", T);
    const noRetry = assign("no_retry", T);
    const retry1 = assign("retry_after", T, { seconds: 3 });
    const retry2 = assign("retry_after", { ...T, attempt: 2 });
    const log = assign("log", T, { lines: 3, width: 5 });
    const sleep = assign("sleep", T, { seconds: 30 });
    for (const a of [echo, fail, noRetry, retry1, retry2, log, sleep]) s.send({ assign: a });
    const r = (a: { run_id: string; attempt: number }) => peer.reports().find((x) => x.run_id === a.run_id && x.attempt === a.attempt);
    await until("reports", () => [echo, fail, noRetry, retry1, retry2, log].every((a) => r(a)), 10_000).catch((e) => {
      throw new Error(`${e.message}; got ${JSON.stringify(peer.reports())}; stderr: ${stderr}`);
    });
    assert.deepEqual(JSON.parse(r(echo)!.output), {
      run_id: echo.run_id,
      attempt: 1,
      job: "job",
      namespace: "default",
      scheduled_at_ms: 1700000000000,
      params: { n: 1 },
      payload: { a: 1 },
      run_payload: null,
      token: "12345678901234567890",
      idempotency_key: "idem",
      worker_id: "conf-1",
    });
    assert.equal(r(fail)!.outcome, Outcome.FAILED);
    assert.match(r(fail)!.output, /^Error: boom\n/);
    assert.deepEqual([r(noRetry)!.outcome, r(noRetry)!.no_retry], [Outcome.FAILED, true]);
    assert.deepEqual([r(retry1)!.outcome, r(retry1)!.retry_after_ms], [Outcome.FAILED, "3000"]);
    assert.deepEqual([r(retry2)!.outcome, r(retry2)!.output], [Outcome.SUCCEEDED, "ok"]);
    assert.equal(r(log)!.output, "INFO xxxxx\nINFO xxxxx\nINFO xxxxx\nlogged");
    await until("ticking", () => peer.all("output").some((o) => o.run_id === sleep.run_id && o.data.toString().includes("tick 2")), 5000);
    assert.equal(fs.readFileSync(startLog, "utf8"), `${sleep.run_id} 1 start\n`);
    s.send({ cancel: { run_id: sleep.run_id, attempt: 1, token: "12345678901234567890" } });
    await until("sleep cancelled", () => r(sleep) !== undefined);
    assert.equal(r(sleep)!.outcome, Outcome.CANCELLED);
    assert.match(r(sleep)!.output, /^INFO tick 1\nINFO tick 2\n(INFO tick \d+\n)*cancelled\n$/);
    child.kill("SIGTERM");
    assert.equal(await exited, 0);
    assert.equal(stdout, "", "nothing on stdout");
    assert.match(stderr, /gnomon-worker INFO: SIGTERM: draining/);
  } finally {
    child.kill("SIGKILL");
    await peer.stop();
  }
});
