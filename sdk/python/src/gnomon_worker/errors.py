"""Exceptions a handler raises to steer what happens to its run."""

from __future__ import annotations

from typing import Optional


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
    ``max_attempts`` still bounds the attempts; the server caps the delay at
    24 hours). ``RetryAfter(0)`` leaves the job's own backoff in place.
    """

    def __init__(self, seconds: float, message: Optional[str] = None) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"RetryAfter seconds must be a number, got {seconds!r}")
        if not seconds >= 0:
            raise ValueError(f"RetryAfter seconds must be >= 0, got {seconds!r}")
        super().__init__(message if message else f"retry after {seconds:g} s")
        #: The delay asked for, in seconds.
        self.seconds: float = float(seconds)
        #: An optional explanation, written to the attempt's output.
        self.message: Optional[str] = message

    @property
    def retry_after_ms(self) -> int:
        """The delay in whole milliseconds, as the report carries it."""
        return int(round(self.seconds * 1000))
