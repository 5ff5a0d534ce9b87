"""Exactly-once steps against the real PostgreSQL and MariaDB servers (the
ones scripts/test.sh starts): the first commit wins either way, begun
attempts shut out older ones, transactions are required, a frozen holder
is cut off, results round-trip as JSON, the earlier fence table carries
over, steps are independent; and fences read from a shell job's
environment and HTTP headers."""

from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional

import pytest

from gnomon_worker import RetryAfter
from gnomon_worker.fence import (
    Fence,
    FenceRejected,
    LockTimeout,
    NotInTransaction,
    Step,
    Superseded,
    begin_attempt,
    create_table,
    create_tables,
    guard,
    run_step,
)

PG = os.environ.get("GNOMON_TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=root dbname=test")
MY = dict(host="127.0.0.1", port=3306, user="root", password="", database="test")


def pg() -> Any:
    import psycopg
    return psycopg.connect(PG)


def my() -> Any:
    import pymysql
    return pymysql.connect(**MY)


class Db(NamedTuple):
    name: str
    connect: Callable[[], Any]
    prefix: str
    effects: str


@pytest.fixture(params=["postgres", "mysql"])
def db(request: Any) -> Iterator[Db]:
    connect = pg if request.param == "postgres" else my
    suffix = secrets.token_hex(4)
    prefix, effects = f"gnomon_t{suffix}", f"effects_{suffix}"
    conn = connect()
    create_tables(conn, prefix)
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {effects} (run_id VARCHAR(255) NOT NULL, attempt BIGINT NOT NULL)")
    conn.commit()
    yield Db(request.param, connect, prefix, effects)
    with conn.cursor() as cur:
        for t in (f"{prefix}_fence", f"{prefix}_steps", effects):
            cur.execute(f"DROP TABLE IF EXISTS {t}")
    conn.commit()
    conn.close()


def begin(db: Db, conn: Any) -> None:
    """Opens a transaction as a caller would."""
    if db.name == "mysql":
        conn.begin()


def pay(db: Db, f: Fence, step: str = "run", hold: Optional[threading.Event] = None, **kw: Any) -> Step:
    """The job's step: guard first; when fresh, its row and its result; one transaction."""
    conn = db.connect()
    try:
        begin(db, conn)
        with conn.cursor() as cur:
            s = guard(cur, f, step, prefix=db.prefix, **kw)
            if hold is not None:
                hold.wait(10)
            if s.fresh:
                cur.execute(f"INSERT INTO {db.effects} (run_id, attempt) VALUES (%s, %s)", (f.run_id, f.attempt))
                s.record({"paid_by": f.attempt, "step": step})
        conn.commit()
        return s
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()


def effects(db: Db, run: str) -> List[int]:
    conn = db.connect()
    with conn.cursor() as cur:
        cur.execute(f"SELECT attempt FROM {db.effects} WHERE run_id = %s ORDER BY attempt", (run,))
        out = [int(r[0]) for r in cur.fetchall()]
    conn.close()
    return out


def marker(db: Db, run: str) -> Any:
    conn = db.connect()
    with conn.cursor() as cur:
        cur.execute(f"SELECT attempt, token FROM {db.prefix}_fence WHERE run_id = %s", (run,))
        row = cur.fetchone()
    conn.close()
    return None if row is None else (int(row[0]), int(row[1]))


def test_the_first_commit_wins_older_first(db: Db) -> None:
    first = pay(db, Fence("r1", 1, 5))
    assert first.fresh and first.result == {"paid_by": 1, "step": "run"}
    again = pay(db, Fence("r1", 1, 5))
    assert again.recorded and (again.attempt, again.token) == (1, 5), "the same attempt does not pay twice"
    later = pay(db, Fence("r1", 2, 6))
    assert later.recorded and later.result == {"paid_by": 1, "step": "run"} and later.attempt == 1
    assert effects(db, "r1") == [1]
    assert marker(db, "r1") == (1, 5), "reading a record raises nothing"


def test_the_first_commit_wins_newer_first(db: Db) -> None:
    pay(db, Fence("r2", 2, 6))
    late = pay(db, Fence("r2", 1, 5))
    assert late.recorded and late.result == {"paid_by": 2, "step": "run"} and late.attempt == 2
    assert effects(db, "r2") == [2]


