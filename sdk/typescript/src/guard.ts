/**
 * Exactly-once steps: database writes of a job that commit once per run,
 * whichever of its attempts gets there first, with the result recorded.
 *
 * gnomon runs each attempt at least once. A worker frozen past its lease
 * may wake after its run was retried elsewhere, and a handler that ignores
 * its `signal` keeps going. A *step* closes that gap in the job's own
 * database: {@link guard}, called first in the transaction of the step's
 * writes, looks up the step's record in a table (`gnomon_steps`, one row
 * per run and step) under a lock on the run's row in `gnomon_fence`:
 *
 * - recorded already (by this attempt or any other, older or newer): the
 *   returned {@link Step} is `recorded`, with the recorded `result` — write
 *   nothing and use that result;
 * - not recorded, and a newer attempt of the run has started (raised the
 *   run's marker, see {@link beginAttempt}): {@link Superseded};
 * - otherwise the step is this attempt's: the guard inserts the record,
 *   the caller writes, {@link Step.record} stores the result, and the
 *   commit makes both visible together. A racing attempt waits for the
 *   lock, then finds the record.
 *
 * @example
 * ```ts
 * const client = await pool.connect();             // pg (mysql2/promise connections work too)
 * try {
 *   const receipt = await runStep(client, ctx.fence, "payment", async (c) => {
 *     await c.query("INSERT INTO payments (run_id, amount) VALUES ($1, 10)", [ctx.runId]);
 *     return { amount: 10 };
 *   });
 * } finally { client.release(); }
 * ```
 *
 * The guard bounds, for its transaction, how long a statement waits for a
 * lock (`lockWaitMs`; {@link LockTimeout} then, which retries the attempt)
 * and how long the transaction may sit idle (`idleMs`): a frozen attempt
 * holding the step's lock is cut off by the database, its transaction
 * rolls back, and the retry proceeds while the frozen worker is still
 * stopped.
 *
 * What it cannot cover: effects outside the database transaction (an
 * email, an HTTP call, a write to another database) happen as often as the
 * code that makes them runs.
 *
 * @packageDocumentation
 */
import { RetryAfter } from "./errors";
import { Fence } from "./fence";

/** The tables' prefix unless told otherwise: `gnomon_fence` and `gnomon_steps`. */
export const DEFAULT_PREFIX = "gnomon";
/** The step of a run that has one. */
export const DEFAULT_STEP = "run";
/** The fence table's name before steps (kept: its rows stay valid). */
export const DEFAULT_FENCE_TABLE = "gnomon_fence";
/** How long a guarded statement waits for a lock, in milliseconds. */
export const DEFAULT_LOCK_WAIT_MS = 5_000;
/** How long a guarded transaction may sit idle before the database ends it, in milliseconds. */
export const DEFAULT_IDLE_MS = 10_000;

/** The largest result a MySQL/MariaDB TEXT column holds, in bytes. */
const MYSQL_TEXT = 65_535;

/** Which database a client talks to. */
export type Dialect = "postgres" | "mysql";

/**
 * A database client: a `pg` `Client`/`PoolClient` (`query(text, values)`
 * resolving to `{ rows }`) or a `mysql2/promise` connection
 * (`query(sql, values)` resolving to `[rows, fields]`). Not a pool: a
 * transaction lives on one connection.
 */
export interface QueryClient {
  query(sql: string, values?: unknown[]): Promise<unknown>;
}

/** Options of {@link guard}, {@link runStep}, {@link beginAttempt} and {@link createTables}. */
export interface GuardOptions {
  /** The client's database; told from the client when absent. */
  dialect?: Dialect;
  /** The tables' prefix (a plain SQL name): `<prefix>_fence`, `<prefix>_steps`; `gnomon` by default. */
  prefix?: string;
  /** The earlier form of `prefix`: the fence table, `<prefix>_fence`. */
  table?: string;
  /** How long a statement of the transaction waits for a lock (5000 ms); {@link LockTimeout} then. */
  lockWaitMs?: number;
  /** How long the transaction may sit idle before the database ends it (10000 ms). */
  idleMs?: number;
}

