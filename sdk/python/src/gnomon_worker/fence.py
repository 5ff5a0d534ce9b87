"""Exactly-once steps: database writes of a job that commit once per run,
whichever of its attempts gets there first, with the result recorded.

gnomon runs each attempt at least once. A worker frozen past its lease may
wake after its run was retried elsewhere and finish its attempt too; a
plain-function handler keeps running until it returns. A *step* closes
that gap in the job's own database: :func:`guard`, called first in the
transaction of the step's writes, looks up the step's record in a table
(``gnomon_steps``, one row per run and step) under a lock on the run's row
in ``gnomon_fence``:

- recorded already (by this attempt or any other, older or newer): the
  returned :class:`Step` is ``recorded``, with the recorded ``result`` --
  write nothing and use that result;
- not recorded, and a newer attempt of the run has started (raised the
  run's marker, see :func:`begin_attempt`): :class:`Superseded`;
- otherwise the step is this attempt's: it inserts the record, the caller
  writes, :meth:`Step.record` stores the result, and the commit makes both
  visible together. A racing attempt waits for the lock, then finds the
  record.

Example (psycopg 3; PyMySQL the same)::

    with psycopg.connect(dsn) as conn:
        result = run_step(conn, ctx.fence, "payment", lambda cur: pay(cur, ctx))

or by hand, in a transaction of your own::

    with psycopg.connect(dsn) as conn, conn.transaction(), conn.cursor() as cur:
        step = guard(cur, ctx.fence, "payment")      # first, in the same transaction
        if step.fresh:
            cur.execute("INSERT INTO payments (run_id, amount) VALUES (%s, 10)", (ctx.run_id,))
            step.record({"amount": 10})
        result = step.result

The guard bounds, for its transaction, how long a statement waits for a
lock (``lock_wait``; :class:`LockTimeout` then, which retries the attempt)
and how long the transaction may sit idle (``idle``): a frozen attempt
holding the step's lock is cut off by the database, its transaction rolls
back, and the retry proceeds while the frozen worker is still stopped.

What it cannot cover: effects outside the database transaction (an email,
an HTTP call, a write to another database) happen as often as the code
that makes them runs.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Generator, Mapping, Optional, Tuple, TypeVar, Union

from .errors import RetryAfter

#: The tables' prefix unless told otherwise: ``gnomon_fence`` and ``gnomon_steps``.
DEFAULT_PREFIX = "gnomon"
#: The step of a run that has one.
DEFAULT_STEP = "run"
#: The fence table's name before steps (kept: its rows stay valid).
DEFAULT_TABLE = "gnomon_fence"
#: How long a guarded statement waits for a lock, in seconds.
DEFAULT_LOCK_WAIT = 5.0
#: How long a guarded transaction may sit idle before the database ends it, in seconds.
DEFAULT_IDLE = 10.0

_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,56}$")
# The largest result a MySQL/MariaDB TEXT column holds, in bytes.
_MYSQL_TEXT = 65535

T = TypeVar("T")


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


class Superseded(Exception):
    """A newer attempt of the run has started, and the step has no record:
    this attempt may not commit it. Roll back (the guard's transaction)."""

    def __init__(self, fence: Fence, seen_attempt: int, seen_token: int, step: str = DEFAULT_STEP) -> None:
        super().__init__(
            f"attempt {fence.attempt} (token {fence.token}) of run {fence.run_id} is superseded: "
            f"attempt {seen_attempt} (token {seen_token}) has started, and step {step!r} has no record"
        )
        self.fence = fence
        self.seen_attempt = seen_attempt
        self.seen_token = seen_token
        self.step = step


#: The name :class:`Superseded` had before steps.
FenceRejected = Superseded


class NotInTransaction(Exception):
    """The guard was called outside a transaction: its check and the
    caller's writes would not commit together. Begin one first
    (psycopg ``conn.transaction()``, PyMySQL ``conn.begin()``), or use
    :func:`run_step`."""


class LockTimeout(RetryAfter):
    """A guarded statement waited longer than ``lock_wait`` for a lock
    (PostgreSQL SQLSTATE 55P03, MySQL/MariaDB error 1205): another attempt
    holds the step. Retryable: let it fail the attempt, and the run is
    retried per the job's retry policy (its backoff is kept)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


@dataclass
class Step:
    """The outcome of :func:`guard` for one step of one run."""

    #: The attempt asking.
    fence: Fence
    #: The step's name.
    name: str
    #: Whether the step was recorded before: write nothing, use ``result``.
    recorded: bool
    #: The recorded result (decoded JSON; None when none was recorded), or
    #: what :meth:`record` stored.
    result: Any
    #: The attempt that recorded the step (this one's when fresh).
    attempt: int
    #: The token of that attempt.
    token: int
    _cursor: Any = field(default=None, repr=False, compare=False)
    _sql: Any = field(default=None, repr=False, compare=False)

    @property
    def fresh(self) -> bool:
        """Whether the step is this attempt's to do (and :meth:`record`)."""
        return not self.recorded

    def record(self, result: Any) -> None:
        """Stores ``result`` (JSON-encoded) as the step's result, in the
        guard's transaction (it commits with the caller's writes).
        TypeError for a value JSON cannot encode; RuntimeError on a step
        recorded before this attempt."""
        _run(self._cursor, self._record_ops(result))

    def _record_ops(self, result: Any) -> "Generator[_Op, Any, None]":
        if self.recorded:
            raise RuntimeError(f"step {self.name!r} of run {self.fence.run_id} was recorded by attempt {self.attempt}: "
                               "use its result")
        text = _encode(self.name, result, self._sql.dialect)
        yield ("x", self._sql.record, (text, self.fence.run_id, self.name))
        self.result = json.loads(text)


class AsyncStep(Step):
    """A :class:`Step` of :func:`guard_async`: :meth:`record` is awaited."""

    async def record(self, result: Any) -> None:  # type: ignore[override]
        """As :meth:`Step.record`, on the async cursor."""
        await _run_async(self._cursor, self._record_ops(result))


def _encode(step: str, result: Any, dialect: str) -> str:
    try:
        text = json.dumps(result, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise TypeError(f"the result of step {step!r} cannot be recorded as JSON: {e}") from None
    if dialect == "mysql" and len(text.encode()) > _MYSQL_TEXT:
        raise ValueError(f"the result of step {step!r} is {len(text.encode())} bytes of JSON; "
                         f"MySQL/MariaDB keep at most {_MYSQL_TEXT}")
    return text


# ---------------------------------------------------------------------------
# The SQL, per database.


class _Sql:
    def __init__(self, dialect: str, prefix: str) -> None:
        self.dialect = dialect
        fence, steps = _tables(prefix)
        self.fence, self.steps = fence, steps
        if dialect == "postgres":
            self.create = [
                f"CREATE TABLE IF NOT EXISTS {fence} (run_id TEXT PRIMARY KEY, attempt BIGINT NOT NULL, "
                "token BIGINT NOT NULL, written_at TIMESTAMPTZ NOT NULL DEFAULT now())",
                f"CREATE TABLE IF NOT EXISTS {steps} (run_id TEXT NOT NULL, step TEXT NOT NULL, "
                "attempt BIGINT NOT NULL, token BIGINT NOT NULL, result TEXT, "
                "committed_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (run_id, step))",
            ]
            self.mark = f"INSERT INTO {fence} (run_id, attempt, token) VALUES (%s, %s, %s) ON CONFLICT (run_id) DO NOTHING"
            self.lock = f"SELECT attempt, token FROM {fence} WHERE run_id = %s FOR UPDATE"
        else:
            self.create = [
                f"CREATE TABLE IF NOT EXISTS {fence} (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL PRIMARY KEY, "
                "attempt BIGINT NOT NULL, token BIGINT NOT NULL, "
                "written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB",
                f"CREATE TABLE IF NOT EXISTS {steps} (run_id VARCHAR(255) CHARACTER SET ascii NOT NULL, "
                "step VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, "
                "attempt BIGINT NOT NULL, token BIGINT NOT NULL, result TEXT, "
                "committed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), "
                "PRIMARY KEY (run_id, step)) ENGINE=InnoDB",
            ]
            self.mark = f"INSERT IGNORE INTO {fence} (run_id, attempt, token) VALUES (%s, %s, %s)"
            self.lock = f"SELECT attempt, token FROM {fence} WHERE run_id = %s FOR UPDATE"
        self.read = f"SELECT attempt, token, result FROM {steps} WHERE run_id = %s AND step = %s FOR UPDATE"
        now = "now()" if dialect == "postgres" else "CURRENT_TIMESTAMP(3)"
        self.raise_ = f"UPDATE {fence} SET attempt = %s, token = %s, written_at = {now} WHERE run_id = %s"
        self.insert = f"INSERT INTO {steps} (run_id, step, attempt, token) VALUES (%s, %s, %s, %s)"
        self.record = f"UPDATE {steps} SET result = %s WHERE run_id = %s AND step = %s"


def _tables(prefix: str) -> Tuple[str, str]:
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise ValueError(f"the table prefix {prefix!r} is not a plain SQL name (letters, digits, _; at most 57)")
    return f"{prefix}_fence", f"{prefix}_steps"


def _prefix_of(table: Optional[str], prefix: str) -> str:
    """The prefix an old-style ``table=`` argument names (``<prefix>_fence``)."""
    if table is None:
        return prefix
    if not isinstance(table, str) or not table.endswith("_fence"):
        raise ValueError(f"the fence table {table!r} is not <prefix>_fence: pass prefix= instead")
    return table[: -len("_fence")]


def _dialect(obj: Any, dialect: Optional[str]) -> str:
    if dialect is not None:
        if dialect not in ("postgres", "mysql"):
            raise ValueError(f"dialect must be 'postgres' or 'mysql', not {dialect!r}")
        return dialect
    module = type(obj).__module__
    if module.startswith(("psycopg", "psycopg2")):
        return "postgres"
    if module.startswith(("pymysql", "MySQLdb", "mysql", "aiomysql")):
        return "mysql"
    raise ValueError(f"cannot tell the database of a {module} object: pass dialect='postgres' or 'mysql'")


def _step_name(step: str) -> str:
    if not isinstance(step, str) or not step or len(step) > 255:
        raise ValueError(f"a step is a name of 1 to 255 characters, not {step!r}")
    return step


def _seconds(what: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, not {value!r}")
    return float(value)


def _newer(a: int, t: int, fence: Fence) -> bool:
    """Whether (a, t) is newer than the fence: a later attempt, or the same with a higher token."""
    return a > fence.attempt or (a == fence.attempt and t > fence.token)


# ---------------------------------------------------------------------------
# The guard as a sequence of statements, run by a sync or an async driver.
# An op is ("x", sql, params) (execute) or ("q", sql, params) (execute and
# fetch one row, sent back); a database error comes back as an exception,
# LockTimeout for a lock wait.

_Op = Tuple[str, str, Tuple[Any, ...]]


def _bounds_ops(sql: _Sql, lock_wait: float, idle: Optional[float]) -> "Generator[_Op, Any, None]":
    if sql.dialect == "postgres":
        if idle is None:
            yield ("x", "SELECT set_config('lock_timeout', %s, true)", (f"{int(lock_wait * 1000)}ms",))
        else:
            yield ("x", "SELECT set_config('lock_timeout', %s, true), "
                        "set_config('idle_in_transaction_session_timeout', %s, true)",
                   (f"{int(lock_wait * 1000)}ms", f"{int(idle * 1000)}ms"))
        return
    lw = max(1, math.ceil(lock_wait))
    if idle is None:
        yield ("x", f"SET SESSION innodb_lock_wait_timeout = {lw}", ())
        return
    it = max(1, math.ceil(idle))
    try:
        # MariaDB: the transaction's idle time; MySQL has no such variable.
        yield ("x", f"SET SESSION innodb_lock_wait_timeout = {lw}, idle_transaction_timeout = {it}", ())
    except Exception as e:  # noqa: BLE001 - told apart below
        if _errno(e) != 1193:
            raise
        yield ("x", f"SET SESSION innodb_lock_wait_timeout = {lw}, wait_timeout = {it}", ())


def _lock_ops(sql: _Sql, fence: Fence) -> "Generator[_Op, Any, Tuple[int, int]]":
    yield ("x", sql.mark, (fence.run_id, fence.attempt, fence.token))
    row = yield ("q", sql.lock, (fence.run_id,))
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _guard_ops(sql: _Sql, fence: Fence, step: str, lock_wait: float, idle: float,
               make: Callable[..., Step]) -> "Generator[_Op, Any, Step]":
    yield from _bounds_ops(sql, lock_wait, idle)
    seen_attempt, seen_token = yield from _lock_ops(sql, fence)
    row = yield ("q", sql.read, (fence.run_id, step))
    if row is not None:
        result = None if row[2] is None else json.loads(row[2])
        return make(fence=fence, name=step, recorded=True, result=result, attempt=int(row[0]), token=int(row[1]))
    if _newer(seen_attempt, seen_token, fence):
        raise Superseded(fence, seen_attempt, seen_token, step)
    if (seen_attempt, seen_token) != (fence.attempt, fence.token):
        yield ("x", sql.raise_, (fence.attempt, fence.token, fence.run_id))
    yield ("x", sql.insert, (fence.run_id, step, fence.attempt, fence.token))
    return make(fence=fence, name=step, recorded=False, result=None, attempt=fence.attempt, token=fence.token)


def _begin_ops(sql: _Sql, fence: Fence, lock_wait: float) -> "Generator[_Op, Any, None]":
    yield from _bounds_ops(sql, lock_wait, None)
    seen_attempt, seen_token = yield from _lock_ops(sql, fence)
    if _newer(seen_attempt, seen_token, fence):
        raise Superseded(fence, seen_attempt, seen_token, "")
    if (seen_attempt, seen_token) != (fence.attempt, fence.token):
        yield ("x", sql.raise_, (fence.attempt, fence.token, fence.run_id))


def _restore_ops(sql: _Sql) -> "Generator[_Op, Any, None]":
    """Puts back the session settings the guard changed (MySQL/MariaDB;
    PostgreSQL's end with the transaction)."""
    if sql.dialect != "mysql":
        return
    try:
        yield ("x", "SET SESSION innodb_lock_wait_timeout = DEFAULT, idle_transaction_timeout = DEFAULT", ())
    except Exception as e:  # noqa: BLE001 - told apart below
        if _errno(e) != 1193:
            raise
        yield ("x", "SET SESSION innodb_lock_wait_timeout = DEFAULT, wait_timeout = DEFAULT", ())


def _errno(e: BaseException) -> Optional[int]:
    args = getattr(e, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _is_lock_timeout(e: BaseException) -> bool:
    state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
    return state == "55P03" or _errno(e) == 1205


def _mapped(e: BaseException) -> BaseException:
    if isinstance(e, LockTimeout) or not _is_lock_timeout(e):
        return e
    out = LockTimeout(f"waited too long for a lock held by another transaction (another attempt holds the step): {e}")
    out.__cause__ = e
    return out


def _run(cursor: Any, ops: "Generator[_Op, Any, T]") -> T:
    value: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            op = ops.throw(error) if error is not None else ops.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        kind, sql, params = op
        try:
            cursor.execute(sql, params)
            if kind == "q":
                value = cursor.fetchone()
        except Exception as e:  # noqa: BLE001 - handed to the ops
            error = _mapped(e)


async def _run_async(cursor: Any, ops: "Generator[_Op, Any, T]") -> T:
    value: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            op = ops.throw(error) if error is not None else ops.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        kind, sql, params = op
        try:
            await cursor.execute(sql, params)
            if kind == "q":
                value = await cursor.fetchone()
        except Exception as e:  # noqa: BLE001 - handed to the ops
            error = _mapped(e)


# ---------------------------------------------------------------------------
# Transactions: telling whether one is open, per driver.

_OUTSIDE = ("the guard needs the transaction of the step's writes, and this connection has none "
            "(autocommit): begin one first (psycopg conn.transaction(), PyMySQL conn.begin()), "
            "or use run_step")


def _pg_status(conn: Any) -> Optional[Tuple[bool, int]]:
    """(autocommit, transaction status: 0 idle, 1 active, 2 in a transaction,
    3 in a failed one) of a psycopg 3 or psycopg2 connection."""
    info = getattr(conn, "info", None)
    status = getattr(info, "transaction_status", None)
    if status is None and hasattr(conn, "get_transaction_status"):
        status = conn.get_transaction_status()
    if status is None:
        return None
    return bool(getattr(conn, "autocommit", False)), int(status)


def _check_sync(cursor: Any, dialect: str) -> None:
    conn = getattr(cursor, "connection", None)
    if dialect == "postgres":
        st = _pg_status(conn)
        if st is not None:
            # Without autocommit the guard's first statement begins the
            # transaction the caller commits.
            if st[0] and st[1] == 0:
                raise NotInTransaction(_OUTSIDE)
            return
        try:
            cursor.execute("SAVEPOINT gnomon_guard_check")
            cursor.execute("RELEASE SAVEPOINT gnomon_guard_check")
        except Exception as e:  # noqa: BLE001 - 25P01 is the answer
            if (getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)) == "25P01":
                raise NotInTransaction(_OUTSIDE) from None
            raise
        return
    if hasattr(conn, "server_status"):
        # PyMySQL keeps the server's status flags of the last answer:
        # 1 in a transaction, 2 autocommit.
        cursor.execute("DO 0")
        status = int(conn.server_status)
        if status & 2 and not status & 1:
            raise NotInTransaction(_OUTSIDE)
        return
    cursor.execute("SELECT @@autocommit")
    if int(cursor.fetchone()[0]) == 1:
        try:
            cursor.execute("SELECT @@in_transaction")  # MariaDB
            inside = int(cursor.fetchone()[0]) == 1
        except Exception:  # noqa: BLE001 - MySQL cannot tell
            inside = False
        if not inside:
            raise NotInTransaction(_OUTSIDE)


async def _check_async(cursor: Any, dialect: str) -> None:
    conn = getattr(cursor, "connection", None)
    if dialect == "postgres":
        st = _pg_status(conn)
        if st is not None:
            if st[0] and st[1] == 0:
                raise NotInTransaction(_OUTSIDE)
            return
        try:
            await cursor.execute("SAVEPOINT gnomon_guard_check")
            await cursor.execute("RELEASE SAVEPOINT gnomon_guard_check")
        except Exception as e:  # noqa: BLE001 - 25P01 is the answer
            if getattr(e, "sqlstate", None) == "25P01":
                raise NotInTransaction(_OUTSIDE) from None
            raise
        return
    await cursor.execute("SELECT @@autocommit")
    if int((await cursor.fetchone())[0]) == 1:
        try:
            await cursor.execute("SELECT @@in_transaction")
            inside = int((await cursor.fetchone())[0]) == 1
        except Exception:  # noqa: BLE001 - MySQL cannot tell
            inside = False
        if not inside:
            raise NotInTransaction(_OUTSIDE)


def _outside_required(conn: Any, dialect: str, what: str) -> None:
    """Refuses a connection already in a transaction: ``what`` commits on its own."""
    inside = False
    if dialect == "postgres":
        st = _pg_status(conn)
        inside = st is not None and st[1] != 0
    elif hasattr(conn, "server_status"):
        inside = bool(int(conn.server_status) & 1)
    if inside:
        raise RuntimeError(f"{what} commits its own transaction: call it outside the connection's open transaction")


# ---------------------------------------------------------------------------
# The API.


def create_tables(conn: Any, prefix: str = DEFAULT_PREFIX, dialect: Optional[str] = None) -> None:
    """Creates ``<prefix>_fence`` and ``<prefix>_steps`` if they are missing
    (an existing fence table of the SDK's earlier versions is kept as it
    is: its rows stay valid markers). ``conn`` is a connection (committed
    here) or a cursor (the caller commits)."""
    if hasattr(conn, "cursor") and not hasattr(conn, "fetchone"):
        sql = _Sql(_dialect(conn, dialect), prefix)
        with conn.cursor() as cur:
            for statement in sql.create:
                cur.execute(statement)
        conn.commit()
        return
    sql = _Sql(_dialect(conn, dialect), prefix)
    for statement in sql.create:
        conn.execute(statement)


def create_table(cursor: Any, dialect: Optional[str] = None, table: str = DEFAULT_TABLE) -> None:
    """The earlier name of :func:`create_tables` (``table`` is ``<prefix>_fence``)."""
    create_tables(cursor, _prefix_of(table, DEFAULT_PREFIX), dialect)


def guard(cursor: Any, fence: Fence, step: str = DEFAULT_STEP, *, lock_wait: float = DEFAULT_LOCK_WAIT,
          idle: float = DEFAULT_IDLE, prefix: str = DEFAULT_PREFIX, dialect: Optional[str] = None,
          table: Optional[str] = None) -> Step:
    """Claims or reads step ``step`` of the fence's run, inside the cursor's
    transaction (a psycopg or PyMySQL cursor; the caller commits).

    Returns a :class:`Step`: ``recorded`` (write nothing; use its
    ``result``), or fresh (write, :meth:`Step.record` the result, commit).
    Raises :class:`NotInTransaction` outside a transaction,
    :class:`Superseded` when the step has no record and a newer attempt
    has started, :class:`LockTimeout` after ``lock_wait`` seconds waiting
    for the run's lock. Until the transaction ends it holds the run's
    lock, statements wait at most ``lock_wait`` for locks, and the
    database ends the transaction when it is idle for ``idle`` seconds
    (on MySQL/MariaDB these stay set on the session; :func:`run_step`
    puts them back).
    """
    d = _dialect(cursor, dialect)
    sql = _Sql(d, _prefix_of(table, prefix))
    step, lock_wait, idle = _step_name(step), _seconds("lock_wait", lock_wait), _seconds("idle", idle)
    _check_sync(cursor, d)

    def make(**kw: Any) -> Step:
        return Step(_cursor=cursor, _sql=sql, **kw)

    return _run(cursor, _guard_ops(sql, fence, step, lock_wait, idle, make))


def begin_attempt(conn: Any, fence: Fence, *, lock_wait: float = DEFAULT_LOCK_WAIT, prefix: str = DEFAULT_PREFIX,
                  dialect: Optional[str] = None) -> None:
    """Marks the fence's attempt as the newest of its run that has started,
    in a short transaction of its own (committed here; ``conn`` must not be
    in one). From then on an older attempt may not commit a step that has
    no record (:class:`Superseded`). Raises :class:`Superseded` when a
    newer attempt is marked already."""
    d = _dialect(conn, dialect)
    sql = _Sql(d, prefix)
    lock_wait = _seconds("lock_wait", lock_wait)
    _outside_required(conn, d, "begin_attempt")
    _in_transaction(conn, d, lambda cur: _run(cur, _begin_ops(sql, fence, lock_wait)), sql)


def run_step(conn: Any, fence: Fence, step: str, fn: Callable[[Any], T], *, lock_wait: float = DEFAULT_LOCK_WAIT,
             idle: float = DEFAULT_IDLE, prefix: str = DEFAULT_PREFIX, dialect: Optional[str] = None) -> Any:
    """Runs step ``step`` exactly once per run: begins a transaction on
    ``conn`` (psycopg or PyMySQL; not already in one), guards it, calls
    ``fn(cursor)`` only when the step has no record, records what it
    returns, commits, and returns the result -- ``fn``'s, or the one
    recorded before (by whichever attempt committed first).

    Raises what :func:`guard` raises (the transaction rolled back), and
    what ``fn`` raises (rolled back too)."""
    d = _dialect(conn, dialect)
    sql = _Sql(d, prefix)
    step, lock_wait, idle = _step_name(step), _seconds("lock_wait", lock_wait), _seconds("idle", idle)
    _outside_required(conn, d, "run_step")

    def body(cur: Any) -> Any:
        s = guard(cur, fence, step, lock_wait=lock_wait, idle=idle, prefix=prefix, dialect=d)
        if s.recorded:
            return s.result
        result = fn(cur)
        s.record(result)
        return s.result

    return _in_transaction(conn, d, body, sql)


def _in_transaction(conn: Any, dialect: str, body: Callable[[Any], T], sql: _Sql) -> T:
    try:
        if dialect == "postgres" and hasattr(conn, "transaction"):
            with conn.transaction(), conn.cursor() as cur:
                return body(cur)
        if hasattr(conn, "begin"):
            conn.begin()
        cur = conn.cursor()
        try:
            out = body(cur)
            conn.commit()
            return out
        except BaseException:
            try:
                conn.rollback()
            except Exception:  # noqa: BLE001 - the first error is the one to see
                pass
            raise
        finally:
            if dialect == "mysql":
                try:
                    _run(cur, _restore_ops(sql))
                except Exception:  # noqa: BLE001 - best effort: the connection may be gone
                    pass
            cur.close()
    except Exception as e:  # noqa: BLE001 - a lock wait in the caller's statements too
        mapped = _mapped(e)
        if mapped is e:
            raise
        raise mapped from e


# ---------------------------------------------------------------------------
# psycopg 3's async connections.


async def create_tables_async(conn: Any, prefix: str = DEFAULT_PREFIX, dialect: Optional[str] = None) -> None:
    """:func:`create_tables` on a psycopg ``AsyncConnection`` (committed here)."""
    sql = _Sql(_dialect(conn, dialect), prefix)
    async with conn.transaction():
        async with conn.cursor() as cur:
            for statement in sql.create:
                await cur.execute(statement)


async def guard_async(cursor: Any, fence: Fence, step: str = DEFAULT_STEP, *, lock_wait: float = DEFAULT_LOCK_WAIT,
                      idle: float = DEFAULT_IDLE, prefix: str = DEFAULT_PREFIX,
                      dialect: Optional[str] = None) -> AsyncStep:
    """:func:`guard` on an async cursor (psycopg ``AsyncCursor``); the
    returned step's :meth:`AsyncStep.record` is awaited."""
    d = _dialect(cursor, dialect)
    sql = _Sql(d, prefix)
    step, lock_wait, idle = _step_name(step), _seconds("lock_wait", lock_wait), _seconds("idle", idle)
    await _check_async(cursor, d)

    def make(**kw: Any) -> AsyncStep:
        return AsyncStep(_cursor=cursor, _sql=sql, **kw)

    out = await _run_async(cursor, _guard_ops(sql, fence, step, lock_wait, idle, make))
    assert isinstance(out, AsyncStep)
    return out


async def begin_attempt_async(conn: Any, fence: Fence, *, lock_wait: float = DEFAULT_LOCK_WAIT,
                              prefix: str = DEFAULT_PREFIX, dialect: Optional[str] = None) -> None:
    """:func:`begin_attempt` on a psycopg ``AsyncConnection``."""
    d = _dialect(conn, dialect)
    sql = _Sql(d, prefix)
    lock_wait = _seconds("lock_wait", lock_wait)
    _outside_required(conn, d, "begin_attempt_async")
    async with conn.transaction():
        async with conn.cursor() as cur:
            await _run_async(cur, _begin_ops(sql, fence, lock_wait))


async def run_step_async(conn: Any, fence: Fence, step: str, fn: Callable[[Any], Union[T, Awaitable[T]]], *,
                         lock_wait: float = DEFAULT_LOCK_WAIT, idle: float = DEFAULT_IDLE,
                         prefix: str = DEFAULT_PREFIX, dialect: Optional[str] = None) -> Any:
    """:func:`run_step` on a psycopg ``AsyncConnection``; ``fn(cursor)`` may
    be a coroutine function."""
    d = _dialect(conn, dialect)
    step, lock_wait, idle = _step_name(step), _seconds("lock_wait", lock_wait), _seconds("idle", idle)
    _outside_required(conn, d, "run_step_async")
    try:
        async with conn.transaction():
            async with conn.cursor() as cur:
                s = await guard_async(cur, fence, step, lock_wait=lock_wait, idle=idle, prefix=prefix, dialect=d)
                if s.recorded:
                    return s.result
                result = fn(cur)
                if isinstance(result, Awaitable):
                    result = await result
                await s.record(result)
                return s.result
    except Exception as e:  # noqa: BLE001 - a lock wait in the caller's statements too
        mapped = _mapped(e)
        if mapped is e:
            raise
        raise mapped from e
