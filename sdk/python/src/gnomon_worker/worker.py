"""The public :class:`Worker`."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TypeVar, Union

from .config import Config, Tls, make_config
from .runtime import Runtime
from .session import run_sessions

log = logging.getLogger("gnomon_worker")

F = TypeVar("F", bound=Callable[..., Any])


class Worker:
    """A gnomon worker that runs ``handler`` jobs with registered Python functions.

    It keeps one session with the leader among ``servers``, runs at most
    ``capacity`` handlers at once (``prefetch`` more may wait in a FIFO
    queue), persists each result before sending it and keeps it until the
    leader acknowledges it, and stops its attempts by itself (reporting them
    lost) when its heartbeats go unacknowledged for ``self_fence_fraction`` of
    the lease. All options are keyword-only and validated here (ValueError).

    Args:
        servers: ``host:port`` of the gnomon servers (a list, or a
            comma-separated string), tried in turn; redirects to the leader
            are followed.
        worker_id: Stable id of this worker. Default: generated once and
            kept in ``spool_dir/worker-id`` when ``spool_dir`` is set, else
            ``py-<hostname>-<pid>``.
        capacity: Handlers run at once (1..4096).
        prefetch: Assignments accepted beyond ``capacity``, queued (0..65536).
        labels: Labels announced to the leader (jobs may select workers by them).
        token: Bearer token for servers that require one.
        tls: :class:`Tls` settings; None: plain (unencrypted) connections.
        spool_dir: Directory where unacknowledged reports are kept across
            restarts; None keeps them in memory only.
        drain_timeout: Seconds a drain waits for running handlers before it
            stops them and reports them lost.
        self_fence_fraction: Fraction of the lease TTL (strictly between 0
            and 1) after which unacknowledged heartbeats make the worker stop
            its attempts.
    """

    def __init__(
        self,
        *,
        servers: Union[str, Sequence[str]],
        worker_id: Optional[str] = None,
        capacity: int = 16,
        prefetch: int = 0,
        labels: Optional[Mapping[str, str]] = None,
        token: Optional[str] = None,
        tls: Optional[Tls] = None,
        spool_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
        drain_timeout: float = 30.0,
        self_fence_fraction: float = 0.7,
    ) -> None:
        self._config = make_config(
            servers=servers, worker_id=worker_id, capacity=capacity, prefetch=prefetch, labels=labels,
            token=token, tls=tls, spool_dir=spool_dir, drain_timeout=drain_timeout,
            self_fence_fraction=self_fence_fraction,
        )
        self._handlers: Dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop_event: Optional[asyncio.Event] = None
        self._stop_requested = False
        self._started = False
        self._runtime: Optional[Runtime] = None

    @property
    def config(self) -> Config:
        """The validated settings."""
        return self._config

    @property
    def worker_id(self) -> str:
        """This worker's id, as announced to the leader."""
        return self._config.worker_id

    @property
    def handlers(self) -> List[str]:
        """The registered handler names, sorted."""
        return sorted(self._handlers)

    def register(self, name: str, fn: Callable[..., Any]) -> None:
        """Registers ``fn`` as the handler for jobs whose executor is
        ``{"handler": {"name": name, ...}}``.

        ``fn(ctx)`` takes a :class:`~gnomon_worker.Context`. A coroutine
        function runs on the worker's event loop and is cancelled when the
        attempt must stop; a plain function runs in a thread of the worker's
        pool and must poll ``ctx.cancelled``. Its return value (a string, or
        anything JSON can encode) ends the attempt's output.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("a handler name must be a non-empty string")
        if not callable(fn):
            raise TypeError(f"handler {name!r} is not callable")
        with self._lock:
            if self._started:
                raise RuntimeError("handlers must be registered before the worker runs")
            if name in self._handlers:
                raise ValueError(f"a handler named {name!r} is already registered")
            self._handlers[name] = fn

    def handler(self, name: str) -> Callable[[F], F]:
        """A decorator that registers the function as the handler ``name``
        (see :meth:`register`)."""

        def register(fn: F) -> F:
            self.register(name, fn)
            return fn

        return register

    def stop(self) -> None:
        """Starts a drain; safe to call from any thread (or before the worker
        runs). The worker tells the leader it is draining, lets running
        handlers finish for up to ``drain_timeout``, stops and reports as lost
        what is left, waits (at most 5 s) for its reports to be acknowledged,
        and :meth:`run` returns."""
        with self._lock:
            self._stop_requested = True
            loop, event = self._loop, self._stop_event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:
                pass  # the loop has already closed: the worker is done

    async def run_async(self) -> None:
        """Runs the worker on the current event loop until a drain ends.

        Signals are left to the caller: call :meth:`stop` to drain."""
        with self._lock:
            if self._started:
                raise RuntimeError("a Worker runs only once")
            if not self._handlers:
                raise RuntimeError("register at least one handler before running the worker")
            self._started = True
            self._loop = asyncio.get_running_loop()
            self._stop_event = asyncio.Event()
            if self._stop_requested:
                self._stop_event.set()
        self._runtime = Runtime(self._config, self._handlers)
        log.info("worker %s starting: servers %s, capacity %d, handlers %s", self.worker_id,
                 ",".join(self._config.servers), self._config.capacity, ", ".join(self.handlers))
        try:
            await run_sessions(self._runtime, self._stop_event)
        finally:
            with self._lock:
                self._loop = None

    def run(self) -> None:
        """Runs the worker until it is stopped and drained; blocks.

        On the main thread, SIGTERM and SIGINT start a drain (a second one
        stops waiting for running handlers)."""
        asyncio.run(self._run_owned())

    async def _run_owned(self) -> None:
        loop = asyncio.get_running_loop()
        installed: List[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    signal.signal(sig, lambda s, _f: loop.call_soon_threadsafe(self._on_signal, s))
        try:
            await self.run_async()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._stop_event is not None and self._stop_event.is_set() and self._runtime is not None:
            log.warning("%s again: no longer waiting for running handlers", name)
            self._runtime.hurry_drain()
            return
        log.info("%s: draining", name)
        self.stop()
