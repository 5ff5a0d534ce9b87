/**
 * The SDK's own diagnostics (sessions, self-fencing, refused assignments).
 * They never go to stdout: the default logger writes to stderr.
 *
 * @packageDocumentation
 */

/** Structured fields attached to a log record. */
export type LogFields = Record<string, unknown>;

/**
 * Where the SDK's own logs go. Inject your own (pino, winston, …) with
 * `new Worker({ logger })`; every method receives a message and optional
 * structured fields.
 */
export interface Logger {
  /** Detail useful when debugging the SDK. */
  debug(message: string, fields?: LogFields): void;
  /** Normal life-cycle events (session established, draining). */
  info(message: string, fields?: LogFields): void;
  /** Something went wrong but the worker carries on (session lost, stale command). */
  warn(message: string, fields?: LogFields): void;
  /** The worker cannot do what it should (refused session, spool write failed). */
  error(message: string, fields?: LogFields): void;
}

function render(fields?: LogFields): string {
  if (!fields) return "";
  const parts: string[] = [];
  for (const [k, v] of Object.entries(fields)) {
    if (v === undefined) continue;
    const s = typeof v === "string" ? v : typeof v === "bigint" ? v.toString() : safeJson(v);
    parts.push(`${k}=${/\s/.test(s) ? JSON.stringify(s) : s}`);
  }
  return parts.length ? " " + parts.join(" ") : "";
}

function safeJson(v: unknown): string {
  try {
    return JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? x.toString() : x)) ?? String(v);
  } catch {
    return String(v);
  }
}

/**
 * The default logger: one line per record on stderr (`console.error`),
 * prefixed with `gnomon-worker` and the level. `debug` records are shown
 * only when `verbose` is true.
 */
export function consoleLogger(verbose = false): Logger {
  const line = (level: string) => (message: string, fields?: LogFields) =>
    console.error(`gnomon-worker ${level}: ${message}${render(fields)}`);
  return {
    debug: verbose ? line("DEBUG") : () => {},
    info: line("INFO"),
    warn: line("WARN"),
    error: line("ERROR"),
  };
}

/** A logger that discards everything. */
export const silentLogger: Logger = {
  debug: () => {},
  info: () => {},
  warn: () => {},
  error: () => {},
};