/**
 * A newer attempt of the run has started, and the step has no record: this
 * attempt may not commit it. Roll back.
 */
export class Superseded extends Error {
  /** The attempt that was refused. */
  readonly fence: Fence;
  /** The newest attempt started. */
  readonly seenAttempt: number;
  /** Its token. */
  readonly seenToken: bigint;
  /** The step asked for ("" from {@link beginAttempt}). */
  readonly step: string;

  constructor(fence: Fence, seenAttempt: number, seenToken: bigint, step: string = DEFAULT_STEP) {
    super(
      `attempt ${fence.attempt} (token ${fence.token}) of run ${fence.runId} is superseded: ` +
        `attempt ${seenAttempt} (token ${seenToken}) has started, and step ${JSON.stringify(step)} has no record`,
    );
    this.name = "Superseded";
    this.fence = fence;
    this.seenAttempt = seenAttempt;
    this.seenToken = seenToken;
    this.step = step;
  }
}

/** The name {@link Superseded} had before steps. */
export { Superseded as FenceRejected };

/**
 * The guard was called outside a transaction: its check and the caller's
 * writes would not commit together. Send `BEGIN` first, or use
 * {@link runStep}.
 */
export class NotInTransaction extends Error {
  constructor(message: string) {
    super(message);
    this.name = "NotInTransaction";
  }
}

/**
 * A guarded statement waited longer than `lockWaitMs` for a lock
 * (PostgreSQL SQLSTATE 55P03, MySQL/MariaDB error 1205): another attempt
 * holds the step. Retryable: a {@link RetryAfter} of 0 s — let it fail the
 * attempt, and the run is retried per the job's retry policy (its backoff
 * kept).
 */
export class LockTimeout extends RetryAfter {
  constructor(message: string, options?: { cause?: unknown }) {
    super(0, message);
    this.name = "LockTimeout";
    if (options && "cause" in options) Object.defineProperty(this, "cause", { value: options.cause, enumerable: false });
  }
}

const OUTSIDE =
  "the guard needs the transaction of the step's writes, and this client has none (autocommit): " +
  'send "BEGIN" first, or use runStep';

/** The SQL of one dialect and prefix. */
class Sql {
  readonly pg: boolean;
  readonly fence: string;
  readonly steps: string;

  constructor(
    readonly dialect: Dialect,
    prefix: string,
  ) {
    this.pg = dialect === "postgres";
    [this.fence, this.steps] = tables(prefix);
  }

  /** `$n` or `?`. */
  p(n: number): string {
    return this.pg ? `$${n}` : "?";
  }

  get create(): string[] {
    const { fence, steps } = this;
    return this.pg
      ? [
          `CREATE TABLE IF NOT EXISTS ${fence} (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL, token BIGINT NOT NULL, ` +
            "written_at TIMESTAMPTZ NOT NULL DEFAULT now())",
          `CREATE TABLE IF NOT EXISTS ${steps} (run_id TEXT NOT NULL, step TEXT NOT NULL, attempt BIGINT NOT NULL, ` +
            "token BIGINT NOT NULL, result TEXT, committed_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (run_id, step))",
        ]
      : [
          `CREATE TABLE IF NOT EXISTS ${fence} (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY, ` +
            "attempt BIGINT NOT NULL, token BIGINT NOT NULL, written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB",
          `CREATE TABLE IF NOT EXISTS ${steps} (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL, ` +
            "step VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, attempt BIGINT NOT NULL, " +
            "token BIGINT NOT NULL, result TEXT, committed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), " +
            "PRIMARY KEY (run_id, step)) ENGINE=InnoDB",
        ];
  }

  get mark(): string {
    return this.pg
      ? `INSERT INTO ${this.fence} (run_id, attempt, token) VALUES ($1, $2, $3) ON CONFLICT (run_id) DO NOTHING`
      : `INSERT IGNORE INTO ${this.fence} (run_id, attempt, token) VALUES (?, ?, ?)`;
  }

