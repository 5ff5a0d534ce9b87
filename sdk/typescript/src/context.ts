/**
 * What a handler receives: the attempt it runs, its inputs, its fence, a
 * cancellation signal and a logger whose lines become the attempt's output.
 *
 * @packageDocumentation
 */
import { format } from "node:util";
import { Fence } from "./fence";

/**
 * A logger whose lines become the attempt's output (the Report's tail and
 * the live stream). Each line is `"<LEVEL> <message>"`; arguments after the
 * message are formatted as `console.log` does (`%s`, `%d`, `%j`, …).
 * Logging only appends to memory: it never blocks.
 */
export interface AttemptLogger {
  /** A `DEBUG` line. */
  debug(message: string, ...args: unknown[]): void;
  /** An `INFO` line. */
  info(message: string, ...args: unknown[]): void;
  /** A `WARNING` line. */
  warn(message: string, ...args: unknown[]): void;
  /** An `ERROR` line. */
  error(message: string, ...args: unknown[]): void;
}

/** The context a handler is called with. */
export interface Context {
  /** The run this attempt belongs to. */
  readonly runId: string;
  /** The attempt number: 1, 2, … */
  readonly attempt: number;
  /** The job's name. */
  readonly job: string;
  /** The job's namespace. */
  readonly namespace: string;
  /** The id of the worker running the attempt. */
  readonly workerId: string;
  /** When the run was scheduled. */
  readonly scheduledAt: Date;
  /** When the run was scheduled, in milliseconds since the Unix epoch. */
  readonly scheduledAtMs: number;
  /** The values of the run's params; `{}` when its job declares none. */
  readonly params: Record<string, unknown>;
  /** The job's handler payload (`executor.handler.payload`); `null` if absent. */
  readonly payload: unknown;
  /** The body of the webhook call that started the run; `null` for other runs. */
  readonly runPayload: string | null;
  /** Reserved for sharded jobs: always `null` for now. */
  readonly shard: null;
  /** The attempt's fencing token. */
  readonly token: bigint;
  /**
   * Aborted when the attempt must stop: a Cancel, an Abort (superseded), its
   * timeout, self-fencing or a drain that ran out of time. A handler should
   * stop promptly: the attempt ends only when the handler returns or throws.
   */
  readonly signal: AbortSignal;
  /** The attempt's logger. */
  readonly log: AttemptLogger;
  /** `Fence(runId, attempt, token)`: what fenced writes take. */
  readonly fence: Fence;
  /** Stable across the attempts of a run: key side effects on it. */
  readonly idempotencyKey: string;
}

/** A handler: called once per attempt; its return value (or thrown error) decides the outcome. */
export type Handler = (ctx: Context) => unknown;

/** What {@link makeContext} needs. */
export interface ContextInit {
  runId: string;
  attempt: number;
  job: string;
  namespace: string;
  workerId: string;
  scheduledAtMs: number;
  params: Record<string, unknown>;
  payload: unknown;
  runPayload: string | null;
  token: bigint;
  signal: AbortSignal;
  idempotencyKey: string;
  /** Receives each output line, newline included, while the attempt is open. */
  write: (line: string) => void;
}

/** A context and the switch that closes its logger once the attempt has ended. */
export interface OpenContext {
  ctx: Context;
  close(): void;
}

/** Builds a handler's context. Lines logged after `close()` are discarded. */
export function makeContext(init: ContextInit): OpenContext {
  let open = true;
  const line =
    (level: string) =>
    (message: string, ...args: unknown[]): void => {
      if (!open) return;
      const text = args.length ? format(message, ...args) : String(message);
      init.write(`${level} ${text}\n`);
    };
  const log: AttemptLogger = Object.freeze({
    debug: line("DEBUG"),
    info: line("INFO"),
    warn: line("WARNING"),
    error: line("ERROR"),
  });
  const ctx: Context = Object.freeze({
    runId: init.runId,
    attempt: init.attempt,
    job: init.job,
    namespace: init.namespace,
    workerId: init.workerId,
    scheduledAt: new Date(init.scheduledAtMs),
    scheduledAtMs: init.scheduledAtMs,
    params: init.params,
    payload: init.payload,
    runPayload: init.runPayload,
    shard: null,
    token: init.token,
    signal: init.signal,
    log,
    fence: new Fence(init.runId, init.attempt, init.token),
    idempotencyKey: init.idempotencyKey,
  });
  return {
    ctx,
    close: () => {
      open = false;
    },
  };
}
