// Exactly-once steps against the real PostgreSQL and MariaDB servers (the
// ones scripts/test.sh starts): the first commit wins either way, begun
// attempts shut out older ones, transactions are required, a frozen holder
// is cut off, results round-trip as JSON, the earlier fence table carries
// over, steps are independent; and fences read from headers and a shell
// job's environment.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { Client } from "pg";
import * as mysql from "mysql2/promise";
import { Fence } from "../src/fence";
import { RetryAfter } from "../src/errors";
import {
  guard,
  runStep,
  beginAttempt,
  createTables,
  createFenceTable,
  Step,
  Superseded,
  FenceRejected,
  NotInTransaction,
  LockTimeout,
  fenceFromHeaders,
  fenceFromEnv,
  type QueryClient,
} from "../src/guard";

type Conn = QueryClient & { end(): Promise<void> };

interface Db {
  name: "postgres" | "mysql";
  connect(): Promise<Conn>;
  p(n: number): string;
  rows(result: unknown): Array<Record<string, unknown>>;
}

const dbs: Db[] = [
  {
    name: "postgres",
    connect: async () => {
      const c = new Client({ host: "127.0.0.1", port: 5432, user: "root", database: "test" });
      // A connection the server ends (the idle timeout) must not crash the test.
      c.on("error", () => undefined);
      await c.connect();
      return c;
    },
    p: (n) => `$${n}`,
    rows: (r) => (r as { rows: Array<Record<string, unknown>> }).rows,
  },
  {
    name: "mysql",
    connect: async () => {
      const c = await mysql.createConnection({ host: "127.0.0.1", port: 3306, user: "root", password: "", database: "test" });
      c.on("error", () => undefined);
      return c;
    },
    p: () => "?",
    rows: (r) => (r as [Array<Record<string, unknown>>])[0],
  },
];

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

