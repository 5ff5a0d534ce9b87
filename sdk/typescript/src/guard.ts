/**
 * Fenced writes: database writes that commit only while their attempt is
 * the newest of its run.
 *
 * gnomon runs each attempt at least once. A worker frozen past its lease
 * may wake after its run was retried elsewhere, and a handler that ignores
 * its `signal` keeps going. {@link guard}, called first in the transaction
 * of the job's writes, checks and records the attempt's {@link Fence} —
 * `(runId, attempt, token)` — in a table (`gnomon_fence`), and throws
 * {@link FenceRejected} when a later attempt of the run, or a higher token,
 * has written already. Roll back then, and none of the attempt's writes
 * land.
 *
 * @example
 * ```ts
 * const client = await pool.connect();             // pg
 * await client.query("BEGIN");
 * try {
 *   await guard(client, ctx.fence);                // first, in the same transaction
 *   await client.query("INSERT INTO payments (run_id, amount) VALUES ($1, 10)", [ctx.runId]);
 *   await client.query("COMMIT");
 * } catch (e) { await client.query("ROLLBACK"); throw e; }
 * ```
 *
 * What it guarantees: once an attempt has committed through the guard, no
 * earlier attempt of the run (nor one with a lower token) commits through
 * it; racing attempts are serialized by the row lock the guard takes.
 * What it cannot: writes outside the guarded transaction, or to other
 * systems, are not fenced; and an older attempt that writes before the
 * newer one has written is admitted (make the write idempotent on the run
 * id for that).
 *
 * @packageDocumentation
 */
import { Fence } from "./fence";

/** The table the guard keeps unless told otherwise. */
export const DEFAULT_FENCE_TABLE = "gnomon_fence";

/** Which database a client talks to. */
export type Dialect = "postgres" | "mysql";

/**
 * A database client in a transaction: a `pg` `Client`/`PoolClient`
 * (`query(text, values)` resolving to `{ rows }`) or a `mysql2/promise`
 * connection (`query(sql, values)` resolving to `[rows, fields]`).
 */
export interface QueryClient {
  query(sql: string, values?: unknown[]): Promise<unknown>;
}

/** Options of {@link guard} and {@link createFenceTable}. */
export interface GuardOptions {
  /** The client's database; told from the client when absent. */
  dialect?: Dialect;
  /** The fence table (a plain SQL name); `gnomon_fence` by default. */
  table?: string;
}

/** A later attempt of the run, or a higher token, has written already: roll back. */
export class FenceRejected extends Error {
  /** The attempt that was refused. */
  readonly fence: Fence;
  /** The attempt recorded. */
  readonly seenAttempt: number;
  /** The token recorded. */
  readonly seenToken: bigint;

  constructor(fence: Fence, seenAttempt: number, seenToken: bigint) {
    super(
      `attempt ${fence.attempt} (token ${fence.token}) of run ${fence.runId} is superseded: ` +
        `attempt ${seenAttempt} (token ${seenToken}) has written already`,
    );
    this.name = "FenceRejected";
    this.fence = fence;
    this.seenAttempt = seenAttempt;
    this.seenToken = seenToken;
  }
}

function dialectOf(client: QueryClient, dialect?: Dialect): Dialect {
  if (dialect !== undefined) {
    if (dialect !== "postgres" && dialect !== "mysql") throw new TypeError(`dialect must be "postgres" or "mysql", not ${String(dialect)}`);
    return dialect;
  }
  const c = client as unknown as Record<string, unknown>;
  if ("connectionParameters" in c) return "postgres";
  if ("config" in c && typeof c["execute"] === "function") return "mysql";
  throw new TypeError('cannot tell the database of this client: pass { dialect: "postgres" } or { dialect: "mysql" }');
}

function tableName(table?: string): string {
  const t = table ?? DEFAULT_FENCE_TABLE;
  if (!/^[A-Za-z_][A-Za-z0-9_]{0,63}$/.test(t)) throw new TypeError(`the fence table ${JSON.stringify(t)} is not a plain SQL name`);
  return t;
}

/** The rows of a query's result, for either driver. */
function rowsOf(result: unknown): Array<Record<string, unknown>> {
  if (Array.isArray(result)) return result[0] as Array<Record<string, unknown>>;
  return (result as { rows: Array<Record<string, unknown>> }).rows;
}

/** Creates the fence table if it is missing. */
export async function createFenceTable(client: QueryClient, options: GuardOptions = {}): Promise<void> {
  const t = tableName(options.table);
  if (dialectOf(client, options.dialect) === "postgres") {
    await client.query(
      `CREATE TABLE IF NOT EXISTS ${t} (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL, token BIGINT NOT NULL, ` +
        "written_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    );
  } else {
    await client.query(
      `CREATE TABLE IF NOT EXISTS ${t} (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY, ` +
        "attempt BIGINT NOT NULL, token BIGINT NOT NULL, written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB",
    );
  }
}

/**
 * Checks and records `fence` inside the client's transaction; throws
 * {@link FenceRejected} when a later attempt of the run, or a higher token,
 * has written. Holds the run's row lock until the transaction ends.
 */
export async function guard(client: QueryClient, fence: Fence, options: GuardOptions = {}): Promise<void> {
  const t = tableName(options.table);
  const pg = dialectOf(client, options.dialect) === "postgres";
  const token = fence.token.toString();
  // The row exists (ours, or another attempt's, waited for while it is
  // being inserted); then it is locked and read as last committed.
  await client.query(
    pg
      ? `INSERT INTO ${t} (run_id, attempt, token) VALUES ($1, $2, $3) ON CONFLICT (run_id) DO NOTHING`
      : `INSERT INTO ${t} (run_id, attempt, token) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE run_id = run_id`,
    [fence.runId, fence.attempt, token],
  );
  const rows = rowsOf(
    await client.query(`SELECT attempt, token FROM ${t} WHERE run_id = ${pg ? "$1" : "?"} FOR UPDATE`, [fence.runId]),
  );
  const seenAttempt = rows.length ? Number(rows[0]["attempt"]) : 0;
  const seenToken = rows.length ? BigInt(String(rows[0]["token"])) : 0n;
  if (seenAttempt > fence.attempt || seenToken > fence.token) throw new FenceRejected(fence, seenAttempt, seenToken);
  await client.query(
    pg
      ? `UPDATE ${t} SET attempt = $2, token = $3, written_at = now() WHERE run_id = $1`
      : `UPDATE ${t} SET attempt = ?, token = ?, written_at = CURRENT_TIMESTAMP(3) WHERE run_id = ?`,
    pg ? [fence.runId, fence.attempt, token] : [fence.attempt, token, fence.runId],
  );
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