  get lock(): string {
    // Tokens are read as text: a uint64 is more than a JS number holds.
    return `SELECT attempt, ${this.text("token")} AS token FROM ${this.fence} WHERE run_id = ${this.p(1)} FOR UPDATE`;
  }

  get read(): string {
    return (
      `SELECT attempt, ${this.text("token")} AS token, result FROM ${this.steps} ` +
      `WHERE run_id = ${this.p(1)} AND step = ${this.p(2)} FOR UPDATE`
    );
  }

  get raise(): string {
    const now = this.pg ? "now()" : "CURRENT_TIMESTAMP(3)";
    return `UPDATE ${this.fence} SET attempt = ${this.p(1)}, token = ${this.p(2)}, written_at = ${now} WHERE run_id = ${this.p(3)}`;
  }

  get insert(): string {
    return `INSERT INTO ${this.steps} (run_id, step, attempt, token) VALUES (${this.p(1)}, ${this.p(2)}, ${this.p(3)}, ${this.p(4)})`;
  }

  get record(): string {
    return `UPDATE ${this.steps} SET result = ${this.p(1)} WHERE run_id = ${this.p(2)} AND step = ${this.p(3)}`;
  }

  private text(column: string): string {
    return this.pg ? `${column}::text` : `CAST(${column} AS CHAR)`;
  }
}

function tables(prefix: string): [string, string] {
  if (typeof prefix !== "string" || !/^[A-Za-z_][A-Za-z0-9_]{0,56}$/.test(prefix)) {
    throw new TypeError(`the table prefix ${JSON.stringify(prefix)} is not a plain SQL name (letters, digits, _; at most 57)`);
  }
  return [`${prefix}_fence`, `${prefix}_steps`];
}

function prefixOf(options: GuardOptions): string {
  if (options.table === undefined) return options.prefix ?? DEFAULT_PREFIX;
  const t = options.table;
  if (typeof t !== "string" || !t.endsWith("_fence")) {
    throw new TypeError(`the fence table ${JSON.stringify(t)} is not <prefix>_fence: pass { prefix } instead`);
  }
  return t.slice(0, -"_fence".length);
}

function dialectOf(client: QueryClient, dialect?: Dialect): Dialect {
  if (dialect !== undefined) {
    if (dialect !== "postgres" && dialect !== "mysql") throw new TypeError(`dialect must be "postgres" or "mysql", not ${String(dialect)}`);
    return dialect;
  }
  const c = client as unknown as Record<string, unknown>;
  if (typeof c["connect"] === "function" && "totalCount" in c) {
    throw new TypeError("a pool runs each query on any of its connections: pass a client of pool.connect()");
  }
  if ("connectionParameters" in c) return "postgres";
  if ("config" in c && typeof c["execute"] === "function") return "mysql";
  throw new TypeError('cannot tell the database of this client: pass { dialect: "postgres" } or { dialect: "mysql" }');
}

function stepName(step: string): string {
  if (typeof step !== "string" || step.length === 0 || step.length > 255) {
    throw new TypeError(`a step is a name of 1 to 255 characters, not ${JSON.stringify(step)}`);
  }
  return step;
}

function ms(what: string, value: number | undefined, dflt: number): number {
  const v = value ?? dflt;
  if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) throw new TypeError(`${what} must be a positive number of milliseconds, not ${String(v)}`);
  return v;
}

/** The rows of a query's result, for either driver. */
function rowsOf(result: unknown): Array<Record<string, unknown>> {
  if (Array.isArray(result)) return result[0] as Array<Record<string, unknown>>;
  return (result as { rows: Array<Record<string, unknown>> }).rows;
}

function codeOf(e: unknown): { code?: string; errno?: number } {
  if (typeof e !== "object" || e === null) return {};
  const r = e as Record<string, unknown>;
  return { code: typeof r["code"] === "string" ? r["code"] : undefined, errno: typeof r["errno"] === "number" ? r["errno"] : undefined };
}