for (const db of dbs) {
  test(`exactly-once steps on ${db.name}`, async (t) => {
    const suffix = randomBytes(4).toString("hex");
    const prefix = `gnomon_t${suffix}`;
    const effects = `effects_${suffix}`;
    const admin = await db.connect();
    await createTables(admin, { prefix });
    await admin.query(`CREATE TABLE ${effects} (run_id VARCHAR(255) NOT NULL, attempt BIGINT NOT NULL)`);
    const opts = { prefix };

    /** The job's step: guard first; when fresh, its row and its result; one transaction. */
    const pay = async (f: Fence, step = "run", hold?: Promise<void>, extra: Record<string, number> = {}): Promise<Step> => {
      const c = await db.connect();
      try {
        await c.query("BEGIN");
        try {
          const s = await guard(c, f, step, { ...opts, ...extra });
          if (hold) await hold;
          if (s.fresh) {
            await c.query(`INSERT INTO ${effects} (run_id, attempt) VALUES (${db.p(1)}, ${db.p(2)})`, [f.runId, f.attempt]);
            await s.record({ paid_by: f.attempt, step });
          }
          await c.query("COMMIT");
          return s;
        } catch (e) {
          await c.query("ROLLBACK").catch(() => undefined);
          throw e;
        }
      } finally {
        await c.end().catch(() => undefined);
      }
    };
    const rows = async (run: string): Promise<number[]> =>
      db.rows(await admin.query(`SELECT attempt FROM ${effects} WHERE run_id = ${db.p(1)} ORDER BY attempt`, [run])).map((r) => Number(r["attempt"]));
    const marker = async (run: string): Promise<[number, number] | null> => {
      const r = db.rows(await admin.query(`SELECT attempt, token FROM ${prefix}_fence WHERE run_id = ${db.p(1)}`, [run]));
      return r.length ? [Number(r[0]!["attempt"]), Number(r[0]!["token"])] : null;
    };

    try {
      await t.test("the first commit wins, older first", async () => {
        const first = await pay(new Fence("r1", 1, 5n));
        assert.ok(first.fresh);
        assert.deepEqual(first.result, { paid_by: 1, step: "run" });
        const again = await pay(new Fence("r1", 1, 5n));
        assert.ok(again.recorded && again.attempt === 1 && again.token === 5n, "the same attempt does not pay twice");
        const later = await pay(new Fence("r1", 2, 6n));
        assert.ok(later.recorded && later.attempt === 1);
        assert.deepEqual(later.result, { paid_by: 1, step: "run" });
        assert.deepEqual(await rows("r1"), [1]);
        assert.deepEqual(await marker("r1"), [1, 5], "reading a record raises nothing");
      });

      await t.test("the first commit wins, newer first", async () => {
        await pay(new Fence("r2", 2, 6n));
        const late = await pay(new Fence("r2", 1, 5n));
        assert.ok(late.recorded && late.attempt === 2);
        assert.deepEqual(late.result, { paid_by: 2, step: "run" });
        assert.deepEqual(await rows("r2"), [2]);
      });

      await t.test("racing attempts wait for the first, then read its record", async () => {
        let release!: () => void;
        const hold = new Promise<void>((r) => (release = r));
        const newer = pay(new Fence("r3", 2, 5n), "run", hold);
        await sleep(300);
        let olderDone = false;
        const older = pay(new Fence("r3", 1, 5n)).finally(() => (olderDone = true));
        await sleep(300);
        assert.equal(olderDone, false, "the older attempt waits for the run's lock");
        release();
        assert.ok((await newer).fresh);
        const o = await older;
        assert.ok(o.recorded);
        assert.deepEqual(o.result, { paid_by: 2, step: "run" });
        assert.deepEqual(await rows("r3"), [2]);
      });

      await t.test("a begun attempt shuts older ones out of new steps only", async () => {
        const c = await db.connect();
        try {
          await pay(new Fence("r4", 1, 5n), "charge");
          await beginAttempt(c, new Fence("r4", 2, 6n), opts);
          assert.deepEqual(await marker("r4"), [2, 6]);
          await assert.rejects(
            pay(new Fence("r4", 1, 5n), "ship"),
            (e: unknown) => e instanceof Superseded && e instanceof FenceRejected && /attempt 2 \(token 6\) has started/.test(e.message) && e.step === "ship",
          );
          const read = await pay(new Fence("r4", 1, 5n), "charge");
          assert.ok(read.recorded);
          assert.deepEqual(read.result, { paid_by: 1, step: "charge" });
          await assert.rejects(beginAttempt(c, new Fence("r4", 1, 5n), opts), Superseded);
          await assert.rejects(beginAttempt(c, new Fence("r4", 2, 5n), opts), Superseded);
          await beginAttempt(c, new Fence("r4", 2, 6n), opts);
          assert.ok((await pay(new Fence("r4", 2, 6n), "ship")).fresh);
          assert.deepEqual(await rows("r4"), [1, 2]);
          assert.deepEqual(await marker("r4"), [2, 6]);
        } finally {
          await c.end();
        }
      });

      await t.test("outside a transaction the guard refuses", async () => {
        const c = await db.connect();
        try {
          await assert.rejects(guard(c, new Fence("r5", 1, 1n), "run", opts), (e: unknown) => e instanceof NotInTransaction && /autocommit/.test(e.message));
          await c.query("BEGIN");
          assert.ok((await guard(c, new Fence("r5", 1, 1n), "run", opts)).fresh);
          await assert.rejects(runStep(c, new Fence("r5", 1, 1n), "x", () => 1, opts), /commits its own transaction/);
          await assert.rejects(beginAttempt(c, new Fence("r5", 1, 1n), opts), /commits its own transaction/);
          await c.query("COMMIT");
          if (db.name === "mysql") {
            // With autocommit off the next statement begins one.
            await c.query("SET autocommit = 0");
            assert.ok((await guard(c, new Fence("r5", 1, 1n), "second", opts)).fresh);
            await c.query("COMMIT");
            assert.equal(await runStep(c, new Fence("r5", 1, 1n), "third", () => 3, opts), 3);
            await c.query("SET autocommit = 1");
          }
          assert.deepEqual(await marker("r5"), [1, 1]);
        } finally {
          await c.end();
        }
      });

      await t.test("a frozen holder is cut off, and the retry commits", async () => {
        const frozen = await db.connect();
        await frozen.query("BEGIN");
        const step = await guard(frozen, new Fence("r6", 1, 5n), "run", { ...opts, lockWaitMs: 1000, idleMs: 2000 });
        await frozen.query(`INSERT INTO ${effects} (run_id, attempt) VALUES (${db.p(1)}, ${db.p(2)})`, ["r6", 1]);
        const heldAt = Date.now();
        // The frozen attempt sends nothing more. The retry waits 1 s for the
        // run's lock, is told to retry, and gets through once the database
        // has ended the idle transaction.
        const t0 = Date.now();
        await assert.rejects(pay(new Fence("r6", 2, 6n), "run", undefined, { lockWaitMs: 1000, idleMs: 2000 }), (e: unknown) => {
          assert.ok(e instanceof LockTimeout && e instanceof RetryAfter && RetryAfter.is(e) && e.retryAfterMs === 0, String(e));
          return true;
        });
        const waited = Date.now() - t0;
        assert.ok(waited > 800 && waited < 2500, `${waited} ms`);
        let got: Step | undefined;
        while (!got) {
          try {
            got = await pay(new Fence("r6", 2, 6n), "run", undefined, { lockWaitMs: 1000, idleMs: 2000 });
          } catch (e) {
            if (!(e instanceof LockTimeout)) throw e;
            assert.ok(Date.now() - heldAt < 8000, "the idle transaction is never ended");
          }
        }
        assert.ok(got.fresh && Date.now() - heldAt > 1900);
        await assert.rejects(
          (async () => {
            await step.record("too late");
            await frozen.query("COMMIT");
          })(),
        );
        await frozen.end().catch(() => undefined);
        assert.deepEqual(await rows("r6"), [2]);
        const c = await db.connect();
        try {
          const r = await runStep(c, new Fence("r6", 1, 5n), "run", () => assert.fail("ran"), opts);
          assert.deepEqual(r, { paid_by: 2, step: "run" });
        } finally {
          await c.end();
        }
      });

      await t.test("results round-trip as JSON", async () => {
        const c = await db.connect();
        const value = { id: "pay_1", amount: 10.25, ok: true, none: null, items: [1, "two", { "3": [3.5] }], text: 'été ☃ "quoted" \\ \n' };
        try {
          let calls = 0;
          const charge = async (cl: QueryClient) => {
            calls++;
            await cl.query(`INSERT INTO ${effects} (run_id, attempt) VALUES (${db.p(1)}, ${db.p(2)})`, ["r7", 1]);
            return value;
          };
          assert.deepEqual(await runStep(c, new Fence("r7", 1, 5n), "charge", charge, opts), value);
          assert.deepEqual(await runStep(c, new Fence("r7", 2, 6n), "charge", charge, opts), value);
          assert.equal(calls, 1);
          assert.equal(await runStep(c, new Fence("r7", 1, 5n), "nothing", () => undefined, opts), null);
          assert.deepEqual(await runStep(c, new Fence("r7", 1, 5n), "date", () => ({ at: new Date(0) }), opts), { at: "1970-01-01T00:00:00.000Z" });
          const cyclic: Record<string, unknown> = {};
          cyclic["self"] = cyclic;
          for (const bad of [1n, cyclic, () => 1, Symbol("s")]) {
            await assert.rejects(runStep(c, new Fence("r7", 2, 6n), "bad", () => bad, opts), (e: unknown) => e instanceof TypeError && /cannot be recorded as JSON/.test(e.message));
          }
          // Nothing of the refused step was kept: it is fresh again.
          assert.equal(await runStep(c, new Fence("r7", 2, 6n), "bad", () => "fine", opts), "fine");
          assert.deepEqual(await rows("r7"), [1]);
        } finally {
          await c.end();
        }
      });

      await t.test("a failing step rolls back and stays fresh", async () => {
        const c = await db.connect();
        try {
          await assert.rejects(
            runStep(c, new Fence("r8", 1, 5n), "charge", async (cl) => {
              await cl.query(`INSERT INTO ${effects} (run_id, attempt) VALUES (${db.p(1)}, ${db.p(2)})`, ["r8", 1]);
              throw new Error("card declined");
            }, opts),
            /declined/,
          );
          assert.deepEqual(await rows("r8"), []);
          assert.equal(await runStep(c, new Fence("r8", 2, 6n), "charge", () => "ok", opts), "ok");
        } finally {
          await c.end();
        }
      });

      await t.test("the earlier fence table carries over", async () => {
        const old = `gnomon_m${randomBytes(4).toString("hex")}`;
        const c = await db.connect();
        try {
          await c.query(
            db.name === "postgres"
              ? `CREATE TABLE ${old}_fence (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL, token BIGINT NOT NULL, written_at TIMESTAMPTZ NOT NULL DEFAULT now())`
              : `CREATE TABLE ${old}_fence (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY, attempt BIGINT NOT NULL, ` +
                  "token BIGINT NOT NULL, written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB",
          );
          await c.query(`INSERT INTO ${old}_fence (run_id, attempt, token) VALUES ('old', 3, 7)`);
          await createFenceTable(c, { table: `${old}_fence` }); // the earlier name, twice: idempotent
          await createTables(c, { prefix: old });
          const o = { prefix: old };
          await assert.rejects(runStep(c, new Fence("old", 2, 6n), "run", () => "stale", o), /attempt 3 \(token 7\)/);
          assert.equal(await runStep(c, new Fence("old", 3, 7n), "run", () => "mine", o), "mine");
          assert.equal(await runStep(c, new Fence("old", 4, 8n), "run", () => "again", o), "mine");
          assert.equal(await runStep(c, new Fence("new", 1, 9007199254740993n), "run", () => "fresh", o), "fresh");
          assert.equal(await runStep(c, new Fence("new", 1, 9007199254740992n), "other", () => "x", o).catch((e) => e.constructor.name), "Superseded");
        } finally {
          await c.query(`DROP TABLE IF EXISTS ${old}_fence`);
          await c.query(`DROP TABLE IF EXISTS ${old}_steps`);
          await c.end();
        }
      });

      await t.test("two steps of a run are independent", async () => {
        assert.ok((await pay(new Fence("r9", 1, 5n), "charge")).fresh);
        assert.ok((await pay(new Fence("r9", 2, 6n), "ship")).fresh);
        assert.deepEqual((await pay(new Fence("r9", 2, 6n), "charge")).result, { paid_by: 1, step: "charge" });
        assert.deepEqual((await pay(new Fence("r9", 3, 7n), "ship")).result, { paid_by: 2, step: "ship" });
        assert.ok((await pay(new Fence("r9", 3, 7n), "Ship")).fresh, "names are compared exactly");
        assert.deepEqual(await rows("r9"), [1, 2, 3]);
      });
    } finally {
      await admin.query(`DROP TABLE IF EXISTS ${prefix}_fence`);
      await admin.query(`DROP TABLE IF EXISTS ${prefix}_steps`);
      await admin.query(`DROP TABLE IF EXISTS ${effects}`);
      await admin.end();
    }
  });
}

