"""The fenced-write guard against the real PostgreSQL and MariaDB servers
(the ones scripts/test.sh starts): attempts in turn, racing attempts and
tokens; and fences read from a shell job's environment and HTTP headers."""

from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Any, Callable, Iterator, List, Tuple

import pytest

from gnomon_worker.fence import Fence, FenceRejected, create_table, guard

PG = os.environ.get("GNOMON_TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=root dbname=test")
MY = dict(host="127.0.0.1", port=3306, user="root", password="", database="test")


def pg() -> Any:
    import psycopg
    return psycopg.connect(PG)


def my() -> Any:
    import pymysql
    return pymysql.connect(**MY)


@pytest.fixture(params=["postgres", "mysql"])
def db(request: Any) -> Iterator[Tuple[Callable[[], Any], str, str]]:
    connect = pg if request.param == "postgres" else my
    suffix = secrets.token_hex(4)
    fence_table, effects = f"gnomon_fence_{suffix}", f"effects_{suffix}"
    conn = connect()
    with conn.cursor() as cur:
        create_table(cur, request.param, table=fence_table)
        cur.execute(f"CREATE TABLE {effects} (run_id VARCHAR(255) NOT NULL, attempt BIGINT NOT NULL)")
    conn.commit()
    yield connect, fence_table, effects
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE {fence_table}")
        cur.execute(f"DROP TABLE {effects}")
    conn.commit()
    conn.close()


def write(connect: Callable[[], Any], table: str, effects: str, f: Fence, hold: "threading.Event | None" = None) -> None:
    """The job's write: guard first, then its row, in one transaction."""
    conn = connect()
    try:
        with conn.cursor() as cur:
            guard(cur, f, table=table)
            if hold is not None:
                hold.wait(10)
            cur.execute(f"INSERT INTO {effects} (run_id, attempt) VALUES (%s, %s)", (f.run_id, f.attempt))
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()


def rows(connect: Callable[[], Any], effects: str, run: str) -> List[int]:
    conn = connect()
    with conn.cursor() as cur:
        cur.execute(f"SELECT attempt FROM {effects} WHERE run_id = %s ORDER BY attempt", (run,))
        out = [int(r[0]) for r in cur.fetchall()]
    conn.close()
    return out


def test_a_later_attempt_or_higher_token_shuts_out_the_earlier(db: Any) -> None:
    connect, table, effects = db
    write(connect, table, effects, Fence("r1", 1, 5))
    write(connect, table, effects, Fence("r1", 1, 5))  # an attempt may write again
    write(connect, table, effects, Fence("r1", 2, 5))
    with pytest.raises(FenceRejected) as e:
        write(connect, table, effects, Fence("r1", 1, 5))
    assert "attempt 2" in str(e.value)
    assert rows(connect, effects, "r1") == [1, 1, 2]
    write(connect, table, effects, Fence("r2", 1, 7))
    with pytest.raises(FenceRejected):
        write(connect, table, effects, Fence("r2", 1, 6))
    assert rows(connect, effects, "r2") == [1]


def test_racing_attempts_are_serialized_by_the_row(db: Any) -> None:
    connect, table, effects = db
    # The retry holds the row; the stale attempt waits, then is refused.
    hold = threading.Event()
    errors: List[BaseException] = []

    def run(f: Fence, h: "threading.Event | None") -> None:
        try:
            write(connect, table, effects, f, h)
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    retry = threading.Thread(target=run, args=(Fence("r3", 2, 5), hold))
    retry.start()
    time.sleep(0.3)
    stale = threading.Thread(target=run, args=(Fence("r3", 1, 5), None))
    stale.start()
    time.sleep(0.3)
    assert stale.is_alive(), "the stale attempt waits for the row"
    hold.set()
    retry.join(10)
    stale.join(10)
    assert len(errors) == 1 and isinstance(errors[0], FenceRejected), errors
    assert rows(connect, effects, "r3") == [2]


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
        create_table(object(), "postgres", table="x; drop table y")
