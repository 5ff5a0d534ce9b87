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
from .fence import FenceRejected, guard
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


def fenced_write(ctx: Context) -> str:
    """Sleeps payload.seconds (3) without looking at ``ctx.cancelled`` -- as
    a job that does not cooperate -- then inserts ``(run_id, attempt)`` into
    payload.table of the PostgreSQL database payload.dsn, through the
    fenced-write guard when payload.fenced. Notes ``"<run> <attempt> write
    committed|refused"`` in GNOMON_CONFORMANCE_LOG."""
    import time

    import psycopg

    p = _payload(ctx)
    table = str(p.get("table", ""))
    if not table.isidentifier():
        raise NonRetryable(f"not a table name: {table!r}")
    time.sleep(float(p.get("seconds", 3)))
    try:
        with psycopg.connect(str(p["dsn"])) as conn, conn.transaction(), conn.cursor() as cur:
            if p.get("fenced"):
                guard(cur, ctx.fence)
            cur.execute(f"INSERT INTO {table} (run_id, attempt) VALUES (%s, %s)", (ctx.run_id, ctx.attempt))
    except FenceRejected as e:
        _note(f"{ctx.run_id} {ctx.attempt} write refused")
        raise NonRetryable(str(e)) from e
    _note(f"{ctx.run_id} {ctx.attempt} write committed")
    return "written"


#: The standard handlers, by name.
HANDLERS = {
    "echo": echo,
    "fail": fail,
    "no_retry": no_retry,
    "retry_after": retry_after,
    "sleep": sleep,
    "log": log_lines,
    "fenced_write": fenced_write,
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