test("fences from headers and the environment; bad arguments", async () => {
  const f = fenceFromHeaders({ "Gnomon-Run-Id": "abc-1000", "gnomon-attempt": "2", "GNOMON-FENCE-TOKEN": "7" });
  assert.ok(f.equals(new Fence("abc-1000", 2, 7n)));
  assert.throws(() => fenceFromHeaders({ "gnomon-run-id": "abc", "gnomon-attempt": "x", "gnomon-fence-token": "1" }), TypeError);
  assert.ok(fenceFromEnv({ GNOMON_RUN_ID: "r", GNOMON_ATTEMPT: "1", GNOMON_FENCE_TOKEN: "18446744073709551615" }).token === 18446744073709551615n);
  assert.throws(() => fenceFromEnv({}), TypeError);
  const fake = { query: async () => ({ rows: [] }) };
  await assert.rejects(guard(fake, new Fence("r", 1, 1n)), TypeError); // a client of an unknown driver
  await assert.rejects(createTables(fake, { dialect: "postgres", prefix: "x; drop table y" }), TypeError);
  await assert.rejects(createFenceTable(fake, { dialect: "postgres", table: "gnomon_fencing" }), TypeError);
  await assert.rejects(guard(fake, new Fence("r", 1, 1n), "", { dialect: "postgres" }), TypeError);
  await assert.rejects(guard(fake, new Fence("r", 1, 1n), "run", { dialect: "postgres", lockWaitMs: 0 }), TypeError);
  const pool = { connect: async () => fake, totalCount: 0, query: fake.query };
  await assert.rejects(guard(pool, new Fence("r", 1, 1n)), /pool\.connect/);
});
