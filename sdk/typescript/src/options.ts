/**
 * A worker's settings, validated when the {@link Worker} is built.
 *
 * @packageDocumentation
 */
import * as crypto from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { consoleLogger, type Logger } from "./logger";

/** The most attempts a worker of this SDK runs at once. */
export const MAX_CAPACITY = 4096;
/** The most assignments a worker accepts queued beyond its capacity. */
export const MAX_PREFETCH = 65536;

/** TLS to the servers. Files are read at every connect, so renewed certificates are picked up. */
export interface TlsOptions {
  /** PEM file of the roots to trust; absent: the system's roots. */
  ca?: string;
  /** PEM file of the client certificate, for servers that require mutual TLS (with `key`). */
  cert?: string;
  /** PEM file of the client certificate's private key (with `cert`). */
  key?: string;
}

/** What `new Worker(options)` takes. Only `servers` is required. */
export interface WorkerOptions {
  /** Server addresses, `host:port`, tried in turn: an array or a comma-separated string. */
  servers: string[] | string;
  /**
   * This worker's id, stable across restarts. Default: generated once and
   * kept in `<spoolDir>/worker-id` when `spoolDir` is set, else
   * `ts-<hostname>-<pid>`.
   */
  workerId?: string;
  /** Handlers executing at once, 1..4096. Default 16. */
  capacity?: number;
  /** Assignments accepted beyond `capacity`, queued in order, 0..65536. Default 0. */
  prefetch?: number;
  /** Labels the leader matches jobs' worker selectors against. */
  labels?: Record<string, string>;
  /** Bearer token sent as `authorization: Bearer <token>`. */
  token?: string;
  /** TLS to the servers; absent: plain HTTP/2. */
  tls?: TlsOptions;
  /** Where unacked reports (and the generated worker id) are kept; absent: memory only. */
  spoolDir?: string;
  /** How long a drain lets running attempts finish before stopping them, ms. Default 30000. */
  drainTimeoutMs?: number;
  /**
   * Fraction of the lease TTL after which unacknowledged heartbeats make the
   * worker stop every attempt it holds, in (0, 1). Default 0.7.
   */
  selfFenceFraction?: number;
  /** Where the SDK's own logs go. Default: stderr, prefixed `gnomon-worker`. */
  logger?: Logger;
}

/** {@link WorkerOptions} with every default filled in. */
export interface ResolvedOptions {
  servers: string[];
  workerId: string;
  capacity: number;
  prefetch: number;
  labels: Record<string, string>;
  token: string | undefined;
  tls: TlsOptions | undefined;
  spoolDir: string | undefined;
  drainTimeoutMs: number;
  selfFenceFraction: number;
  logger: Logger;
}

function fail(message: string): never {
  throw new Error(`gnomon-worker: ${message}`);
}

function integer(name: string, value: unknown, min: number, max: number, dflt: number): number {
  if (value === undefined) return dflt;
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    fail(`${name} must be an integer in ${min}..${max}, got ${String(value)}`);
  }
  return value;
}

/** Splits and checks the server list. */
export function parseServers(servers: unknown): string[] {
  const list = typeof servers === "string" ? servers.split(",") : Array.isArray(servers) ? servers : fail("servers must be a list of host:port or a comma-separated string");
  const out = list.map((s) => (typeof s === "string" ? s.trim() : fail(`servers: not a string: ${String(s)}`))).filter((s) => s.length > 0);
  if (out.length === 0) fail("servers must name at least one host:port");
  for (const s of out) {
    if (/^[a-z]+:\/\//i.test(s) || !/:\d+$/.test(s)) fail(`servers: ${JSON.stringify(s)} is not host:port`);
  }
  return out;
}

/** The worker id kept in `<spoolDir>/worker-id`, generated on first use. */
export function persistentWorkerId(spoolDir: string): string {
  const file = path.join(spoolDir, "worker-id");
  try {
    const id = fs.readFileSync(file, "utf8").trim();
    if (id) return id;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
  }
  const id = `ts-${os.hostname()}-${crypto.randomBytes(4).toString("hex")}`;
  fs.mkdirSync(spoolDir, { recursive: true });
  const tmp = `${file}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, id + "\n");
  fs.renameSync(tmp, file);
  return id;
}

/** Validates `options` and fills in the defaults. Throws with a clear message. */
export function resolveOptions(options: WorkerOptions): ResolvedOptions {
  if (typeof options !== "object" || options === null) fail("new Worker(options): options must be an object");
  const servers = parseServers(options.servers);
  const capacity = integer("capacity", options.capacity, 1, MAX_CAPACITY, 16);
  const prefetch = integer("prefetch", options.prefetch, 0, MAX_PREFETCH, 0);
  const drainTimeoutMs = integer("drainTimeoutMs", options.drainTimeoutMs, 0, 2 ** 31 - 1, 30000);
  const fraction = options.selfFenceFraction ?? 0.7;
  if (typeof fraction !== "number" || !(fraction > 0 && fraction < 1)) {
    fail(`selfFenceFraction must be in (0, 1), got ${String(fraction)}`);
  }
  const labels: Record<string, string> = {};
  for (const [k, v] of Object.entries(options.labels ?? {})) {
    if (typeof v !== "string") fail(`labels.${k} must be a string`);
    labels[k] = v;
  }
  if (options.token !== undefined && (typeof options.token !== "string" || options.token === "" || /[\r\n]/.test(options.token))) {
    fail("token must be a non-empty string without newlines");
  }
  const tls = options.tls;
  if (tls !== undefined) {
    if (Boolean(tls.cert) !== Boolean(tls.key)) fail("tls.cert and tls.key go together");
  }
  const spoolDir = options.spoolDir ? path.resolve(options.spoolDir) : undefined;
  let workerId = options.workerId;
  if (workerId !== undefined) {
    if (typeof workerId !== "string" || workerId.trim() === "") fail("workerId must be a non-empty string");
  } else {
    workerId = spoolDir ? persistentWorkerId(spoolDir) : `ts-${os.hostname()}-${process.pid}`;
  }
  return {
    servers,
    workerId,
    capacity,
    prefetch,
    labels,
    token: options.token,
    tls,
    spoolDir,
    drainTimeoutMs,
    selfFenceFraction: fraction,
    logger: options.logger ?? consoleLogger(),
  };
}
