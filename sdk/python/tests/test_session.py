"""The session: Hello, Welcome, heartbeats, redirects, refusals and backoff."""

from __future__ import annotations

import logging
from typing import List

import grpc
import pytest

from gnomon_worker._pb import worker_pb2 as pb

from helpers import Gate, rt
from peer import Peer, assign, until


async def noop(ctx):
    return None


async def test_hello_says_who_the_worker_is(peer: Peer, start_worker) -> None:
    await start_worker(peer, {"zeta": noop, "alpha": noop, "mid": noop}, worker_id="resizer-1", capacity=8,
                       prefetch=3, labels={"lang": "python", "zone": "a"}, token="s3cret")
    s = await peer.session()
    h = s.hello
    assert h.worker_id == "resizer-1"
    assert dict(h.labels) == {"lang": "python", "zone": "a"}
    assert h.capacity == 8
    assert list(h.executors) == ["handler"]
    assert list(h.handlers) == ["alpha", "mid", "zeta"]
    assert list(h.running) == []
    assert h.protocol_version == 1
    assert h.prefetch == 3
    assert s.metadata.get("authorization") == "Bearer s3cret"


async def test_no_token_sends_no_authorization(peer: Peer, start_worker) -> None:
    await start_worker(peer, {"h": noop})
    s = await peer.session()
    assert "authorization" not in s.metadata


async def test_heartbeats_count_up_and_describe_what_is_held(peer: Peer, start_worker) -> None:
    gate = Gate()
    w = await start_worker(peer, {"h": gate}, capacity=1, prefetch=1)
    s = await peer.session()
    first = await s.next("heartbeat")
    assert first.seq == 1 and first.running == 0 and first.queued == 0 and first.load == 0.0
    assert not first.draining and list(first.attempts) == []
    s.send(assign("r0"))
    s.send(assign("r1"))
    await until(lambda: gate.order == ["r0"] and len(rt(w).held) == 2, "r0 executing, r1 queued")
    hb = (await s.heartbeats_after(1))[0]
    assert hb.running == 1 and hb.queued == 1 and hb.load == 1.0
    assert [(a.run_id, a.attempt) for a in hb.attempts] == [("r0", 1), ("r1", 1)]
    seqs = [h.seq for h in s.of("heartbeat")]
    assert seqs == list(range(1, len(seqs) + 1))
    gate.release_all()
    await s.report("r1")


async def test_hello_lists_held_attempts_after_a_reconnect(peer: Peer, start_worker) -> None:
    gate = Gate()
    await start_worker(peer, {"h": gate})
    s1 = await peer.session()
    s1.send(assign("r0", attempt=2))
    await until(lambda: gate.order == ["r0"], "r0 running")
    s1.end()
    s2 = await peer.session(2)
    assert [(a.run_id, a.attempt) for a in s2.hello.running] == [("r0", 2)]
    gate.release_all()
    r = await s2.report("r0", 2)
    assert r.outcome == pb.OUTCOME_SUCCEEDED


async def test_superseded_attempts_stop_without_a_report(peer: Peer, start_worker) -> None:
    gate = Gate()
    w = await start_worker(peer, {"h": gate})
    s1 = await peer.session()
    s1.send(assign("r0"))
    await until(lambda: gate.order == ["r0"], "r0 running")
    peer.script.append(("welcome", {"superseded": [("r0", 1)]}))
    s1.end()
    s2 = await peer.session(2)
    await until(lambda: gate.cancelled == ["r0"], "r0 stopped")
    await until(lambda: not rt(w).held, "r0 forgotten")
    await s2.heartbeats_after(2)
    assert s2.of("report") == [] and s1.of("report") == []


async def test_welcome_token_makes_older_assignments_stale(peer: Peer, start_worker) -> None:
    gate = Gate()
    peer.leader_token = 5
    w = await start_worker(peer, {"h": gate})
    s = await peer.session()
    await until(lambda: rt(w).max_token == 5, "the Welcome taken in")
    s.send(assign("old", token=4))
    s.send(assign("new", token=5))
    await until(lambda: gate.order == ["new"], "the current assignment running")
    assert "old" not in gate.order and ("old", 1) not in rt(w).held


async def test_not_leader_redirect_is_followed_at_once(start_worker) -> None:
    a, b = await Peer().start(), await Peer().start()
    try:
        a.script.append(("not_leader", b.address))
        await start_worker(a, {"h": noop})
        s = await b.session()
        assert s.hello.worker_id == "w1"
        assert len(a.hellos) == 1 and len(b.hellos) == 1
        assert b.hellos[0][0] >= a.hellos[0][0]
    finally:
        await a.stop()
        await b.stop()


def assert_backoff(delays: List[float], expected: List[float]) -> None:
    assert len(delays) >= len(expected), delays
    for d, e in zip(delays, expected):
        assert e * 0.85 <= d <= e * 1.15, (delays, expected)


async def test_not_leader_without_an_address_backs_off(peer: Peer, start_worker, pauses: List[float]) -> None:
    for _ in range(3):
        peer.script.append(("not_leader", ""))
    await start_worker(peer, {"h": noop})
    await peer.session()
    assert len(peer.hellos) == 4
    assert_backoff(pauses, [0.1, 0.2, 0.4])


@pytest.mark.parametrize("code", [
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
])
async def test_refusals_are_logged_as_errors_and_backed_off(
    peer: Peer, start_worker, pauses: List[float], caplog: pytest.LogCaptureFixture, code: grpc.StatusCode
) -> None:
    caplog.set_level(logging.WARNING, logger="gnomon_worker")
    for _ in range(5):
        peer.script.append(("refuse", code, "go away: reason 42"))
    await start_worker(peer, {"h": noop})
    await peer.session()
    assert_backoff(pauses, [0.1, 0.2, 0.4, 0.8, 1.6])
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "refused" in r.getMessage()]
    assert len(errors) == 5
    assert "go away: reason 42" in errors[0].getMessage() and code.name in errors[0].getMessage()


async def test_backoff_is_capped_and_resets_after_a_welcome(
    peer: Peer, start_worker, pauses: List[float], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gnomon_worker")
    for _ in range(7):
        peer.script.append(("refuse", grpc.StatusCode.UNAVAILABLE, "busy"))
    await start_worker(peer, {"h": noop})
    s = await peer.session()
    assert_backoff(pauses, [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    # A transient status is a loss, not a refusal.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    s.end()
    await peer.session(2)
    assert_backoff(pauses[7:], [0.1])


async def test_an_unreachable_server_is_skipped_for_the_next(peer: Peer, start_worker, pauses) -> None:
    dead = await Peer().start()
    await dead.stop()
    await start_worker([dead.address, peer.address], {"h": noop})
    await peer.session()
    assert_backoff(pauses, [0.1])


async def test_reconnects_after_the_server_ends_the_session(peer: Peer, start_worker) -> None:
    await start_worker(peer, {"h": noop})
    s1 = await peer.session()
    s1.end(grpc.StatusCode.UNAVAILABLE, "leader stepped down")
    s2 = await peer.session(2)
    hb = await s2.next("heartbeat")
    assert hb.seq == 1, "sequences start again in each session"
