/**
 * gnomon-worker: run gnomon `handler` jobs in Node.js.
 *
 * @example
 * ```ts
 * import { Worker, NonRetryable, RetryAfter } from "gnomon-worker";
 * const worker = new Worker({ servers: ["127.0.0.1:7400"], workerId: "resizer-1", capacity: 8 });
 * worker.handler("resize", async (ctx) => { ctx.log.info(`resizing ${ctx.params.image}`); return "done"; });
 * await worker.run();
 * ```
 *
 * @packageDocumentation
 */
export { Worker, type RunOptions } from "./worker";
export { NonRetryable, RetryAfter } from "./errors";
export { Fence } from "./fence";
export {
  guard,
  runStep,
  beginAttempt,
  createTables,
  createFenceTable,
  fenceFromHeaders,
  fenceFromEnv,
  Step,
  Superseded,
  FenceRejected,
  NotInTransaction,
  LockTimeout,
  DEFAULT_PREFIX,
  DEFAULT_STEP,
  DEFAULT_FENCE_TABLE,
  DEFAULT_LOCK_WAIT_MS,
  DEFAULT_IDLE_MS,
  type Dialect,
  type GuardOptions,
  type QueryClient,
} from "./guard";
export type { Context, AttemptLogger, Handler } from "./context";
export { MAX_CAPACITY, MAX_PREFETCH, type WorkerOptions, type TlsOptions } from "./options";
export { consoleLogger, silentLogger, type Logger, type LogFields } from "./logger";
export { MAX_OUTPUT_BYTES } from "./tail";
export { PROTOCOL_VERSION } from "./proto";
