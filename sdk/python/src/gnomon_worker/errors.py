"""Exceptions a handler raises to steer what happens to its run."""

from __future__ import annotations

import math
from typing import Optional

#: The longest delay a RetryAfter asks for, in milliseconds (the leader's cap: 24 hours).
MAX_RETRY_AFTER_MS = 86_400_000


class NonRetryable(Exception):
    """Fails the attempt and its run now, whatever retries the job has left.

    Raise it for errors that no retry can fix (bad input, a missing record).
    The attempt is reported FAILED with ``no_retry`` set; ``message`` goes to
    the attempt's output.
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        #: Why the run must not be retried.
        self.message: str = message


class RetryAfter(Exception):
    """Fails the attempt and asks for the next one no sooner than ``seconds``.

    The attempt is reported FAILED with ``retry_after_ms = seconds × 1000``,
    which replaces the job's backoff for this retry (the job's
    ``max_attempts`` still bounds the attempts; the delay is capped at 24
    hours). ``RetryAfter(0)`` leaves the job's own backoff in place.
    ``seconds`` must be a finite number >= 0 (TypeError or ValueError
    otherwise; a handler that raises that instead fails its attempt as any
    other error does).
    """

    def __init__(self, seconds: float, message: Optional[str] = None) -> None:
        problem = _delay_problem(seconds)
        if problem:
            error = TypeError if problem == "a number" else ValueError
            raise error(f"invalid RetryAfter delay: seconds must be {problem}, got {seconds!r}")
        seconds = max(0.0, min(seconds, MAX_RETRY_AFTER_MS / 1000))
        super().__init__(message if message else f"retry after {seconds:g} s")
        #: The delay asked for, in seconds (at most 24 hours).
        self.seconds: float = float(seconds)
        #: An optional explanation, written to the attempt's output.
        self.message: Optional[str] = message

    @property
    def retry_after_ms(self) -> int:
        """The delay in whole milliseconds, as the report carries it (at most
        24 hours). ValueError when ``seconds`` was later set to an invalid value."""
        seconds = self.seconds
        problem = _delay_problem(seconds)
        if problem:
            raise ValueError(f"invalid RetryAfter delay: seconds must be {problem}, got {seconds!r}")
        if seconds >= MAX_RETRY_AFTER_MS / 1000:
            return MAX_RETRY_AFTER_MS
        return int(round(seconds * 1000))


def _delay_problem(seconds: object) -> str:
    """What is wrong with a RetryAfter delay ("" when nothing)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return "a number"
    if isinstance(seconds, float) and not math.isfinite(seconds):
        return "finite"
    if seconds < 0:
        return ">= 0"
    return ""
