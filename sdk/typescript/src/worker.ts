/**
 * The public {@link Worker}: register handlers, then run.
 *
 * @packageDocumentation
 */
import type { Handler } from "./context";
import { resolveOptions, type ResolvedOptions, type WorkerOptions } from "./options";
import { Runtime } from "./runtime";
import { runLoop } from "./session";

/** Options of {@link Worker.run}. */
export interface RunOptions {
  /**
   * Install SIGTERM and SIGINT handlers that start a drain (a second signal
   * stops what is still running at once). Default `true`.
   */
  handleSignals?: boolean;
}

const HANDLER_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;

/**
 * A gnomon worker that runs `handler` jobs with the handlers registered on
 * it. It holds one session with the leader at a time, reconnecting and
 * following redirects; every report is kept until the leader acknowledges
 * it (on disk with `spoolDir`), and it stops its attempts itself when it can
 * no longer be sure it still holds them (self-fencing).
 *
 * @example
 * ```ts
 * const worker = new Worker({ servers: ["127.0.0.1:7400"], workerId: "resizer-1", capacity: 8 });
 * worker.handler("resize", async (ctx) => { ctx.log.info(`resizing ${ctx.params.image}`); return "done"; });
 * await worker.run(); // resolves after a drain (SIGTERM/SIGINT or worker.stop())
 * ```
 */
export class Worker {
  /** The settings in force, defaults filled in. */
  readonly options: Readonly<ResolvedOptions>;
  private readonly handlers = new Map<string, Handler>();
  private runtime: Runtime | null = null;
  private running = false;
  private stopRequested = false;

  /**
   * Validates the options (throws with a clear message when one is wrong)
   * and, with `spoolDir` and no `workerId`, reads or creates the stored id.
   */
  constructor(options: WorkerOptions) {
    this.options = Object.freeze(resolveOptions(options));
  }

  /** This worker's id, as announced in its Hello. */
  get workerId(): string {
    return this.options.workerId;
  }

  /** The names of the registered handlers, sorted. */
  get handlerNames(): string[] {
    return [...this.handlers.keys()].sort();
  }

  /**
   * Registers the handler of the jobs whose executor is
   * `{"handler": {"name": name, ...}}`. `fn` may be sync or async; its return
   * value is the attempt's output (a string as is, other values as JSON) and
   * a throw fails the attempt (see {@link NonRetryable} and
   * {@link RetryAfter}). Register every handler before {@link run}.
   */
  handler(name: string, fn: Handler): this {
    if (this.running) throw new Error("gnomon-worker: register handlers before run()");
    if (typeof name !== "string" || !HANDLER_NAME.test(name)) {
      throw new Error(`gnomon-worker: handler name ${JSON.stringify(name)}: 1 to 128 letters, digits, '_', '.' or '-', starting with a letter or digit`);
    }
    if (typeof fn !== "function") throw new Error(`gnomon-worker: handler ${name}: not a function`);
    if (this.handlers.has(name)) throw new Error(`gnomon-worker: handler ${name} is already registered`);
    this.handlers.set(name, fn);
    return this;
  }

  /**
   * Runs the worker until a drain ends: connects, takes assignments, runs
   * them, reports. Resolves once {@link stop} (or SIGTERM/SIGINT) was
   * called, the running attempts finished (or, after `drainTimeoutMs`, were
   * stopped and reported lost) and the reports were acknowledged (waiting at
   * most 5 s more).
   */
  async run(options: RunOptions = {}): Promise<void> {
    if (this.running) throw new Error("gnomon-worker: run() is already running");
    if (this.handlers.size === 0) throw new Error("gnomon-worker: register at least one handler before run()");
    this.running = true;
    const rt = new Runtime(this.options, new Map(this.handlers));
    this.runtime = rt;
    const removeSignals = options.handleSignals === false ? () => {} : this.installSignals(rt);
    try {
      const loaded = await rt.spool.load();
      if (loaded > 0) rt.log.info("re-sending spooled reports", { reports: loaded });
      if (this.stopRequested) rt.requestStop();
      rt.startTimers();
      await runLoop(rt);
    } finally {
      rt.stopTimers();
      removeSignals();
      await rt.spool.settle();
      this.runtime = null;
      this.running = false;
      this.stopRequested = false;
    }
  }

  /**
   * Starts a drain: heartbeats say draining so the leader assigns nothing
   * more; running attempts get `drainTimeoutMs` to finish; then {@link run}
   * resolves. Calling it again shortens nothing. Before `run()`, the next
   * `run()` drains at once.
   */
  stop(): void {
    this.stopRequested = true;
    this.runtime?.requestStop();
  }

  /** Attempts held now (executing or queued); 0 when not running. */
  get held(): number {
    return this.runtime?.running() ?? 0;
  }

  /** Reports persisted and not yet acknowledged by the leader; 0 when not running. */
  get unacked(): number {
    return this.runtime?.unacked() ?? 0;
  }

  private installSignals(rt: Runtime): () => void {
    let seen = 0;
    const onSignal = (sig: NodeJS.Signals) => {
      seen++;
      if (seen === 1) {
        rt.log.info(`${sig}: draining`, { timeoutMs: this.options.drainTimeoutMs });
        this.stop();
      } else {
        rt.log.warn(`${sig} again: stopping running attempts now`);
        rt.requestStop(rt.now());
      }
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
    return () => {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
    };
  }
}