def test_racing_attempts_wait_for_the_first_then_read_its_record(db: Db) -> None:
    hold = threading.Event()
    got: Dict[int, Any] = {}

    def run(f: Fence, h: Optional[threading.Event]) -> None:
        try:
            got[f.attempt] = pay(db, f, hold=h)
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            got[f.attempt] = e

    newer = threading.Thread(target=run, args=(Fence("r3", 2, 5), hold))
    newer.start()
    time.sleep(0.3)
    older = threading.Thread(target=run, args=(Fence("r3", 1, 5), None))
    older.start()
    time.sleep(0.3)
    assert older.is_alive(), "the older attempt waits for the run's lock"
    hold.set()
    newer.join(10)
    older.join(10)
    assert [type(got.get(a)) for a in (1, 2)] == [Step, Step], got
    assert got[2].fresh and got[1].recorded and got[1].result == {"paid_by": 2, "step": "run"}
    assert effects(db, "r3") == [2]


def test_a_begun_attempt_shuts_older_ones_out_of_new_steps_only(db: Db) -> None:
    conn = db.connect()
    try:
        pay(db, Fence("r4", 1, 5), "charge")
        begin_attempt(conn, Fence("r4", 2, 6), prefix=db.prefix)
        assert marker(db, "r4") == (2, 6)
        with pytest.raises(Superseded) as e:
            pay(db, Fence("r4", 1, 5), "ship")
        assert "attempt 2 (token 6) has started" in str(e.value) and e.value.step == "ship"
        assert isinstance(e.value, FenceRejected), "the earlier name still catches it"
        read = pay(db, Fence("r4", 1, 5), "charge")
        assert read.recorded and read.result == {"paid_by": 1, "step": "charge"}
        with pytest.raises(Superseded):
            begin_attempt(conn, Fence("r4", 1, 5), prefix=db.prefix)
        # The same attempt under a higher token is newer; a lower one is not.
        with pytest.raises(Superseded):
            begin_attempt(conn, Fence("r4", 2, 5), prefix=db.prefix)
        begin_attempt(conn, Fence("r4", 2, 6), prefix=db.prefix)
        assert pay(db, Fence("r4", 2, 6), "ship").fresh
        assert effects(db, "r4") == [1, 2]
        assert marker(db, "r4") == (2, 6)
    finally:
        conn.close()


def test_outside_a_transaction_the_guard_refuses(db: Db) -> None:
    conn = db.connect()
    try:
        if db.name == "postgres":
            conn.autocommit = True
            with conn.cursor() as cur, pytest.raises(NotInTransaction, match="autocommit"):
                guard(cur, Fence("r5", 1, 1), prefix=db.prefix)
            with conn.transaction(), conn.cursor() as cur:
                assert guard(cur, Fence("r5", 1, 1), prefix=db.prefix).fresh
            conn.autocommit = False
            with conn.transaction():
                with pytest.raises(RuntimeError, match="commits its own transaction"):
                    run_step(conn, Fence("r5", 1, 1), "x", lambda cur: 1, prefix=db.prefix)
        else:
            conn.autocommit(True)
            with conn.cursor() as cur, pytest.raises(NotInTransaction, match="autocommit"):
                guard(cur, Fence("r5", 1, 1), prefix=db.prefix)
            conn.begin()
            with conn.cursor() as cur:
                assert guard(cur, Fence("r5", 1, 1), prefix=db.prefix).fresh
            conn.commit()
            conn.autocommit(False)  # PyMySQL's default: the first statement begins one
            with conn.cursor() as cur:
                assert guard(cur, Fence("r5", 1, 1), "second", prefix=db.prefix).fresh
            conn.commit()
            conn.begin()
            with pytest.raises(RuntimeError, match="commits its own transaction"):
                begin_attempt(conn, Fence("r5", 1, 1), prefix=db.prefix)
            conn.rollback()
        assert marker(db, "r5") == (1, 1)
    finally:
        conn.close()


