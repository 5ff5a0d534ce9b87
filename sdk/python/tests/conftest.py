from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Union

import pytest

import gnomon_worker.session as session_mod
from gnomon_worker import Worker

from peer import Peer, until


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    p = await Peer().start()
    yield p
    await p.stop()


StartWorker = Callable[..., Awaitable[Worker]]


@pytest.fixture
async def start_worker() -> AsyncIterator[StartWorker]:
    """Starts workers (run_async as a task) on the test's loop; cancels them at the end."""
    tasks: List["asyncio.Task[None]"] = []

    async def start(target: Union[Peer, str, List[str]], handlers: Dict[str, Callable[..., Any]],
                    **opts: Any) -> Worker:
        servers = target.address if isinstance(target, Peer) else target
        opts.setdefault("worker_id", "w1")
        w = Worker(servers=servers, **opts)
        for name, fn in handlers.items():
            w.register(name, fn)
        task = asyncio.ensure_future(w.run_async())
        w._test_task = task  # type: ignore[attr-defined]
        tasks.append(task)
        await until(lambda: w._runtime is not None or task.done(), "the worker to start")
        return w

    yield start
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> List[float]:
    """Records the reconnect delays (and skips them, to keep the tests fast)."""
    seen: List[float] = []

    async def pause(delay: float, stop: Optional[object]) -> None:
        seen.append(delay)
        await asyncio.sleep(0)

    monkeypatch.setattr(session_mod, "pause", pause)
    return seen
