"""Running attempts: outcomes, capacity and the queue, cancel, abort,
timeouts, tokens and duplicates."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import datetime, timezone

import gnomon_worker.attempts as attempts_mod
from gnomon_worker import Context, Fence, NonRetryable, RetryAfter
from gnomon_worker._pb import worker_pb2 as pb

from helpers import Gate, SyncGate, rt
from peer import Peer, abort, assign, cancel, until


async def test_success_reports_log_lines_then_the_return_value(peer: Peer, start_worker, monkeypatch) -> None:
    def hello(ctx: Context) -> str:
        ctx.log.info("hello %s", ctx.params["who"])
        ctx.log.warning("careful")
        return "done"

    # However slow the machine, the attempt ends before its Started is due.
    monkeypatch.setattr(attempts_mod, "STARTED_AFTER", 30.0)
    await start_worker(peer, {"hello": hello})
    s = await peer.session()
    before = int(time.time() * 1000)
    s.send(assign("r1", token=1, handler="hello", params_json='{"who": "world"}'))
    r = await s.report("r1")
    assert r.outcome == pb.OUTCOME_SUCCEEDED
    assert r.output == "INFO hello world\nWARNING careful\ndone"
    assert r.token == 1 and not r.no_retry and r.retry_after_ms == 0
    assert before <= r.started_at_ms <= r.ended_at_ms <= int(time.time() * 1000)
    assert s.of("started") == [], "an attempt that ends before its Started is due sends none"
    assert b"".join(o.data for o in s.of("output")).decode() == r.output, "its output is still streamed"


async def test_other_return_values_are_reported_as_json(peer: Peer, start_worker) -> None:
    async def obj(ctx):
        return {"n": 1, "s": "é"}

    async def nothing(ctx):
        ctx.log.info("only a log line")

    await start_worker(peer, {"obj": obj, "nothing": nothing})
    s = await peer.session()
    s.send(assign("r1", handler="obj"))
    s.send(assign("r2", handler="nothing"))
    assert json.loads((await s.report("r1")).output) == {"n": 1, "s": "é"}
    assert (await s.report("r2")).output == "INFO only a log line\n"


async def test_started_is_sent_once_the_attempt_has_run_20ms(peer: Peer, start_worker) -> None:
    gate = Gate()
    await start_worker(peer, {"h": gate})
    s = await peer.session()
    s.send(assign("r1"))
    st = await s.next("started")
    assert st.run_id == "r1" and st.attempt == 1 and st.started_at_ms > 0
    gate.release("r1")
    r = await s.report("r1")
    assert r.started_at_ms == st.started_at_ms
    assert len(s.of("started")) == 1


async def test_the_context_carries_the_assignment(peer: Peer, start_worker) -> None:
    seen = {}

    def look(ctx: Context) -> None:
        seen[ctx.run_id] = ctx

    await start_worker(peer, {"look": look}, worker_id="w-ctx")
    s = await peer.session()
    s.send(assign("r1", attempt=3, token=1, handler="look", job_payload={"k": [1, 2]}, job="nightly",
                  namespace="team", scheduled_at_ms=1_700_000_000_123, idempotency_key="idem-1",
                  params_json='{"a": 1}', payload="webhook-body"))
    s.send(assign("r2", handler="look"))
    await s.report("r1", 3)
    ctx = seen["r1"]
    assert (ctx.run_id, ctx.attempt, ctx.job, ctx.namespace) == ("r1", 3, "nightly", "team")
    assert ctx.worker_id == "w-ctx"
    assert ctx.scheduled_at_ms == 1_700_000_000_123
    assert ctx.scheduled_at == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=timezone.utc)
    assert ctx.params == {"a": 1} and ctx.payload == {"k": [1, 2]} and ctx.run_payload == "webhook-body"
    assert ctx.shard is None and ctx.token == 1 and ctx.idempotency_key == "idem-1"
    assert ctx.fence == Fence("r1", 3, 1)
    assert isinstance(ctx.cancelled, threading.Event) and not ctx.cancelled.is_set()
    await s.report("r2")
    ctx = seen["r2"]
    assert ctx.params == {} and ctx.payload is None and ctx.run_payload is None


async def test_errors_become_failed_reports(peer: Peer, start_worker) -> None:
    def boom(ctx):
        raise ValueError("boom")

    async def bad(ctx):
        raise NonRetryable("bad input")

    def later(ctx):
        raise RetryAfter(1.5)

    await start_worker(peer, {"boom": boom, "bad": bad, "later": later})
    s = await peer.session()
    for run in ("boom", "bad", "later"):
        s.send(assign(run, handler=run))
    r = await s.report("boom")
    assert r.outcome == pb.OUTCOME_FAILED and not r.no_retry and r.retry_after_ms == 0
    assert "Traceback (most recent call last)" in r.output and "ValueError: boom" in r.output
    assert "in boom" in r.output, "the traceback names the handler's frame"
    r = await s.report("bad")
    assert r.outcome == pb.OUTCOME_FAILED and r.no_retry and r.retry_after_ms == 0
    assert "bad input" in r.output
    r = await s.report("later")
    assert r.outcome == pb.OUTCOME_FAILED and r.retry_after_ms == 1500 and not r.no_retry


async def test_assignments_this_worker_cannot_run_fail_at_once(peer: Peer, start_worker) -> None:
    await start_worker(peer, {"h": Gate()}, worker_id="w9")
    s = await peer.session()
    s.send(assign("shell", executor_json='{"shell":{"command":["true"]}}'))
    s.send(assign("garbled", executor_json='{"handler":'))
    s.send(assign("unknown", handler="nope"))
    s.send(assign("params", params_json="[1, 2"))
    s.send(assign("params2", params_json="[1, 2]"))
    for run, words in [("shell", "does not run shell jobs"), ("garbled", "cannot read the executor spec"),
                       ("unknown", "no handler named 'nope' on worker w9 (it has: h)"),
                       ("params", "cannot read the run's params"), ("params2", "not a JSON object")]:
        r = await s.report(run)
        assert r.outcome == pb.OUTCOME_FAILED, run
        assert words in r.output, (run, r.output)


async def test_capacity_bounds_execution_and_the_queue_runs_in_order(peer: Peer, start_worker) -> None:
    gate = Gate()
    w = await start_worker(peer, {"h": gate}, capacity=2, prefetch=3)
    s = await peer.session()
    for i in range(5):
        s.send(assign(f"r{i}"))
    await until(lambda: len(gate.order) == 2 and len(rt(w).held) == 5, "two executing, three queued")
    hb = (await s.heartbeats_after(1))[0]
    assert (hb.running, hb.queued, len(hb.attempts)) == (2, 3, 5)
    # A queued attempt that is cancelled ends without running.
    s.send(cancel("r3"))
    r3 = await s.report("r3")
    assert r3.outcome == pb.OUTCOME_CANCELLED and r3.output == "cancelled before it started"
    gate.release_all()
    for run in ("r0", "r1", "r2", "r4"):
        assert (await s.report(run)).outcome == pb.OUTCOME_SUCCEEDED
    assert gate.peak == 2, "never more than capacity at once"
    assert gate.order == ["r0", "r1", "r2", "r4"], "FIFO, without the cancelled one"
    assert not rt(w).held


async def test_plain_functions_run_in_at_most_capacity_threads(peer: Peer, start_worker) -> None:
    gate = SyncGate()
    w = await start_worker(peer, {"h": gate}, capacity=2, prefetch=2)
    s = await peer.session()
    for i in range(4):
        s.send(assign(f"r{i}"))
    await until(lambda: len(gate.order) == 2 and len(rt(w).held) == 4, "two running")
    gate.released.set()
    for i in range(4):
        assert (await s.report(f"r{i}")).output == "released"
    assert gate.peak == 2 and gate.order == ["r0", "r1", "r2", "r3"]


async def test_cancel_stops_a_coroutine_and_reports_cancelled(peer: Peer, start_worker) -> None:
    gate = Gate()
    await start_worker(peer, {"h": gate})
    s = await peer.session()
    s.send(assign("r1"))
    await until(lambda: gate.order == ["r1"], "running")
    s.send(cancel("r1"))
    r = await s.report("r1")
    assert r.outcome == pb.OUTCOME_CANCELLED and r.output.endswith("cancelled\n")
    assert gate.cancelled == ["r1"] and gate.contexts["r1"].cancelled.is_set()


async def test_cancel_sets_the_event_a_plain_function_polls(peer: Peer, start_worker) -> None:
    gate = SyncGate()
    await start_worker(peer, {"h": gate})
    s = await peer.session()
    s.send(assign("r1"))
    await until(lambda: gate.order == ["r1"], "running")
    s.send(cancel("r1"))
    r = await s.report("r1")
    assert r.outcome == pb.OUTCOME_CANCELLED
    assert gate.saw_cancel == ["r1"]


async def test_commands_with_a_stale_token_are_ignored(peer: Peer, start_worker) -> None:
    gate = Gate()
    w = await start_worker(peer, {"h": gate})
    s = await peer.session()
    s.send(assign("r1", token=3))
    await until(lambda: gate.order == ["r1"], "running")
    s.send(cancel("r1", token=2))
    s.send(abort("r1", token=2))
    s.send(assign("r2", token=2))
    s.send(assign("r3", token=3))
    await until(lambda: gate.order == ["r1", "r3"], "r3 running")
    assert rt(w).max_token == 3 and ("r2", 1) not in rt(w).held
    assert not gate.contexts["r1"].cancelled.is_set()
    gate.release_all()
    assert (await s.report("r1")).outcome == pb.OUTCOME_SUCCEEDED
    await s.report("r3")
    assert [r.run_id for r in s.of("report")] == ["r1", "r3"]


async def test_duplicate_assignments_are_ignored(peer: Peer, start_worker) -> None:
    gate = Gate()
    peer.ack_reports = False
    w = await start_worker(peer, {"h": gate})
    s = await peer.session()
    s.send(assign("r1"))
    await until(lambda: gate.order == ["r1"], "running")
    s.send(assign("r1"))  # while held
    gate.release("r1")
    await s.report("r1")
    s.send(assign("r1"))  # while its report is unacknowledged
    s.send(assign("r2"))
    gate.release("r2")
    await s.report("r2")
    assert gate.order == ["r1", "r2"]
    assert len(s.of("report")) == 2
    assert ("r1", 1) in rt(w).spool


async def test_abort_stops_without_a_report_and_forgets_a_spooled_one(peer: Peer, start_worker) -> None:
    gate = Gate()
    peer.ack_reports = False
    w = await start_worker(peer, {"h": gate})
    s = await peer.session()
    s.send(assign("done"))
    gate.release("done")
    await s.report("done")
    s.send(assign("running"))
    await until(lambda: "running" in gate.order, "running")
    s.send(abort("done"))
    s.send(abort("running"))
    await until(lambda: gate.cancelled == ["running"] and not rt(w).held, "the aborted attempt stopped")
    assert len(rt(w).spool) == 0, "the aborted attempt's spooled report is forgotten"
    await s.heartbeats_after(2)
    assert [r.run_id for r in s.of("report")] == ["done"]


async def test_timeout_reports_timed_out(peer: Peer, start_worker) -> None:
    gate = Gate()
    sync_gate = SyncGate()
    await start_worker(peer, {"h": gate, "sync": sync_gate})
    s = await peer.session()
    s.send(assign("r1", timeout_ms=100))
    s.send(assign("r2", handler="sync", timeout_ms=100))
    r = await s.report("r1")
    assert r.outcome == pb.OUTCOME_TIMED_OUT and "timed out after 0.1 s" in r.output
    assert gate.cancelled == ["r1"]
    r = await s.report("r2")
    assert r.outcome == pb.OUTCOME_TIMED_OUT and sync_gate.saw_cancel == ["r2"]
    assert r.ended_at_ms - r.started_at_ms >= 100


async def test_a_handler_returning_after_cancel_still_reports_cancelled(peer: Peer, start_worker) -> None:
    async def stubborn(ctx):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "swallowed"

    await start_worker(peer, {"h": stubborn})
    s = await peer.session()
    s.send(assign("r1"))
    await s.next("started")
    s.send(cancel("r1"))
    r = await s.report("r1")
    assert r.outcome == pb.OUTCOME_CANCELLED


async def test_rejected_reports_are_logged_and_dropped(peer: Peer, start_worker, caplog) -> None:
    peer.ack_reports = False
    w = await start_worker(peer, {"h": Gate()})
    s = await peer.session()
    s.send(assign("r1", handler="nope"))
    await s.report("r1")
    from peer import ack_report
    s.send(ack_report("r1", rejected="unknown attempt"))
    await until(lambda: len(rt(w).spool) == 0, "the report dropped")
    assert any("unknown attempt" in r.getMessage() for r in caplog.records)