def test_a_frozen_holder_is_cut_off_and_the_retry_commits(db: Db) -> None:
    frozen = db.connect()
    begin(db, frozen)
    cur = frozen.cursor()
    step = guard(cur, Fence("r6", 1, 5), lock_wait=1, idle=2, prefix=db.prefix)
    cur.execute(f"INSERT INTO {db.effects} (run_id, attempt) VALUES (%s, %s)", ("r6", 1))
    held_at = time.monotonic()
    # The frozen attempt sends nothing more. The retry waits 1 s for the
    # run's lock, is told to retry, and gets through once the database has
    # ended the idle transaction.
    t0 = time.monotonic()
    with pytest.raises(LockTimeout) as e:
        pay(db, Fence("r6", 2, 6), lock_wait=1, idle=2)
    assert isinstance(e.value, RetryAfter) and e.value.retry_after_ms == 0
    assert 0.8 < time.monotonic() - t0 < 2.5, time.monotonic() - t0
    got: Optional[Step] = None
    while got is None:
        try:
            got = pay(db, Fence("r6", 2, 6), lock_wait=1, idle=2)
        except LockTimeout:
            assert time.monotonic() - held_at < 8, "the idle transaction is never ended"
    assert got.fresh and 1.9 < time.monotonic() - held_at
    with pytest.raises(Exception):
        step.record("too late")
        frozen.commit()
    try:
        frozen.close()
    except Exception:  # noqa: BLE001 - closed by the server already
        pass
    assert effects(db, "r6") == [2]
    conn = db.connect()
    try:
        assert run_step(conn, Fence("r6", 1, 5), "run", lambda cur: pytest.fail("ran"), prefix=db.prefix) == {
            "paid_by": 2, "step": "run"}
    finally:
        conn.close()


def test_results_round_trip_as_json(db: Db) -> None:
    conn = db.connect()
    value = {"id": "pay_1", "amount": 10.25, "ok": True, "none": None, "items": [1, "two", {"3": [3.0]}],
             "text": "été ☃ \"quoted\" \\ \n"}
    try:
        calls = []

        def charge(cur: Any) -> Any:
            calls.append(1)
            cur.execute(f"INSERT INTO {db.effects} (run_id, attempt) VALUES (%s, %s)", ("r7", 1))
            return value

        assert run_step(conn, Fence("r7", 1, 5), "charge", charge, prefix=db.prefix) == value
        assert run_step(conn, Fence("r7", 2, 6), "charge", charge, prefix=db.prefix) == value
        assert run_step(conn, Fence("r7", 1, 5), "tuple", lambda cur: (1, 2), prefix=db.prefix) == [1, 2]
        assert run_step(conn, Fence("r7", 2, 6), "tuple", lambda cur: (3, 4), prefix=db.prefix) == [1, 2]
        assert run_step(conn, Fence("r7", 1, 5), "nothing", lambda cur: None, prefix=db.prefix) is None
        assert len(calls) == 1
        for bad in (object(), float("nan"), {1j: 2}):
            with pytest.raises(TypeError, match="cannot be recorded as JSON"):
                run_step(conn, Fence("r7", 2, 6), "bad", lambda cur, bad=bad: bad, prefix=db.prefix)
        # Nothing of the refused step was kept: it is fresh again.
        assert run_step(conn, Fence("r7", 2, 6), "bad", lambda cur: "fine", prefix=db.prefix) == "fine"
        assert effects(db, "r7") == [1]
    finally:
        conn.close()


def test_a_failing_step_rolls_back_and_stays_fresh(db: Db) -> None:
    conn = db.connect()
    try:
        def fails(cur: Any) -> Any:
            cur.execute(f"INSERT INTO {db.effects} (run_id, attempt) VALUES (%s, %s)", ("r8", 1))
            raise ValueError("card declined")

        with pytest.raises(ValueError, match="declined"):
            run_step(conn, Fence("r8", 1, 5), "charge", fails, prefix=db.prefix)
        assert effects(db, "r8") == []
        assert run_step(conn, Fence("r8", 2, 6), "charge", lambda cur: "ok", prefix=db.prefix) == "ok"
    finally:
        conn.close()


def test_the_earlier_fence_table_carries_over(db: Db) -> None:
    suffix = secrets.token_hex(4)
    prefix = f"gnomon_m{suffix}"
    conn = db.connect()
    try:
        # The fence table as the SDK made it before steps, with a run's row.
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {prefix}_fence")
            if db.name == "postgres":
                cur.execute(f"CREATE TABLE {prefix}_fence (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL, "
                            "token BIGINT NOT NULL, written_at TIMESTAMPTZ NOT NULL DEFAULT now())")
            else:
                cur.execute(f"CREATE TABLE {prefix}_fence (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL "
                            "PRIMARY KEY, attempt BIGINT NOT NULL, token BIGINT NOT NULL, "
                            "written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB")
            cur.execute(f"INSERT INTO {prefix}_fence (run_id, attempt, token) VALUES ('old', 3, 7)")
        conn.commit()
        create_table(conn.cursor(), table=f"{prefix}_fence")  # the earlier name, twice: idempotent
        conn.commit()
        create_tables(conn, prefix)
        with pytest.raises(Superseded, match="attempt 3 \\(token 7\\)"):
            run_step(conn, Fence("old", 2, 6), "run", lambda cur: "stale", prefix=prefix)
        assert run_step(conn, Fence("old", 3, 7), "run", lambda cur: "mine", prefix=prefix) == "mine"
        assert run_step(conn, Fence("old", 4, 8), "run", lambda cur: "again", prefix=prefix) == "mine"
        assert run_step(conn, Fence("new", 1, 8), "run", lambda cur: "fresh", prefix=prefix) == "fresh"
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {prefix}_fence")
            cur.execute(f"DROP TABLE IF EXISTS {prefix}_steps")
        conn.commit()
        conn.close()


