"""The conformance worker: the standard handlers every gnomon SDK registers,
run by ``python -m gnomon_worker.conformance``.

Flags: ``--server HOST:PORT`` (repeatable or comma-separated), ``--id ID``,
``--capacity N`` (default 4), ``--prefetch N`` (0), ``--spool DIR``,
``--token T``, ``--label k=v`` (repeatable), ``--ca PEM``. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from .config import Tls
from .context import Context
from .errors import NonRetryable, RetryAfter
from .worker import Worker


def _payload(ctx: Context) -> Dict[str, Any]:
    return ctx.payload if isinstance(ctx.payload, dict) else {}


async def echo(ctx: Context) -> str:
    """Returns one line of JSON describing the attempt."""
    return json.dumps({
        "run_id": ctx.run_id,
        "attempt": ctx.attempt,
        "job": ctx.job,
        "namespace": ctx.namespace,
        "scheduled_at_ms": ctx.scheduled_at_ms,
        "params": ctx.params,
        "payload": ctx.payload,
        "run_payload": ctx.run_payload,
        "token": str(ctx.token),
        "idempotency_key": ctx.idempotency_key,
        "worker_id": ctx.worker_id,
    })


async def fail(ctx: Context) -> str:
    """Raises an ordinary error (retried per the job's policy)."""
    raise RuntimeError("boom")


def no_retry(ctx: Context) -> str:
    """Raises NonRetryable: the run fails without retries."""
    raise NonRetryable("bad input")


def retry_after(ctx: Context) -> str:
    """Asks for a later retry on attempt 1; succeeds after."""
    if ctx.attempt == 1:
        seconds = _payload(ctx).get("seconds") or 1
        raise RetryAfter(seconds)
    return "ok"


def sleep(ctx: Context) -> str:
    """Logs a tick every 100 ms for payload.seconds (60), until cancelled.
    A plain function: it polls ``ctx.cancelled``."""
    path = os.environ.get("GNOMON_CONFORMANCE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{ctx.run_id} {ctx.attempt} start\n")
    seconds = float(_payload(ctx).get("seconds", 60))
    ticks = int(round(seconds * 10))
    for n in range(1, ticks + 1):
        if ctx.cancelled.wait(0.1):
            break
        ctx.log.info("tick %d", n)
    return "slept"


async def log_lines(ctx: Context) -> str:
    """Logs payload.lines (1000) lines of payload.width (100) characters."""
    p = _payload(ctx)
    line = "x" * int(p.get("width", 100))
    for _ in range(int(p.get("lines", 1000))):
        ctx.log.info(line)
    return "logged"


def _note(line: str) -> None:
    path = os.environ.get("GNOMON_CONFORMANCE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _connect(dsn: str) -> Any:
    """A psycopg connection for ``postgres://``, a PyMySQL one for ``mysql://``."""
    from urllib.parse import unquote, urlsplit

    u = urlsplit(dsn)
    if u.scheme in ("postgres", "postgresql"):
        import psycopg

        return psycopg.connect(dsn)
    if u.scheme == "mysql":
        import pymysql

        return pymysql.connect(host=u.hostname or "127.0.0.1", port=u.port or 3306, user=unquote(u.username or "root"),
                               password=unquote(u.password or ""), database=u.path.lstrip("/"))
    raise NonRetryable(f"not a postgres:// or mysql:// URL: {dsn!r}")


def fenced_step(ctx: Context) -> str:
    """Pays once per run: inserts ``(run_id, attempt, amount)`` into
    ``payments`` of the database payload.dsn (``postgres://`` or
    ``mysql://``) in the exactly-once step ``payment`` (``begin_attempt``
    first, then ``run_step``), and returns the step's result as JSON.

    payload.pause (``before_guard``, ``in_tx``, ``after_commit``) makes
    attempt 1 note ``"<run> 1 <worker> paused <where>"`` and sleep
    payload.pause_seconds (3) there, not looking at ``ctx.cancelled`` -- a
    job that does not cooperate -- so that it can be frozen there.
    payload.lock_wait and payload.idle (seconds) go to the guard;
    payload.guarded false makes the same insert in a plain transaction.
    Notes ``"<run> <attempt> committed|recorded paid_by=<n>"``, or
    ``"<run> <attempt> failed: <error>"``, in GNOMON_CONFORMANCE_LOG."""
    import time

    from .fence import begin_attempt, run_step

    p = _payload(ctx)
    lock_wait, idle = float(p.get("lock_wait", 5)), float(p.get("idle", 10))
    amount = int(p.get("amount", 10))
    pause_at = p.get("pause") if ctx.attempt == 1 else None
    me = f"{ctx.run_id} {ctx.attempt}"

    def pause(where: str) -> None:
        if pause_at == where:
            _note(f"{me} {ctx.worker_id} paused {where}")
            time.sleep(float(p.get("pause_seconds", 3)))

    ran: List[bool] = []

    def pay(cur: Any) -> Dict[str, Any]:
        ran.append(True)
        cur.execute("INSERT INTO payments (run_id, attempt, amount) VALUES (%s, %s, %s)",
                    (ctx.run_id, ctx.attempt, amount))
        pause("in_tx")
        return {"paid_by": ctx.attempt, "amount": amount}

    try:
        conn = _connect(str(p.get("dsn", "")))
        try:
            if p.get("guarded", True):
                begin_attempt(conn, ctx.fence, lock_wait=lock_wait)
                pause("before_guard")
                result = run_step(conn, ctx.fence, "payment", pay, lock_wait=lock_wait, idle=idle)
            else:
                pause("before_guard")
                if hasattr(conn, "begin"):
                    conn.begin()
                with conn.cursor() as cur:
                    result = pay(cur)
                conn.commit()
            pause("after_commit")
        finally:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - ended by the server already
                pass
    except Exception as e:
        _note(f"{me} failed: {type(e).__name__}: {e}".replace("\n", " "))
        raise
    _note(f"{me} {'committed' if ran else 'recorded'} paid_by={result['paid_by']}")
    return json.dumps(result)


#: The standard handlers, by name.
HANDLERS = {
    "echo": echo,
    "fail": fail,
    "no_retry": no_retry,
    "retry_after": retry_after,
    "sleep": sleep,
    "log": log_lines,
    "fenced_step": fenced_step,
}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The conformance worker's command line."""
    p = argparse.ArgumentParser(prog="python -m gnomon_worker.conformance",
                                description="gnomon conformance worker (standard handlers)")
    p.add_argument("--server", action="append", required=True, metavar="HOST:PORT",
                   help="a gnomon server (repeatable, or comma-separated)")
    p.add_argument("--id", dest="worker_id", help="worker id")
    p.add_argument("--capacity", type=int, default=4)
    p.add_argument("--prefetch", type=int, default=0)
    p.add_argument("--spool", help="spool directory for unacknowledged reports")
    p.add_argument("--token", help="bearer token")
    p.add_argument("--label", action="append", default=[], metavar="K=V", help="a label (repeatable)")
    p.add_argument("--ca", help="PEM roots to trust (enables TLS)")
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> Worker:
    """A worker with the standard handlers, configured from ``args``."""
    labels: Dict[str, str] = {}
    for item in args.label:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ValueError(f"--label {item!r} is not k=v")
        labels[k] = v
    servers: List[str] = [s for arg in args.server for s in arg.split(",") if s.strip()]
    worker = Worker(
        servers=servers, worker_id=args.worker_id, capacity=args.capacity, prefetch=args.prefetch,
        labels=labels, token=args.token, tls=Tls(ca=args.ca) if args.ca else None, spool_dir=args.spool,
    )
    for name, fn in HANDLERS.items():
        worker.register(name, fn)
    return worker


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the conformance worker until SIGTERM/SIGINT and its drain."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Handler lines travel in the attempts' output; keep stderr for the worker's own log.
    logging.getLogger("gnomon_worker.handler").setLevel(logging.WARNING)
    args = parse_args(argv)
    try:
        worker = build(args)
    except ValueError as e:
        logging.getLogger("gnomon_worker").error("%s", e)
        return 2
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
