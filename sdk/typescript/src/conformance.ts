#!/usr/bin/env node
/**
 * The conformance worker: the standard handlers (`echo`, `fail`,
 * `no_retry`, `retry_after`, `sleep`, `log`) on a worker configured from
 * the command line. Logs go to stderr.
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
  return worker;
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