function isLockTimeout(e: unknown): boolean {
  const { code, errno } = codeOf(e);
  return code === "55P03" || errno === 1205;
}

/** A lock wait of the driver as {@link LockTimeout}; anything else as it is. */
function mapped(e: unknown): unknown {
  if (e instanceof LockTimeout || !isLockTimeout(e)) return e;
  const m = e instanceof Error ? e.message : String(e);
  return new LockTimeout(`waited too long for a lock held by another transaction (another attempt holds the step): ${m}`, { cause: e });
}

async function q(client: QueryClient, sql: string, values?: unknown[]): Promise<Array<Record<string, unknown>>> {
  try {
    return rowsOf(await client.query(sql, values));
  } catch (e) {
    throw mapped(e);
  }
}

function newer(attempt: number, token: bigint, fence: Fence): boolean {
  return attempt > fence.attempt || (attempt === fence.attempt && token > fence.token);
}

/**
 * Whether the client is in a transaction: PostgreSQL by a savepoint,
 * MySQL/MariaDB by the server's status flags. With `orAutocommitOff`, a
 * MySQL/MariaDB session with autocommit off counts too (its next statement
 * begins one).
 */
async function inTransaction(client: QueryClient, sql: Sql, orAutocommitOff: boolean): Promise<boolean> {
  if (sql.pg) {
    try {
      await client.query("SAVEPOINT gnomon_guard_check; RELEASE SAVEPOINT gnomon_guard_check");
      return true;
    } catch (e) {
      if (codeOf(e).code === "25P01") return false;
      throw e;
    }
  }
  // An OK packet carries the status: 1 in a transaction, 2 autocommit. With
  // autocommit off, the next statement begins one.
  const [header] = (await client.query("DO 0")) as [{ serverStatus?: number }];
  const status = header?.serverStatus;
  if (typeof status !== "number") {
    const rows = await q(client, "SELECT @@autocommit AS a, @@in_transaction AS t");
    return (orAutocommitOff && Number(rows[0]?.["a"]) === 0) || Number(rows[0]?.["t"]) === 1;
  }
  return (status & 1) !== 0 || (orAutocommitOff && (status & 2) === 0);
}

async function bound(client: QueryClient, sql: Sql, lockWaitMs: number, idleMs?: number): Promise<void> {
  if (sql.pg) {
    if (idleMs === undefined) {
      await q(client, "SELECT set_config('lock_timeout', $1, true)", [`${Math.ceil(lockWaitMs)}ms`]);
    } else {
      await q(client, "SELECT set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $2, true)", [
        `${Math.ceil(lockWaitMs)}ms`,
        `${Math.ceil(idleMs)}ms`,
      ]);
    }
    return;
  }
  const lw = Math.max(1, Math.ceil(lockWaitMs / 1000));
  if (idleMs === undefined) {
    await q(client, `SET SESSION innodb_lock_wait_timeout = ${lw}`);
    return;
  }
  const it = Math.max(1, Math.ceil(idleMs / 1000));
  try {
    // MariaDB: the transaction's idle time; MySQL has no such variable.
    await q(client, `SET SESSION innodb_lock_wait_timeout = ${lw}, idle_transaction_timeout = ${it}`);
  } catch (e) {
    if (codeOf(e).errno !== 1193) throw e;
    await q(client, `SET SESSION innodb_lock_wait_timeout = ${lw}, wait_timeout = ${it}`);
  }
}

/** Puts back the session settings the guard changed (MySQL/MariaDB; PostgreSQL's end with the transaction). */
async function restore(client: QueryClient, sql: Sql): Promise<void> {
  if (sql.pg) return;
  try {
    await client.query("SET SESSION innodb_lock_wait_timeout = DEFAULT, idle_transaction_timeout = DEFAULT");
  } catch (e) {
    if (codeOf(e).errno !== 1193) throw e;
    await client.query("SET SESSION innodb_lock_wait_timeout = DEFAULT, wait_timeout = DEFAULT");
  }
}