def test_two_steps_of_a_run_are_independent(db: Db) -> None:
    a = pay(db, Fence("r9", 1, 5), "charge")
    b = pay(db, Fence("r9", 2, 6), "ship")
    assert a.fresh and b.fresh
    assert pay(db, Fence("r9", 2, 6), "charge").result == {"paid_by": 1, "step": "charge"}
    assert pay(db, Fence("r9", 3, 7), "ship").result == {"paid_by": 2, "step": "ship"}
    # Names are compared exactly.
    assert pay(db, Fence("r9", 3, 7), "Ship").fresh
    assert effects(db, "r9") == [1, 2, 3]


def test_the_async_forms_on_postgres() -> None:
    import asyncio

    import psycopg

    from gnomon_worker.fence import begin_attempt_async, create_tables_async, guard_async, run_step_async

    prefix = f"gnomon_a{secrets.token_hex(4)}"

    async def main() -> None:
        conn = await psycopg.AsyncConnection.connect(PG, autocommit=True)
        try:
            await create_tables_async(conn, prefix)

            async def fn(cur: Any) -> Any:
                await cur.execute("SELECT 41 + 1")
                return {"n": (await cur.fetchone())[0]}

            assert await run_step_async(conn, Fence("ra", 1, 5), "run", fn, prefix=prefix) == {"n": 42}
            assert await run_step_async(conn, Fence("ra", 2, 6), "run", lambda cur: {"n": 0}, prefix=prefix) == {"n": 42}
            await begin_attempt_async(conn, Fence("ra", 3, 7), prefix=prefix)
            with pytest.raises(Superseded):
                await run_step_async(conn, Fence("ra", 2, 6), "other", fn, prefix=prefix)
            async with conn.cursor() as cur:
                with pytest.raises(NotInTransaction):
                    await guard_async(cur, Fence("ra", 3, 7), "other", prefix=prefix)
            async with conn.transaction(), conn.cursor() as cur:
                s = await guard_async(cur, Fence("ra", 3, 7), "other", prefix=prefix)
                assert s.fresh
                await s.record([1, 2])
            assert await run_step_async(conn, Fence("ra", 3, 7), "other", fn, prefix=prefix) == [1, 2]
        finally:
            async with conn.cursor() as cur:
                await cur.execute(f"DROP TABLE IF EXISTS {prefix}_fence")
                await cur.execute(f"DROP TABLE IF EXISTS {prefix}_steps")
            await conn.close()

    asyncio.run(main())


def test_fences_from_the_environment_and_headers() -> None:
    env = {"GNOMON_RUN_ID": "abc-1000", "GNOMON_ATTEMPT": "2", "GNOMON_FENCE_TOKEN": "7"}
    assert Fence.from_env(env) == Fence("abc-1000", 2, 7)
    headers = {"Gnomon-Run-Id": "abc-1000", "Gnomon-Attempt": "2", "Gnomon-Fence-Token": "7"}
    assert Fence.from_headers(headers) == Fence("abc-1000", 2, 7)
    with pytest.raises(ValueError):
        Fence.from_headers({"Gnomon-Run-Id": "abc", "Gnomon-Attempt": "x", "Gnomon-Fence-Token": "1"})
    with pytest.raises(ValueError):
        Fence.from_env({})
    with pytest.raises(ValueError):
        guard(object(), Fence("r", 1, 1))  # a cursor of an unknown driver
    with pytest.raises(ValueError):
        create_tables(object(), "x; drop table y", "postgres")
    with pytest.raises(ValueError):
        create_table(object(), "postgres", table="gnomon_fencing")
    with pytest.raises(ValueError):
        guard(object(), Fence("r", 1, 1), "", dialect="postgres")
    with pytest.raises(ValueError):
        guard(object(), Fence("r", 1, 1), lock_wait=0, dialect="postgres")
