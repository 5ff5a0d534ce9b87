"""A small pool of daemon threads for plain-function handlers.

Daemon threads, so that a handler that never returns (one that does not poll
``ctx.cancelled``) cannot keep the process alive after the worker has drained.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, List, Optional, Tuple

_Item = Tuple["Future[Any]", Callable[..., Any], Tuple[Any, ...]]


class ThreadPool:
    """At most ``size`` threads, started as needed, each running one call at a time."""

    def __init__(self, size: int, name: str = "gnomon-handler") -> None:
        self._size = size
        self._name = name
        self._lock = threading.Lock()
        self._queue: "queue.SimpleQueue[_Item]" = queue.SimpleQueue()
        self._threads: List[threading.Thread] = []
        self._idle = 0
        self._backlog = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> "Future[Any]":
        """Runs ``fn(*args)`` on a pool thread; returns its future."""
        fut: "Future[Any]" = Future()
        item: _Item = (fut, fn, args)
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                self._queue.put(item)
            elif len(self._threads) < self._size:
                t = threading.Thread(
                    target=self._run, args=(item,), name=f"{self._name}-{len(self._threads) + 1}", daemon=True
                )
                self._threads.append(t)
                t.start()
            else:
                self._backlog += 1
                self._queue.put(item)
        return fut

    def _run(self, item: Optional[_Item]) -> None:
        while item is not None:
            fut, fn, args = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001 (handed to the awaiting side)
                    fut.set_exception(e)
            del fut, fn, args, item
            with self._lock:
                if self._backlog > 0:
                    self._backlog -= 1
                else:
                    self._idle += 1
            item = self._queue.get()