/** Locks the run's marker row (made when missing): the newest attempt started, as (attempt, token). */
async function lockRun(client: QueryClient, sql: Sql, fence: Fence): Promise<[number, bigint]> {
  await q(client, sql.mark, [fence.runId, fence.attempt, fence.token.toString()]);
  const rows = await q(client, sql.lock, [fence.runId]);
  return rows.length ? [Number(rows[0]!["attempt"]), BigInt(String(rows[0]!["token"]))] : [0, 0n];
}

/** The outcome of {@link guard} for one step of one run. */
export class Step {
  /** The attempt asking. */
  readonly fence: Fence;
  /** The step's name. */
  readonly name: string;
  /** Whether the step was recorded before: write nothing, use {@link Step.result}. */
  readonly recorded: boolean;
  /** The attempt that recorded the step (this one's when fresh). */
  readonly attempt: number;
  /** The token of that attempt. */
  readonly token: bigint;
  /** The recorded result (decoded JSON; `null` when none was recorded), or what {@link Step.record} stored. */
  result: unknown;
  readonly #store: (text: string) => Promise<void>;
  readonly #dialect: Dialect;

  /** @internal Made by {@link guard}. */
  constructor(
    store: (text: string) => Promise<void>,
    dialect: Dialect,
    fence: Fence,
    name: string,
    recorded: boolean,
    result: unknown,
    attempt: number,
    token: bigint,
  ) {
    this.#store = store;
    this.#dialect = dialect;
    this.fence = fence;
    this.name = name;
    this.recorded = recorded;
    this.result = result;
    this.attempt = attempt;
    this.token = token;
  }

  /** Whether the step is this attempt's to do (and {@link Step.record}). */
  get fresh(): boolean {
    return !this.recorded;
  }

