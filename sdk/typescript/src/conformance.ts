#!/usr/bin/env node
/**
 * The conformance worker: the standard handlers (`echo`, `fail`,
 * `no_retry`, `retry_after`, `sleep`, `log`, `fenced_step`) on a worker
 * configured from the command line. Logs go to stderr.
 *
 * ```
 * node dist/conformance.js --server HOST:PORT [--server …] [--id ID] [--capacity N]
 *   [--prefetch N] [--spool DIR] [--token T] [--label k=v …] [--ca PEM]
 * ```
 *
 * @packageDocumentation
 */
import * as fs from "node:fs";
import { parseArgs } from "node:util";
import type { Context } from "./context";
import { NonRetryable, RetryAfter } from "./errors";
import { beginAttempt, runStep, type QueryClient } from "./guard";
import { Worker } from "./worker";

function payloadNumber(ctx: Context, field: string, dflt: number): number {
  const p = ctx.payload as Record<string, unknown> | null;
  const v = p && typeof p === "object" ? p[field] : undefined;
  return typeof v === "number" && Number.isFinite(v) ? v : dflt;
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

/** Registers the standard conformance handlers on `worker`. */
export function registerConformanceHandlers(worker: Worker): Worker {
  worker.handler("echo", (ctx) =>
    JSON.stringify({
      run_id: ctx.runId,
      attempt: ctx.attempt,
      job: ctx.job,
      namespace: ctx.namespace,
      scheduled_at_ms: ctx.scheduledAtMs,
      params: ctx.params,
      payload: ctx.payload,
      run_payload: ctx.runPayload,
      token: ctx.token.toString(),
      idempotency_key: ctx.idempotencyKey,
      worker_id: ctx.workerId,
    }),
  );
  worker.handler("fail", () => {
    throw new Error("boom");
  });
  worker.handler("no_retry", () => {
    throw new NonRetryable("bad input");
  });
  worker.handler("retry_after", (ctx) => {
    if (ctx.attempt === 1) throw new RetryAfter(payloadNumber(ctx, "seconds", 1));
    return "ok";
  });
  worker.handler("sleep", async (ctx) => {
    const file = process.env["GNOMON_CONFORMANCE_LOG"];
    if (file) fs.appendFileSync(file, `${ctx.runId} ${ctx.attempt} start\n`);
    const until = Date.now() + payloadNumber(ctx, "seconds", 60) * 1000;
    let n = 0;
    while (!ctx.signal.aborted && Date.now() < until) {
      await sleep(Math.min(100, Math.max(0, until - Date.now())), ctx.signal);
      if (ctx.signal.aborted) break;
      n++;
      ctx.log.info(`tick ${n}`);
    }
    return "slept";
  });
  worker.handler("log", (ctx) => {
    const lines = payloadNumber(ctx, "lines", 1000);
    const width = payloadNumber(ctx, "width", 100);
    const line = "x".repeat(Math.max(0, width));
    for (let i = 0; i < lines; i++) ctx.log.info(line);
    return "logged";
  });
  worker.handler("fenced_step", fencedStep);
  return worker;
}

function note(line: string): void {
  const file = process.env["GNOMON_CONFORMANCE_LOG"];
  if (file) fs.appendFileSync(file, `${line}\n`);
}

type Closable = QueryClient & { end(): Promise<void> };

/** A `pg` client for `postgres://`, a `mysql2` connection for `mysql://` (both loaded when first used). */
async function connect(dsn: string): Promise<Closable> {
  // The drivers are the application's: required here, not dependencies of the SDK.
  const load = (name: string): any => require(name);
  if (/^postgres(ql)?:\/\//.test(dsn)) {
    const { Client } = load("pg");
    const c = new Client({ connectionString: dsn });
    // A connection the server ends (the idle timeout) fails its queries; it must not crash the worker.
    c.on("error", () => undefined);
    await c.connect();
    return c;
  }
  if (dsn.startsWith("mysql://")) {
    const c = await load("mysql2/promise").createConnection(dsn);
    c.on("error", () => undefined);
    return c;
  }
  throw new NonRetryable(`not a postgres:// or mysql:// URL: ${JSON.stringify(dsn)}`);
}

/**
 * Pays once per run: inserts `(run_id, attempt, amount)` into `payments` of
 * the database `payload.dsn` (`postgres://` or `mysql://`) in the
 * exactly-once step `payment` (`beginAttempt` first, then `runStep`), and
 * returns the step's result as JSON.
 *
 * `payload.pause` (`before_guard`, `in_tx`, `after_commit`) makes attempt 1
 * note `"<run> 1 <worker> paused <where>"` and wait `payload.pause_seconds`
 * (3) there, not looking at its signal — a job that does not cooperate — so
 * that it can be frozen there. `payload.lock_wait` and `payload.idle`
 * (seconds) go to the guard; `payload.guarded` false makes the same insert
 * in a plain transaction. Notes `"<run> <attempt> committed|recorded
 * paid_by=<n>"`, or `"<run> <attempt> failed: <error>"`, in
 * GNOMON_CONFORMANCE_LOG.
 */
async function fencedStep(ctx: Context): Promise<string> {
  const p = (ctx.payload && typeof ctx.payload === "object" ? ctx.payload : {}) as Record<string, unknown>;
  const options = { lockWaitMs: payloadNumber(ctx, "lock_wait", 5) * 1000, idleMs: payloadNumber(ctx, "idle", 10) * 1000 };
  const amount = payloadNumber(ctx, "amount", 10);
  const pauseAt = ctx.attempt === 1 ? p["pause"] : undefined;
  const me = `${ctx.runId} ${ctx.attempt}`;
  const pause = async (where: string) => {
    if (pauseAt !== where) return;
    note(`${me} ${ctx.workerId} paused ${where}`);
    await new Promise((r) => setTimeout(r, payloadNumber(ctx, "pause_seconds", 3) * 1000));
  };
  const dsn = String(p["dsn"] ?? "");
  const pg = /^postgres/.test(dsn);
  let ran = false;
  const pay = async (c: QueryClient) => {
    ran = true;
    await c.query(`INSERT INTO payments (run_id, attempt, amount) VALUES (${pg ? "$1, $2, $3" : "?, ?, ?"})`, [ctx.runId, ctx.attempt, amount]);
    await pause("in_tx");
    return { paid_by: ctx.attempt, amount };
  };
  let result: { paid_by: number; amount: number };
  try {
    const c = await connect(dsn);
    try {
      if (p["guarded"] !== false) {
        await beginAttempt(c, ctx.fence, options);
        await pause("before_guard");
        result = await runStep(c, ctx.fence, "payment", pay, options);
      } else {
        await pause("before_guard");
        await c.query("BEGIN");
        result = await pay(c);
        await c.query("COMMIT");
      }
      await pause("after_commit");
    } finally {
      await c.end().catch(() => undefined);
    }
  } catch (e) {
    note(`${me} failed: ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`.replace(/\n/g, " "));
    throw e;
  }
  note(`${me} ${ran ? "committed" : "recorded"} paid_by=${result.paid_by}`);
  return JSON.stringify(result);
}

const USAGE = `usage: conformance --server HOST:PORT [--server ...] [--id ID] [--capacity N] [--prefetch N]
                   [--spool DIR] [--token T] [--label k=v ...] [--ca PEM]`;

/** Parses the conformance worker's command line and runs it until SIGTERM/SIGINT. */
export async function main(argv: string[] = process.argv.slice(2)): Promise<void> {
  const { values } = parseArgs({
    args: argv,
    options: {
      server: { type: "string", multiple: true },
      id: { type: "string" },
      capacity: { type: "string", default: "4" },
      prefetch: { type: "string", default: "0" },
      spool: { type: "string" },
      token: { type: "string" },
      label: { type: "string", multiple: true },
      ca: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
  });
  if (values.help) {
    console.error(USAGE);
    return;
  }
  const servers = (values.server ?? []).flatMap((s) => s.split(","));
  const labels: Record<string, string> = {};
  for (const l of values.label ?? []) {
    const eq = l.indexOf("=");
    if (eq <= 0) throw new Error(`--label ${l}: expected k=v`);
    labels[l.slice(0, eq)] = l.slice(eq + 1);
  }
  const int = (flag: string, v: string) => {
    if (!/^\d+$/.test(v)) throw new Error(`--${flag} ${v}: not a number`);
    return Number(v);
  };
  const worker = new Worker({
    servers,
    capacity: int("capacity", values.capacity!),
    prefetch: int("prefetch", values.prefetch!),
    labels,
    ...(values.id !== undefined ? { workerId: values.id } : {}),
    ...(values.spool !== undefined ? { spoolDir: values.spool } : {}),
    ...(values.token !== undefined ? { token: values.token } : {}),
    ...(values.ca !== undefined ? { tls: { ca: values.ca } } : {}),
  });
  registerConformanceHandlers(worker);
  await worker.run();
}

if (require.main === module) {
  main().then(
    () => process.exit(0),
    (e: unknown) => {
      console.error(`conformance: ${e instanceof Error ? e.message : String(e)}`);
      console.error(USAGE);
      process.exit(2);
    },
  );
}
