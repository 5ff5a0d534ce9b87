"""Handlers and accessors shared by the tests."""

from __future__ import annotations

import asyncio
import threading
from typing import Dict, List

from gnomon_worker import Context, Worker
from gnomon_worker.runtime import Runtime


def rt(worker: Worker) -> Runtime:
    """The worker's runtime (its protocol state)."""
    assert worker._runtime is not None
    return worker._runtime


class Gate:
    """Async handlers that block until released, recording what ran and the
    most that ran at once."""

    def __init__(self) -> None:
        self.order: List[str] = []
        self.now = 0
        self.peak = 0
        self.contexts: Dict[str, Context] = {}
        self.cancelled: List[str] = []
        self._events: Dict[str, asyncio.Event] = {}
        self._all = False

    def _event(self, run: str) -> asyncio.Event:
        if run not in self._events:
            self._events[run] = asyncio.Event()
            if self._all:
                self._events[run].set()
        return self._events[run]

    def release(self, run: str) -> None:
        self._event(run).set()

    def release_all(self) -> None:
        self._all = True
        for e in self._events.values():
            e.set()

    async def __call__(self, ctx: Context) -> str:
        self.order.append(ctx.run_id)
        self.contexts[ctx.run_id] = ctx
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await self._event(ctx.run_id).wait()
        except asyncio.CancelledError:
            self.cancelled.append(ctx.run_id)
            raise
        finally:
            self.now -= 1
        return f"done {ctx.run_id}"


class SyncGate:
    """Plain-function handlers that block (in their thread) until released or
    cancelled (they poll ctx.cancelled)."""

    def __init__(self, poll: bool = True) -> None:
        self.poll = poll
        self.order: List[str] = []
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.released = threading.Event()
        self.saw_cancel: List[str] = []

    def __call__(self, ctx: Context) -> str:
        with self.lock:
            self.order.append(ctx.run_id)
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            while not self.released.wait(0.005):
                if self.poll and ctx.cancelled.is_set():
                    self.saw_cancel.append(ctx.run_id)
                    return "stopped"
            return "released"
        finally:
            with self.lock:
                self.now -= 1
