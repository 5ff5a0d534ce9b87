"""Bad input and bad endings never leave an attempt held, unreported or
blocking the queue: invalid RetryAfter delays, unreportable endings,
malformed assignments, oversized refusals, and stops that land before an
attempt's first step."""

from __future__ import annotations

import json
import time

import pytest

from gnomon_worker import Context, RetryAfter
from gnomon_worker._pb import worker_pb2 as pb
from gnomon_worker.attempts import Attempts, Ending
from gnomon_worker.live import MAX_OUTPUT_BYTES

from helpers import Gate, rt
from peer import Peer, abort, assign, cancel, until

DAY_MS = 86_400_000


def test_retry_after_needs_a_finite_non_negative_delay() -> None:
    for bad in (float("inf"), float("-inf"), float("nan"), -1, -0.5):
        with pytest.raises(ValueError, match="invalid RetryAfter delay"):
            RetryAfter(bad)
    for bad in ("3", None, True):
        with pytest.raises(TypeError, match="invalid RetryAfter delay"):
            RetryAfter(bad)  # type: ignore[arg-type]
    # Huge delays are capped at the leader's 24 hours.
    assert RetryAfter(1e300).retry_after_ms == DAY_MS
    assert RetryAfter(10 ** 400).retry_after_ms == DAY_MS
    assert RetryAfter(86_400.4).retry_after_ms == DAY_MS
    assert RetryAfter(2.5).retry_after_ms == 2500 and RetryAfter(0).retry_after_ms == 0
    e = RetryAfter(1)
    e.seconds = float("inf")
    with pytest.raises(ValueError, match="invalid RetryAfter delay"):
        e.retry_after_ms


async def test_bad_retry_after_delays_fail_the_attempt_and_the_queue_goes_on(peer: Peer, start_worker) -> None:
    def infinite(ctx: Context) -> None:
        raise RetryAfter(float("inf"))

    def changed(ctx: Context) -> None:
        e = RetryAfter(1)
        e.seconds = float("inf")  # past the constructor's check
        raise e

    def huge(ctx: Context) -> None:
        e = RetryAfter(1)
        e.seconds = 1e300
        raise e

    w = await start_worker(peer, {"infinite": infinite, "changed": changed, "huge": huge, "h": Gate()}, capacity=1)
    s = await peer.session()
    for run in ("infinite", "changed", "huge"):
        s.send(assign(run, handler=run))
    s.send(assign("next", handler="h"))
    for run in ("infinite", "changed"):
        r = await s.report(run)
        assert r.outcome == pb.OUTCOME_FAILED and r.retry_after_ms == 0, run
        assert "invalid RetryAfter delay" in r.output, (run, r.output)
    r = await s.report("huge")
    assert r.outcome == pb.OUTCOME_FAILED and r.retry_after_ms == DAY_MS
    await until(lambda: ("next", 1) in rt(w).held and rt(w).executing == 1, "the next attempt to run")
    assert [k for k in rt(w).held] == [("next", 1)]


async def test_an_ending_that_cannot_be_reported_is_reported_failed_and_frees_its_slot(
        peer: Peer, start_worker, monkeypatch: pytest.MonkeyPatch) -> None:
    real_call = Attempts._call

    async def call(self, held):  # type: ignore[no-untyped-def]
        if held.key[0] == "bad":
            return Ending(pb.OUTCOME_FAILED, "bad\n", retry_after_ms=2 ** 64)  # too big for the Report
        return await real_call(self, held)

    monkeypatch.setattr(Attempts, "_call", call)
    gate = Gate()
    w = await start_worker(peer, {"h": gate}, capacity=1)
    s = await peer.session()
    s.send(assign("bad"))
    s.send(assign("next"))
    r = await s.report("bad")
    assert r.outcome == pb.OUTCOME_FAILED and r.retry_after_ms == 0 and not r.no_retry
    assert r.output.startswith("bad\n") and "could not report this attempt's ending" in r.output
    gate.release("next")
    assert (await s.report("next")).outcome == pb.OUTCOME_SUCCEEDED
    assert not rt(w).held and rt(w).executing == 0


async def test_malformed_assignments_are_reported_failed(peer: Peer, start_worker) -> None:
    gate = Gate()
    gate.release_all()
    await start_worker(peer, {"h": gate})
    s = await peer.session()
    deep = "[" * 100_000 + "]" * 100_000
    s.send(assign("params", params_json=deep))
    s.send(assign("executor", executor_json='{"handler": {"name": "h", "payload": ' + deep + "}}"))
    s.send(assign("when", scheduled_at_ms=2 ** 62))
    s.send(assign("fine"))
    for run, words in [("params", "cannot read the run's params"), ("executor", "cannot read the executor spec"),
                       ("when", "cannot read the assignment")]:
        r = await s.report(run)
        assert r.outcome == pb.OUTCOME_FAILED, run
        assert words in r.output and len(r.output) < 1000, (run, r.output)
    assert (await s.report("fine")).outcome == pb.OUTCOME_SUCCEEDED


async def test_refusals_are_cut_to_the_output_limit(peer: Peer, start_worker) -> None:
    await start_worker(peer, {"h": Gate()})
    s = await peer.session()
    s.send(assign("name", handler="é" * 100_000))
    s.send(assign("kind", executor_json=json.dumps({"k" * 200_000: {}})))
    for run, end in [("name", "' on worker w1 (it has: h)"), ("kind", "k jobs (it runs only handler jobs)")]:
        r = await s.report(run)
        assert r.outcome == pb.OUTCOME_FAILED, run
        assert len(r.output.encode()) <= MAX_OUTPUT_BYTES, run
        assert r.output.startswith("[gnomon: ") and r.output.endswith(end), run
        assert "\ufffd" not in r.output, "cut at a character boundary"


@pytest.mark.parametrize("how", ["cancel", "abort", "fence_self", "fence_lapsed"])
async def test_a_stop_before_the_first_step_never_calls_the_handler(peer: Peer, start_worker, how: str) -> None:
    gate = Gate()
    w = await start_worker(peer, {"h": gate}, capacity=1)
    s = await peer.session()
    r = rt(w)
    # Both on the worker's loop, with no step in between: the attempt has its
    # slot and its task, which has not run yet.
    r.handle(assign("r1"))
    assert r.executing == 1 and r.held[("r1", 1)].task is not None
    if how == "cancel":
        r.handle(cancel("r1"))
    elif how == "abort":
        r.handle(abort("r1"))
    elif how == "fence_self":
        r.fence_self("test fence")
    else:
        r.last_ack = time.monotonic() - 3600
    await until(lambda: not r.held and r.executing == 0, "the attempt to end")
    assert gate.order == [], "the handler was never called"
    if how == "cancel":
        rep = await s.report("r1")
        assert rep.outcome == pb.OUTCOME_CANCELLED and rep.output == "cancelled before it started"
    elif how == "abort":
        await s.heartbeats_after(2)
        assert s.of("report") == [] and s.of("started") == []
    else:
        rep = await s.report("r1")
        assert rep.outcome == pb.OUTCOME_LOST and rep.output.startswith("lost before it started: ")
        await until(lambda: not r.fence_lapsed(), "a heartbeat acknowledged again")
    # Its slot is free again.
    s.send(assign("r2"))
    gate.release("r2")
    assert (await s.report("r2")).outcome == pb.OUTCOME_SUCCEEDED
    assert gate.order == ["r2"]
