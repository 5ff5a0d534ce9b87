// Shared test helpers: a capturing logger, a worker wired to a peer, gates.
import { Worker } from "../src/worker";
import type { Logger, LogFields } from "../src/logger";
import type { WorkerOptions } from "../src/options";
import type { Peer } from "./peer";

export interface Record_ {
  level: "debug" | "info" | "warn" | "error";
  message: string;
  fields?: LogFields;
}

/** A logger that keeps what it is given (and prints it when GNOMON_TEST_LOG is set). */
export function capture(): Logger & { records: Record_[]; has(level: Record_["level"], text: string): boolean } {
  const records: Record_[] = [];
  const at =
    (level: Record_["level"]) =>
    (message: string, fields?: LogFields): void => {
      records.push({ level, message, ...(fields ? { fields } : {}) });
      if (process.env["GNOMON_TEST_LOG"]) console.error(level, message, fields ?? "");
    };
  return {
    records,
    debug: at("debug"),
    info: at("info"),
    warn: at("warn"),
    error: at("error"),
    has(level, text) {
      return records.some((r) => r.level === level && (r.message.includes(text) || JSON.stringify(r.fields ?? {}).includes(text)));
    },
  };
}

/** A worker for `peer` (silent, no signal handlers), running until `stop()`. */
export function startWorker(
  peer: Peer | string[],
  opts: Partial<WorkerOptions>,
  register: (w: Worker) => void,
): { worker: Worker; done: Promise<void>; log: ReturnType<typeof capture>; stop(): Promise<void> } {
  const log = capture();
  const servers = Array.isArray(peer) ? peer : [peer.address];
  const worker = new Worker({ servers, workerId: "w-test", logger: log, drainTimeoutMs: 2000, ...opts });
  register(worker);
  const done = worker.run({ handleSignals: false });
  return {
    worker,
    done,
    log,
    async stop() {
      worker.stop();
      await done;
    },
  };
}

/** A latch handlers wait on: `open()` lets every waiter (and later caller) through. */
export class Gate {
  private waiters: Array<() => void> = [];
  private opened = false;
  wait(signal?: AbortSignal): Promise<void> {
    if (this.opened) return Promise.resolve();
    return new Promise((resolve) => {
      this.waiters.push(resolve);
      signal?.addEventListener("abort", () => resolve(), { once: true });
    });
  }
  open(): void {
    this.opened = true;
    for (const w of this.waiters.splice(0)) w();
  }
}

/** Resolves when `signal` aborts. */
export function aborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    signal.addEventListener("abort", () => resolve(), { once: true });
  });
}
