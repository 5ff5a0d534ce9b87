"""Fenced side effects: database writes that commit only while their
attempt is the newest of its run.

gnomon runs each attempt at least once. A worker frozen past its lease may
wake after its run was retried elsewhere and finish its attempt too; a
plain-function handler keeps running until it returns. :func:`guard`
closes that gap in the job's own database: called first in the
transaction of the job's writes, it checks and records the attempt's
:class:`Fence` -- ``(run_id, attempt, token)`` -- in a table
(``gnomon_fence``), and raises :class:`FenceRejected` when a later attempt
of the run, or a higher token, has written already. Roll back then, and
none of the attempt's writes land.

Example (psycopg 3; PyMySQL is the same with ``dialect="mysql"``)::

    with psycopg.connect(dsn) as conn, conn.transaction(), conn.cursor() as cur:
        guard(cur, ctx.fence)                        # first, in the same transaction
        cur.execute("INSERT INTO payments (run_id, amount) VALUES (%s, 10)", (ctx.run_id,))

What it guarantees: once an attempt has committed through the guard, no
earlier attempt of the run (nor one with a lower token) commits through
it; racing attempts are serialized by the row lock the guard takes. What
it cannot: writes outside the guarded transaction, or to other systems,
are not fenced; and an older attempt that writes before the newer one has
written is admitted (make the write idempotent on the run id for that).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

#: The table the guard keeps unless told otherwise.
DEFAULT_TABLE = "gnomon_fence"

_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Fence:
    """Identifies one attempt of a run and the leader token it was assigned under."""

    #: The run this attempt belongs to.
    run_id: str
    #: The attempt number (1, 2, ...).
    attempt: int
    #: The fencing token of the assignment; later assignments carry higher ones.
    token: int

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "Fence":
        """The fence of a shell job's attempt (``GNOMON_RUN_ID``,
        ``GNOMON_ATTEMPT``, ``GNOMON_FENCE_TOKEN``)."""
        env = os.environ if env is None else env
        return cls._parse(env.get("GNOMON_RUN_ID"), env.get("GNOMON_ATTEMPT"), env.get("GNOMON_FENCE_TOKEN"))

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> "Fence":
        """The fence of the attempt that sent an HTTP request (the
        ``Gnomon-Run-Id``, ``Gnomon-Attempt`` and ``Gnomon-Fence-Token``
        headers of gnomon's HTTP jobs), for a receiving service."""
        lower = {k.lower(): v for k, v in headers.items()}
        return cls._parse(lower.get("gnomon-run-id"), lower.get("gnomon-attempt"), lower.get("gnomon-fence-token"))

    @classmethod
    def _parse(cls, run_id: Optional[str], attempt: Optional[str], token: Optional[str]) -> "Fence":
        if not run_id or len(run_id) > 255:
            raise ValueError(f"not a run id: {run_id!r}")
        try:
            a, t = int(str(attempt).strip()), int(str(token).strip())
        except ValueError:
            raise ValueError(f"not a fence: attempt {attempt!r}, token {token!r}") from None
        if a < 1 or t < 0:
            raise ValueError(f"not a fence: attempt {a}, token {t}")
        return cls(run_id, a, t)


class FenceRejected(Exception):
    """A later attempt of the run, or a higher token, has written already:
    roll the transaction back."""

    def __init__(self, fence: Fence, seen_attempt: int, seen_token: int) -> None:
        super().__init__(
            f"attempt {fence.attempt} (token {fence.token}) of run {fence.run_id} is superseded: "
            f"attempt {seen_attempt} (token {seen_token}) has written already"
        )
        self.fence = fence
        self.seen_attempt = seen_attempt
        self.seen_token = seen_token


def _dialect(cursor: Any, dialect: Optional[str]) -> str:
    if dialect is not None:
        if dialect not in ("postgres", "mysql"):
            raise ValueError(f"dialect must be 'postgres' or 'mysql', not {dialect!r}")
        return dialect
    module = type(cursor).__module__
    if module.startswith(("psycopg", "psycopg2")):
        return "postgres"
    if module.startswith(("pymysql", "MySQLdb", "mysql")):
        return "mysql"
    raise ValueError(f"cannot tell the database of a {module} cursor: pass dialect='postgres' or 'mysql'")


def _table(table: str) -> str:
    if not _TABLE.match(table):
        raise ValueError(f"the fence table {table!r} is not a plain SQL name")
    return table


def create_table(cursor: Any, dialect: Optional[str] = None, table: str = DEFAULT_TABLE) -> None:
    """Creates the fence table if it is missing."""
    t = _table(table)
    if _dialect(cursor, dialect) == "postgres":
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {t} (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL, "
            "token BIGINT NOT NULL, written_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
    else:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {t} (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY, "
            "attempt BIGINT NOT NULL, token BIGINT NOT NULL, "
            "written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB"
        )


def guard(cursor: Any, fence: Fence, dialect: Optional[str] = None, table: str = DEFAULT_TABLE) -> None:
    """Checks and records ``fence`` inside the cursor's transaction (a DB-API
    cursor of psycopg or PyMySQL, in a transaction the caller commits).

    Raises :class:`FenceRejected` when a later attempt of the run, or a
    higher token, has written; holds the run's row lock until the
    transaction ends.
    """
    t = _table(table)
    if _dialect(cursor, dialect) == "postgres":
        insert = f"INSERT INTO {t} (run_id, attempt, token) VALUES (%s, %s, %s) ON CONFLICT (run_id) DO NOTHING"
        update = f"UPDATE {t} SET attempt = %s, token = %s, written_at = now() WHERE run_id = %s"
    else:
        insert = f"INSERT INTO {t} (run_id, attempt, token) VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE run_id = run_id"
        update = f"UPDATE {t} SET attempt = %s, token = %s, written_at = CURRENT_TIMESTAMP(3) WHERE run_id = %s"
    # The row exists (ours, or another attempt's, waited for while it is
    # being inserted); then it is locked and read as last committed.
    cursor.execute(insert, (fence.run_id, fence.attempt, fence.token))
    cursor.execute(f"SELECT attempt, token FROM {t} WHERE run_id = %s FOR UPDATE", (fence.run_id,))
    row = cursor.fetchone()
    seen_attempt, seen_token = (int(row[0]), int(row[1])) if row else (0, 0)
    if seen_attempt > fence.attempt or seen_token > fence.token:
        raise FenceRejected(fence, seen_attempt, seen_token)
    cursor.execute(update, (fence.attempt, fence.token, fence.run_id))
