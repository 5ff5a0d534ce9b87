"""The drain: no new work, running attempts finish (or are stopped and
reported lost at the deadline), reports are acked, then run returns."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import gnomon_worker.runtime as runtime_mod
from gnomon_worker import Worker
from gnomon_worker._pb import worker_pb2 as pb

from helpers import Gate, SyncGate, rt
from peer import Peer, WAIT, assign, until


async def finished(w: Worker) -> None:
    await asyncio.wait_for(asyncio.shield(w._test_task), WAIT)  # type: ignore[attr-defined]


async def test_a_drain_lets_running_attempts_finish(peer: Peer, start_worker) -> None:
    gate = Gate()
    w = await start_worker(peer, {"h": gate})
    s = await peer.session()
    s.send(assign("r1"))
    await until(lambda: gate.order == ["r1"], "running")
    w.stop()
    hb = await s.next("heartbeat", lambda hb: hb.draining)
    assert [(a.run_id, a.attempt) for a in hb.attempts] == [("r1", 1)]
    assert not w._test_task.done()  # type: ignore[attr-defined]
    gate.release("r1")
    assert (await s.report("r1")).outcome == pb.OUTCOME_SUCCEEDED
    await finished(w)
    assert len(rt(w).spool) == 0


async def test_at_the_drain_deadline_what_is_left_is_stopped_and_reported_lost(peer: Peer, start_worker) -> None:
    gate, sync_gate = Gate(), SyncGate()
    w = await start_worker(peer, {"h": gate, "sync": sync_gate}, capacity=1, prefetch=1, drain_timeout=0.2)
    s = await peer.session()
    s.send(assign("r1"))
    s.send(assign("r2", handler="sync"))
    await until(lambda: len(rt(w).held) == 2, "held")
    w.stop()
    for run in ("r1", "r2"):
        r = await s.report(run)
        assert r.outcome == pb.OUTCOME_LOST and "drain timeout" in r.output
    assert gate.cancelled == ["r1"] and sync_gate.order == []
    await finished(w)


async def test_a_handler_that_ignores_its_cancellation_is_left_behind(peer: Peer, start_worker) -> None:
    sync_gate = SyncGate(poll=False)
    w = await start_worker(peer, {"sync": sync_gate}, drain_timeout=0.1)
    s = await peer.session()
    s.send(assign("r1", handler="sync"))
    await until(lambda: sync_gate.order == ["r1"], "running")
    w.stop()
    try:
        r = await s.report("r1")
        assert r.outcome == pb.OUTCOME_LOST and "did not stop" in r.output
        await finished(w)
    finally:
        sync_gate.released.set()


async def test_the_drain_waits_for_acks_only_so_long(peer: Peer, start_worker,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_mod, "ACK_WAIT", 0.3)
    peer.ack_reports = False
    gate = Gate()
    w = await start_worker(peer, {"h": gate}, drain_timeout=0.0)
    s = await peer.session()
    s.send(assign("r1"))
    await until(lambda: gate.order == ["r1"], "running")
    t0 = time.monotonic()
    w.stop()
    await s.report("r1")
    await finished(w)
    assert time.monotonic() - t0 >= 0.3
    assert ("r1", 1) in rt(w).spool, "unacked: kept for the next start"


async def test_stop_from_another_thread_and_before_running(peer: Peer, start_worker) -> None:
    w = await start_worker(peer, {"h": Gate()})
    await peer.session()
    t = threading.Thread(target=w.stop)
    t.start()
    t.join()
    await finished(w)

    early = Worker(servers=peer.address, worker_id="early")
    early.register("h", Gate())
    early.stop()
    await asyncio.wait_for(early.run_async(), WAIT)
    assert len(peer.hellos) == 1, "a worker stopped before it ran never connects"
    with pytest.raises(RuntimeError):
        await early.run_async()
