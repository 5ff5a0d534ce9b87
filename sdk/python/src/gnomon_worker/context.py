"""What a handler is given: the attempt's identity, inputs, cancellation
flag and logger."""

from __future__ import annotations

import logging
import threading
import traceback
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Optional

from .fence import Fence

_LEVELS = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "CRITICAL",
}

#: Handler log lines are also passed to this logger (with the run and
#: attempt in front), so that they can be seen locally when logging is set up.
handler_logger = logging.getLogger("gnomon_worker.handler")


class AttemptLog:
    """A ``logging.Logger``-like object whose lines become the attempt's output.

    Each call appends one line, ``"<LEVEL> <message>\\n"``, to the attempt's
    output (the Report's tail and the live stream); ``%``-style arguments are
    formatted as the standard library does. Lines are also passed on to the
    ``gnomon_worker.handler`` logger. Logging only appends to memory: it never
    blocks on the network.
    """

    def __init__(self, sink: Callable[[str], None], prefix: str) -> None:
        self._sink = sink
        self._prefix = prefix

    def log(self, level: int, msg: object, *args: Any, exc_info: Any = None, **_: Any) -> None:
        """Logs ``msg % args`` at ``level`` (a ``logging`` level number)."""
        text = str(msg)
        if args:
            try:
                text = text % args
            except (TypeError, ValueError, KeyError):
                text = " ".join([text, *map(repr, args)])
        if exc_info:
            if isinstance(exc_info, BaseException):
                tb = "".join(traceback.format_exception(type(exc_info), exc_info, exc_info.__traceback__))
            else:
                tb = traceback.format_exc()
            if tb and tb != "NoneType: None\n":
                text = f"{text}\n{tb.rstrip()}"
        name = _LEVELS.get(level) or logging.getLevelName(level)
        self._sink(f"{name} {text}\n")
        if handler_logger.isEnabledFor(level):
            handler_logger.log(level, "%s %s", self._prefix, text)

    def debug(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Logs a DEBUG line."""
        self.log(logging.DEBUG, msg, *args, **kwargs)

    def info(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Logs an INFO line."""
        self.log(logging.INFO, msg, *args, **kwargs)

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Logs a WARNING line."""
        self.log(logging.WARNING, msg, *args, **kwargs)

    warn = warning

    def error(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Logs an ERROR line."""
        self.log(logging.ERROR, msg, *args, **kwargs)

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        """Logs an ERROR line followed by the traceback of the exception being handled."""
        self.log(logging.ERROR, msg, *args, exc_info=exc_info, **kwargs)

    def critical(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Logs a CRITICAL line."""
        self.log(logging.CRITICAL, msg, *args, **kwargs)

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 (the logging API's name)
        """Always true: every line is kept in the attempt's output."""
        return True


class Context:
    """The attempt a handler runs, as its only argument.

    Attributes:
        run_id: The run's id.
        attempt: The attempt number (1, 2, ...).
        job: The job's name.
        namespace: The job's namespace.
        worker_id: This worker's id.
        scheduled_at: When the run was due (an aware UTC datetime).
        scheduled_at_ms: The same, in milliseconds since the Unix epoch.
        params: The run's parameters (``{}`` when the job declares none).
        payload: The job's handler payload (a JSON value; None when absent).
        run_payload: The body of the webhook call that started the run, or None.
        shard: Reserved for sharded jobs; always None for now.
        token: The attempt's fencing token.
        cancelled: A ``threading.Event`` set when the attempt must stop
            (Cancel, Abort, timeout, self-fencing, drain). Coroutine handlers
            are also cancelled; plain functions must poll it.
        log: A logger whose lines become the attempt's output.
        fence: ``Fence(run_id, attempt, token)``, for fenced writes.
        idempotency_key: Stable across the attempts of a run: key side effects on it.
    """

    __slots__ = (
        "run_id", "attempt", "job", "namespace", "worker_id", "scheduled_at",
        "scheduled_at_ms", "params", "payload", "run_payload", "shard", "token",
        "cancelled", "log", "fence", "idempotency_key",
    )

    def __init__(
        self,
        *,
        run_id: str,
        attempt: int,
        job: str,
        namespace: str,
        worker_id: str,
        scheduled_at_ms: int,
        params: Dict[str, Any],
        payload: Any,
        run_payload: Optional[str],
        token: int,
        idempotency_key: str,
        cancelled: threading.Event,
        log: AttemptLog,
    ) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.job = job
        self.namespace = namespace
        self.worker_id = worker_id
        self.scheduled_at_ms = scheduled_at_ms
        self.scheduled_at = datetime.fromtimestamp(scheduled_at_ms / 1000, tz=timezone.utc)
        self.params = params
        self.payload = payload
        self.run_payload = run_payload
        self.shard: Optional[Any] = None
        self.token = token
        self.idempotency_key = idempotency_key
        self.cancelled = cancelled
        self.log = log
        self.fence = Fence(run_id, attempt, token)

    def __repr__(self) -> str:
        return f"Context(run_id={self.run_id!r}, attempt={self.attempt}, job={self.job!r}, token={self.token})"
