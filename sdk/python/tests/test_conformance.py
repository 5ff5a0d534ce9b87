"""The conformance worker: its flags, its standard handlers, and the process
(signals drain it)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import AsyncIterator

import pytest

from gnomon_worker import conformance
from gnomon_worker._pb import worker_pb2 as pb

from peer import WAIT, Peer, PeerSession, assign, cancel, until


def test_flags() -> None:
    args = conformance.parse_args(["--server", "a:1,b:2", "--server", "c:3", "--id", "x", "--capacity", "7",
                                   "--prefetch", "2", "--spool", "/tmp/s", "--token", "t", "--label", "k=v",
                                   "--label", "z=1=2", "--ca", "ca.pem"])
    w = conformance.build(args)
    c = w.config
    assert c.servers == ["a:1", "b:2", "c:3"] and c.worker_id == "x" and c.capacity == 7 and c.prefetch == 2
    assert str(c.spool_dir) == "/tmp/s" and c.token == "t" and c.labels == {"k": "v", "z": "1=2"}
    assert c.tls is not None and c.tls.ca == "ca.pem" and c.tls.cert is None
    assert w.handlers == ["echo", "fail", "fenced_step", "log", "no_retry", "retry_after", "sleep"]
    defaults = conformance.build(conformance.parse_args(["--server", "a:1"])).config
    assert (defaults.capacity, defaults.prefetch, defaults.spool_dir, defaults.tls) == (4, 0, None, None)


@pytest.fixture
async def conf(peer: Peer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AsyncIterator[PeerSession]:
    """A conformance worker in this process, and its session."""
    monkeypatch.setenv("GNOMON_CONFORMANCE_LOG", str(tmp_path / "conformance.log"))
    w = conformance.build(conformance.parse_args(["--server", peer.address, "--id", "conf-w"]))
    task = asyncio.ensure_future(w.run_async())
    try:
        yield await peer.session()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_echo(conf: PeerSession) -> None:
    conf.send(assign("r1", attempt=2, token=1, handler="echo", job_payload={"a": 1}, job="e", namespace="ns",
                     scheduled_at_ms=1234, idempotency_key="k", params_json='{"p": "q"}', payload="body"))
    r = await conf.report("r1", 2)
    assert r.outcome == pb.OUTCOME_SUCCEEDED
    assert "\n" not in r.output.strip()
    assert json.loads(r.output) == {"run_id": "r1", "attempt": 2, "job": "e", "namespace": "ns",
                                    "scheduled_at_ms": 1234, "params": {"p": "q"}, "payload": {"a": 1},
                                    "run_payload": "body", "token": "1", "idempotency_key": "k",
                                    "worker_id": "conf-w"}


async def test_fail_no_retry_and_retry_after(conf: PeerSession) -> None:
    conf.send(assign("f", handler="fail"))
    conf.send(assign("n", handler="no_retry"))
    conf.send(assign("ra", handler="retry_after", job_payload={"seconds": 2}))
    conf.send(assign("rb", handler="retry_after"))
    conf.send(assign("ra", attempt=2, handler="retry_after", job_payload={"seconds": 2}))
    r = await conf.report("f")
    assert r.outcome == pb.OUTCOME_FAILED and "RuntimeError: boom" in r.output and not r.no_retry
    r = await conf.report("n")
    assert r.outcome == pb.OUTCOME_FAILED and r.no_retry and "bad input" in r.output
    assert (await conf.report("ra")).retry_after_ms == 2000
    assert (await conf.report("rb")).retry_after_ms == 1000
    r = await conf.report("ra", 2)
    assert r.outcome == pb.OUTCOME_SUCCEEDED and r.output == "ok"


async def test_sleep_ticks_until_cancelled(conf: PeerSession, tmp_path: Path) -> None:
    conf.send(assign("s1", handler="sleep", job_payload={"seconds": 0.3}))
    r = await conf.report("s1")
    assert r.outcome == pb.OUTCOME_SUCCEEDED
    assert r.output == "".join(f"INFO tick {n}\n" for n in (1, 2, 3)) + "slept"
    conf.send(assign("s2", handler="sleep"))
    await conf.next("output", lambda o: o.run_id == "s2" and b"tick" in o.data)
    conf.send(cancel("s2"))
    r = await conf.report("s2")
    assert r.outcome == pb.OUTCOME_CANCELLED and r.ended_at_ms - r.started_at_ms < 10_000
    assert (tmp_path / "conformance.log").read_text() == "s1 1 start\ns2 1 start\n"


async def test_log(conf: PeerSession) -> None:
    conf.send(assign("l1", handler="log", job_payload={"lines": 3, "width": 5}))
    conf.send(assign("l2", handler="log"))
    assert (await conf.report("l1")).output == "INFO xxxxx\n" * 3 + "logged"
    big = (await conf.report("l2")).output
    assert len(big.encode()) <= 64 * 1024 and big.startswith("[gnomon: ")
    assert big.endswith("INFO " + "x" * 100 + "\nlogged")


async def test_the_process_drains_on_sigterm(peer: Peer, tmp_path: Path) -> None:
    log = tmp_path / "conformance.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gnomon_worker.conformance", "--server", peer.address, "--id", "proc-1",
        "--capacity", "2", "--label", "lang=python",
        env={**os.environ, "GNOMON_CONFORMANCE_LOG": str(log)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        s = await peer.session(timeout=30)
        assert s.hello.worker_id == "proc-1" and s.hello.capacity == 2 and dict(s.hello.labels) == {"lang": "python"}
        s.send(assign("short", handler="sleep", job_payload={"seconds": 0.5}))
        s.send(assign("long", handler="sleep", job_payload={"seconds": 60}))
        await until(lambda: log.exists() and len(log.read_text().splitlines()) == 2, "both started")
        proc.send_signal(signal.SIGTERM)
        await s.next("heartbeat", lambda hb: hb.draining)
        assert (await s.report("short")).outcome == pb.OUTCOME_SUCCEEDED
        proc.send_signal(signal.SIGTERM)  # again: stop waiting
        assert (await s.report("long")).outcome == pb.OUTCOME_LOST
        assert await asyncio.wait_for(proc.wait(), WAIT) == 0
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
        assert "draining" in err and "worker proc-1 stopped" in err
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
