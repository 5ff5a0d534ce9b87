"""Self-fencing: the fence counts from heartbeat send times; a lapsed fence
stops everything (reported lost) and drops new assignments."""

from __future__ import annotations

import time

from gnomon_worker import Worker
from gnomon_worker._pb import worker_pb2 as pb
from gnomon_worker.runtime import Runtime

from helpers import Gate, SyncGate, rt
from peer import Peer, assign, until


def runtime(handlers=None, **opts) -> Runtime:
    w = Worker(servers="127.0.0.1:1", worker_id="w", **opts)
    return Runtime(w.config, handlers or {})


def ack(seq: int) -> pb.ServerMessage:
    return pb.ServerMessage(ack=pb.Ack(heartbeat_seq=seq))


def test_an_ack_counts_from_the_heartbeats_send_time() -> None:
    r = runtime()
    sent = time.monotonic() - 6
    r.lease_ttl = 10.0
    r.last_ack = sent - 1
    r.heartbeats_sent = {5: sent - 0.5, 7: sent, 8: sent + 1}
    r.handle(ack(7))
    assert r.last_ack == sent, "from when heartbeat 7 was sent, not when its ack arrived"
    assert r.heartbeats_sent == {8: sent + 1}, "send times up to the acked seq are dropped"
    assert not r.fence_lapsed(), "6 s < 0.7 x 10 s"
    r.last_ack = sent - 2
    assert r.fence_lapsed(), "8 s > 7 s"
    # An ack of a heartbeat it never sent (or already dropped) moves nothing.
    r.handle(ack(99))
    r.handle(ack(5))
    assert r.last_ack == sent - 2
    # An older heartbeat's ack never moves the fence back.
    r.heartbeats_sent = {3: sent - 5}
    r.last_ack = sent
    r.handle(ack(3))
    assert r.last_ack == sent


def test_the_fraction_is_configurable() -> None:
    r = runtime(self_fence_fraction=0.5)
    r.lease_ttl = 10.0
    r.last_ack = time.monotonic() - 6
    assert r.fence_lapsed()


async def test_a_lapsed_fence_drops_assignments_and_never_starts_queued_ones() -> None:
    gate = Gate()
    r = runtime({"h": gate}, capacity=1, prefetch=1)
    r.lease_ttl = 10.0
    r.last_ack = time.monotonic() - 8
    r.handle(assign("late", token=2))
    assert r.max_token == 2, "the token is still taken in"
    assert not r.held and len(r.spool) == 0, "dropped: not queued, not reported"

    # Fresh: r0 executes, r1 waits for the slot; the fence lapses before it frees.
    r.last_ack = time.monotonic()
    r.handle(assign("r0", token=2))
    r.handle(assign("r1", token=2))
    await until(lambda: gate.order == ["r0"], "r0 executing")
    r.last_ack = time.monotonic() - 8
    gate.release_all()
    await until(lambda: not r.held, "both ended")
    assert gate.order == ["r0"], "r1 never ran"
    assert r.spool.get(("r0", 1)).outcome == pb.OUTCOME_SUCCEEDED
    r1 = r.spool.get(("r1", 1))
    assert r1.outcome == pb.OUTCOME_LOST and "before it started" in r1.output


async def test_unacked_heartbeats_make_the_worker_stop_everything_and_report_lost(start_worker) -> None:
    peer = await Peer(lease_ttl_ms=500).start()
    try:
        gate, sync_gate = Gate(), SyncGate()
        w = await start_worker(peer, {"h": gate, "sync": sync_gate}, capacity=2, prefetch=1,
                               self_fence_fraction=0.5)
        s = await peer.session()
        for run, handler in (("a", "h"), ("b", "sync"), ("c", "h")):
            s.send(assign(run, handler=handler))
        await until(lambda: gate.order == ["a"] and sync_gate.order == ["b"] and len(rt(w).held) == 3, "held")
        s.ack_heartbeats = False
        for run in ("a", "b", "c"):
            r = await s.report(run)
            assert r.outcome == pb.OUTCOME_LOST, (run, r)
            assert "lost" in r.output
        assert gate.cancelled == ["a"] and sync_gate.saw_cancel == ["b"]
        assert "c" not in gate.order, "the queued one never ran"

        # While lapsed, an assignment is dropped: not run, not listed, not reported.
        s.send(assign("d", token=4))
        await until(lambda: rt(w).max_token == 4, "the assignment read")
        assert ("d", 1) not in rt(w).held
        hbs = await s.heartbeats_after(2)
        assert all(list(hb.attempts) == [] for hb in hbs)
        assert "d" not in [r.run_id for r in s.of("report")]

        # Acks again: work is taken again.
        s.ack_heartbeats = True
        await until(lambda: not rt(w).fence_lapsed(), "the fence restored")
        s.send(assign("e", token=4))
        gate.release("e")
        assert (await s.report("e")).outcome == pb.OUTCOME_SUCCEEDED
        assert "d" not in gate.order
    finally:
        await peer.stop()


async def test_the_lease_ttl_is_at_least_500ms_and_the_hello_restarts_the_fence(start_worker) -> None:
    peer = await Peer(lease_ttl_ms=10).start()
    try:
        w = await start_worker(peer, {"h": Gate()})
        await peer.session()
        assert rt(w).lease_ttl == 0.5
        assert not rt(w).fence_lapsed()
    finally:
        await peer.stop()


async def test_lost_attempts_are_left_out_of_the_next_hello(start_worker) -> None:
    peer = await Peer(lease_ttl_ms=500).start()
    try:
        sync_gate = SyncGate(poll=False)  # ignores ctx.cancelled: keeps running while lost
        w = await start_worker(peer, {"sync": sync_gate}, self_fence_fraction=0.5)
        s1 = await peer.session()
        s1.send(assign("a", handler="sync"))
        await until(lambda: sync_gate.order == ["a"], "running")
        s1.ack_heartbeats = False
        await until(lambda: rt(w).held.get(("a", 1)) is not None and rt(w).held[("a", 1)].lost, "marked lost")
        s1.end()
        s2 = await peer.session(2)
        assert list(s2.hello.running) == []
        hb = await s2.next("heartbeat")
        assert [(a.run_id, a.attempt) for a in hb.attempts] == [("a", 1)], "still held until it ends"
        sync_gate.released.set()
        r = await s2.report("a")
        assert r.outcome == pb.OUTCOME_LOST
    finally:
        await peer.stop()
