// The fenced-write guard against the real PostgreSQL and MariaDB servers
// (the ones scripts/test.sh starts): attempts in turn, racing attempts and
// tokens; and fences read from headers and a shell job's environment.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { Client } from "pg";
import * as mysql from "mysql2/promise";
import { Fence } from "../src/fence";
import { guard, createFenceTable, FenceRejected, fenceFromHeaders, fenceFromEnv, type QueryClient } from "../src/guard";

interface Db {
  name: string;
  connect(): Promise<QueryClient & { end(): Promise<void> }>;
  p(n: number): string;
  rows(result: unknown): Array<Record<string, unknown>>;
}

const dbs: Db[] = [
  {
    name: "postgres",
    connect: async () => {
      const c = new Client({ host: "127.0.0.1", port: 5432, user: "root", database: "test" });
      await c.connect();
      return c;
    },
    p: (n) => `$${n}`,
    rows: (r) => (r as { rows: Array<Record<string, unknown>> }).rows,
  },
  {
    name: "mysql",
    connect: async () => mysql.createConnection({ host: "127.0.0.1", port: 3306, user: "root", password: "", database: "test" }),
    p: () => "?",
    rows: (r) => (r as [Array<Record<string, unknown>>])[0],
  },
];

for (const db of dbs) {
  test(`the guard on ${db.name}`, async () => {
    const suffix = randomBytes(4).toString("hex");
    const table = `gnomon_fence_${suffix}`;
    const effects = `effects_${suffix}`;
    const admin = await db.connect();
    await createFenceTable(admin, { table });
    await admin.query(`CREATE TABLE ${effects} (run_id VARCHAR(255) NOT NULL, attempt BIGINT NOT NULL)`);
    const write = async (f: Fence, hold?: Promise<void>): Promise<void> => {
      const c = await db.connect();
      try {
        await c.query("BEGIN");
        try {
          await guard(c, f, { table });
          if (hold) await hold;
          await c.query(`INSERT INTO ${effects} (run_id, attempt) VALUES (${db.p(1)}, ${db.p(2)})`, [f.runId, f.attempt]);
          await c.query("COMMIT");
        } catch (e) {
          await c.query("ROLLBACK");
          throw e;
        }
      } finally {
        await c.end();
      }
    };
    const rows = async (run: string): Promise<number[]> =>
      db.rows(await admin.query(`SELECT attempt FROM ${effects} WHERE run_id = ${db.p(1)} ORDER BY attempt`, [run])).map((r) => Number(r["attempt"]));
    try {
      await write(new Fence("r1", 1, 5n));
      await write(new Fence("r1", 1, 5n));
      await write(new Fence("r1", 2, 5n));
      await assert.rejects(write(new Fence("r1", 1, 5n)), (e: unknown) => e instanceof FenceRejected && /attempt 2/.test(e.message));
      assert.deepEqual(await rows("r1"), [1, 1, 2]);
      await write(new Fence("r2", 1, 7n));
      await assert.rejects(write(new Fence("r2", 1, 6n)), FenceRejected);
      assert.deepEqual(await rows("r2"), [1]);
      // Racing: the retry holds the row; the stale attempt waits, then is refused.
      let release!: () => void;
      const hold = new Promise<void>((r) => (release = r));
      const retry = write(new Fence("r3", 2, 5n), hold);
      await new Promise((r) => setTimeout(r, 300));
      let staleDone = false;
      const stale = write(new Fence("r3", 1, 5n)).finally(() => (staleDone = true));
      // Its refusal is awaited from the start, so it is never unhandled.
      const staleRefused = assert.rejects(stale, FenceRejected);
      await new Promise((r) => setTimeout(r, 300));
      assert.equal(staleDone, false, "the stale attempt waits for the row");
      release();
      await retry;
      await staleRefused;
      assert.deepEqual(await rows("r3"), [2]);
    } finally {
      await admin.query(`DROP TABLE ${table}`);
      await admin.query(`DROP TABLE ${effects}`);
      await admin.end();
    }
  });
}

test("fences from headers and the environment", async () => {
  const f = fenceFromHeaders({ "Gnomon-Run-Id": "abc-1000", "gnomon-attempt": "2", "GNOMON-FENCE-TOKEN": "7" });
  assert.ok(f.equals(new Fence("abc-1000", 2, 7n)));
  assert.throws(() => fenceFromHeaders({ "gnomon-run-id": "abc", "gnomon-attempt": "x", "gnomon-fence-token": "1" }), TypeError);
  assert.ok(fenceFromEnv({ GNOMON_RUN_ID: "r", GNOMON_ATTEMPT: "1", GNOMON_FENCE_TOKEN: "18446744073709551615" }).token === 18446744073709551615n);
  assert.throws(() => fenceFromEnv({}), TypeError);
  await assert.rejects(guard({ query: async () => ({ rows: [] }) }, new Fence("r", 1, 1n)), TypeError);
});