  /**
   * Stores `result` (JSON-encoded; `undefined` as `null`) as the step's
   * result, in the guard's transaction: it commits with the caller's
   * writes. TypeError for a value JSON cannot encode (a bigint, a cycle, a
   * function); Error on a step recorded before this attempt.
   */
  async record(result: unknown): Promise<void> {
    if (this.recorded) {
      throw new Error(`step ${JSON.stringify(this.name)} of run ${this.fence.runId} was recorded by attempt ${this.attempt}: use its result`);
    }
    const text = encode(this.name, result, this.#dialect);
    await this.#store(text);
    this.result = JSON.parse(text);
  }
}

function encode(step: string, result: unknown, dialect: Dialect): string {
  let text: string | undefined;
  try {
    text = result === undefined ? "null" : JSON.stringify(result);
  } catch (e) {
    throw new TypeError(`the result of step ${JSON.stringify(step)} cannot be recorded as JSON: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (text === undefined) throw new TypeError(`the result of step ${JSON.stringify(step)} cannot be recorded as JSON: a ${typeof result}`);
  const bytes = Buffer.byteLength(text);
  if (dialect === "mysql" && bytes > MYSQL_TEXT) {
    throw new RangeError(`the result of step ${JSON.stringify(step)} is ${bytes} bytes of JSON; MySQL/MariaDB keep at most ${MYSQL_TEXT}`);
  }
  return text;
}

/** Creates `<prefix>_fence` and `<prefix>_steps` if they are missing (an existing fence table of earlier versions is kept: its rows stay valid markers). */
export async function createTables(client: QueryClient, options: GuardOptions = {}): Promise<void> {
  const sql = new Sql(dialectOf(client, options.dialect), prefixOf(options));
  for (const statement of sql.create) await q(client, statement);
}

/** The earlier name of {@link createTables} (`options.table` is `<prefix>_fence`). */
export const createFenceTable = createTables;

/**
 * Claims or reads step `step` of the fence's run inside the client's
 * transaction (the caller sent `BEGIN` and commits).
 *
 * Resolves to a {@link Step}: `recorded` (write nothing; use its `result`),
 * or fresh (write, {@link Step.record} the result, commit). Rejects with
 * {@link NotInTransaction} outside a transaction, {@link Superseded} when
 * the step has no record and a newer attempt has started,
 * {@link LockTimeout} after `lockWaitMs` waiting for the run's lock. Until
 * the transaction ends it holds the run's lock, statements wait at most
 * `lockWaitMs` for locks, and the database ends the transaction when it
 * sits idle for `idleMs` (on MySQL/MariaDB these stay set on the session;
 * {@link runStep} puts them back).
 *
 * `guard(client, fence, options)` (the earlier form) guards the step `"run"`.
 */
export async function guard(client: QueryClient, fence: Fence, step?: string | GuardOptions, options: GuardOptions = {}): Promise<Step> {
  if (typeof step === "object" && step !== null) [step, options] = [undefined, step];
  const name = stepName(step ?? DEFAULT_STEP);
  const sql = new Sql(dialectOf(client, options.dialect), prefixOf(options));
  const lockWaitMs = ms("lockWaitMs", options.lockWaitMs, DEFAULT_LOCK_WAIT_MS);
  const idleMs = ms("idleMs", options.idleMs, DEFAULT_IDLE_MS);
  if (!(await inTransaction(client, sql, true))) throw new NotInTransaction(OUTSIDE);
  await bound(client, sql, lockWaitMs, idleMs);
  const [seenAttempt, seenToken] = await lockRun(client, sql, fence);
  const rows = await q(client, sql.read, [fence.runId, name]);
  const store = async (text: string) => void (await q(client, sql.record, [text, fence.runId, name]));
  if (rows.length) {
    const r = rows[0]!;
    const result = r["result"] === null || r["result"] === undefined ? null : JSON.parse(String(r["result"]));
    return new Step(store, sql.dialect, fence, name, true, result, Number(r["attempt"]), BigInt(String(r["token"])));
  }
  if (newer(seenAttempt, seenToken, fence)) throw new Superseded(fence, seenAttempt, seenToken, name);
  if (seenAttempt !== fence.attempt || seenToken !== fence.token) {
    await q(client, sql.raise, [fence.attempt, fence.token.toString(), fence.runId]);
  }
  await q(client, sql.insert, [fence.runId, name, fence.attempt, fence.token.toString()]);
  return new Step(store, sql.dialect, fence, name, false, null, fence.attempt, fence.token);
}

/**
 * Sends `BEGIN`, refusing a client already in a transaction. On a `pg`
 * client that is told by the warning PostgreSQL answers a second `BEGIN`
 * with (SQLSTATE 25001), so no statement fails in the database's log.
 */
async function begin(client: QueryClient, sql: Sql, what: string): Promise<void> {
  const refuse = () => new Error(`${what} commits its own transaction: call it outside the client's open transaction`);
  type Emitter = { on(e: string, f: (m: { code?: string }) => void): unknown; removeListener(e: string, f: (m: { code?: string }) => void): unknown };
  const c = client as unknown as Partial<Emitter>;
  if (!sql.pg || typeof c.on !== "function" || typeof c.removeListener !== "function") {
    if (await inTransaction(client, sql, false)) throw refuse();
    await q(client, "BEGIN");
    return;
  }
  let already = false;
  const notice = (m: { code?: string }) => {
    if (m?.code === "25001") already = true;
  };
  c.on("notice", notice);
  try {
    await q(client, "BEGIN");
  } finally {
    c.removeListener("notice", notice);
  }
  if (already) throw refuse();
}

async function ownTransaction<T>(client: QueryClient, sql: Sql, what: string, body: () => Promise<T>): Promise<T> {
  await begin(client, sql, what);
  try {
    const out = await body();
    await q(client, "COMMIT");
    return out;
  } catch (e) {
    await client.query("ROLLBACK").catch(() => undefined);
    throw mapped(e);
  } finally {
    await restore(client, sql).catch(() => undefined);
  }
}

/**
 * Marks the fence's attempt as the newest of its run that has started, in
 * a short transaction of its own (committed here; the client must not be
 * in one). From then on an older attempt may not commit a step that has no
 * record ({@link Superseded}). Rejects with {@link Superseded} when a newer
 * attempt is marked already.
 */
export async function beginAttempt(client: QueryClient, fence: Fence, options: GuardOptions = {}): Promise<void> {
  const sql = new Sql(dialectOf(client, options.dialect), prefixOf(options));
  const lockWaitMs = ms("lockWaitMs", options.lockWaitMs, DEFAULT_LOCK_WAIT_MS);
  await ownTransaction(client, sql, "beginAttempt", async () => {
    await bound(client, sql, lockWaitMs);
    const [seenAttempt, seenToken] = await lockRun(client, sql, fence);
    if (newer(seenAttempt, seenToken, fence)) throw new Superseded(fence, seenAttempt, seenToken, "");
    if (seenAttempt !== fence.attempt || seenToken !== fence.token) {
      await q(client, sql.raise, [fence.attempt, fence.token.toString(), fence.runId]);
    }
  });
}

/**
 * Runs step `step` exactly once per run: begins a transaction on `client`
 * (not already in one), guards it, calls `fn(client)` only when the step
 * has no record, records what it resolves to, commits, and resolves to the
 * result — `fn`'s, or the one recorded before (by whichever attempt
 * committed first), as JSON decodes it.
 *
 * Rejects with what {@link guard} rejects with, and what `fn` throws (the
 * transaction rolled back either way).
 */
export async function runStep<T>(
  client: QueryClient,
  fence: Fence,
  step: string,
  fn: (client: QueryClient) => Promise<T> | T,
  options: GuardOptions = {},
): Promise<T> {
  const name = stepName(step);
  const sql = new Sql(dialectOf(client, options.dialect), prefixOf(options));
  ms("lockWaitMs", options.lockWaitMs, DEFAULT_LOCK_WAIT_MS);
  ms("idleMs", options.idleMs, DEFAULT_IDLE_MS);
  return ownTransaction(client, sql, "runStep", async () => {
    const s = await guard(client, fence, name, { ...options, dialect: sql.dialect });
    if (s.recorded) return s.result as T;
    const result = await fn(client);
    await s.record(result);
    return s.result as T;
  });
}

/**
 * The fence of the attempt that sent an HTTP request (the `Gnomon-Run-Id`,
 * `Gnomon-Attempt` and `Gnomon-Fence-Token` headers of gnomon's HTTP jobs),
 * for a receiving service. Header names are matched case-insensitively.
 */
export function fenceFromHeaders(headers: Record<string, string | string[] | undefined>): Fence {
  const lower: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers)) if (v !== undefined) lower[k.toLowerCase()] = Array.isArray(v) ? v[0] : v;
  return parseFence(lower["gnomon-run-id"], lower["gnomon-attempt"], lower["gnomon-fence-token"]);
}

/** The fence of a shell job's attempt (`GNOMON_RUN_ID`, `GNOMON_ATTEMPT`, `GNOMON_FENCE_TOKEN`). */
export function fenceFromEnv(env: Record<string, string | undefined> = process.env): Fence {
  return parseFence(env["GNOMON_RUN_ID"], env["GNOMON_ATTEMPT"], env["GNOMON_FENCE_TOKEN"]);
}

function parseFence(runId?: string, attempt?: string, token?: string): Fence {
  if (!runId || runId.length > 255) throw new TypeError(`not a run id: ${JSON.stringify(runId)}`);
  if (!attempt || !/^\s*[1-9][0-9]*\s*$/.test(attempt)) throw new TypeError(`not an attempt: ${JSON.stringify(attempt)}`);
  if (!token || !/^\s*[0-9]+\s*$/.test(token)) throw new TypeError(`not a fence token: ${JSON.stringify(token)}`);
  return new Fence(runId, Number(attempt.trim()), BigInt(token.trim()));
}
