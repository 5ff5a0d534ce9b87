"""The report spool: persisted before sending, re-sent after reconnects and
restarts, deleted when acknowledged."""

from __future__ import annotations

import os
from pathlib import Path

from gnomon_worker._pb import worker_pb2 as pb
from gnomon_worker.spool import Spool, file_name

from helpers import Gate, rt
from peer import Peer, ack_report, assign, until


def report(run: str, attempt: int = 1) -> pb.Report:
    return pb.Report(run_id=run, attempt=attempt, outcome=pb.OUTCOME_SUCCEEDED, output="x" * 100, token=3)


def test_reports_are_files_that_survive_a_restart(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    for i in range(5):
        s.put(report(f"r{i}"))
    s.put(report("weird/run id é", 2))
    s.remove(("r1", 1))
    s.remove(("r3", 1))
    s.remove(("never", 1))
    assert sorted(os.listdir(tmp_path)) == sorted(file_name(k) for k in
                                                  [("r0", 1), ("r2", 1), ("r4", 1), ("weird/run id é", 2)])
    again = Spool(tmp_path)
    assert sorted((r.run_id, r.attempt) for r in again.values()) == [("r0", 1), ("r2", 1), ("r4", 1),
                                                                      ("weird/run id é", 2)]
    assert again.get(("r2", 1)) == report("r2")


def test_torn_writes_and_damaged_files_are_skipped(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    s.put(report("ok"))
    (tmp_path / ".tmp-123").write_bytes(b"half a rep")
    (tmp_path / "report-bad-1.pb").write_bytes(b"\xff\xff\xff\xff")
    (tmp_path / "worker-id").write_text("w\n")
    again = Spool(tmp_path)
    assert [r.run_id for r in again.values()] == ["ok"]
    assert not (tmp_path / ".tmp-123").exists()
    assert (tmp_path / "worker-id").exists()


def test_without_a_directory_the_spool_is_memory_only() -> None:
    s = Spool(None)
    s.put(report("a"))
    assert ("a", 1) in s and len(s) == 1
    s.remove(("a", 1))
    assert len(s) == 0


async def test_a_report_is_on_disk_before_it_is_sent_and_deleted_on_ack(
    peer: Peer, start_worker, tmp_path: Path
) -> None:
    peer.ack_reports = False
    seen_on_disk = []

    async def ok(ctx):
        return "ok"

    await start_worker(peer, {"h": ok}, spool_dir=tmp_path)
    s = await peer.session()
    path = tmp_path / file_name(("r1", 1))
    original_record = s._record

    def record(m: pb.WorkerMessage) -> None:
        if m.WhichOneof("msg") == "report":
            seen_on_disk.append(path.exists() and pb.Report.FromString(path.read_bytes()) == m.report)
        original_record(m)

    s._record = record  # type: ignore[method-assign]
    s.send(assign("r1"))
    await s.report("r1")
    assert seen_on_disk == [True]
    s.send(ack_report("r1"))
    await until(lambda: not path.exists(), "the file deleted on ack")


async def test_unacked_reports_are_sent_again_after_a_reconnect(peer: Peer, start_worker) -> None:
    peer.ack_reports = False
    gate = Gate()
    w = await start_worker(peer, {"h": gate})
    s1 = await peer.session()
    s1.send(assign("r1"))
    gate.release("r1")
    first = await s1.report("r1")
    s1.end()
    s2 = await peer.session(2)
    await s2.next("heartbeat")
    assert s2.kinds()[0] == "report", "re-sent right after the Welcome"
    assert s2.of("report")[0] == first
    s2.send(ack_report("r1"))
    await until(lambda: len(rt(w).spool) == 0, "forgotten once acked")
    s2.end()
    s3 = await peer.session(3)
    await s3.heartbeats_after(2)
    assert s3.of("report") == []


async def test_reports_made_between_sessions_wait_for_the_next(peer: Peer, start_worker) -> None:
    gate = Gate()
    w = await start_worker(peer, {"h": gate})
    s1 = await peer.session()
    s1.send(assign("r1"))
    await until(lambda: gate.order == ["r1"], "running")
    await peer.stop()
    await until(lambda: rt(w).outbound is None, "the session lost")
    gate.release("r1")
    await until(lambda: ("r1", 1) in rt(w).spool, "reported into the spool")
    peer2 = await Peer().start(port=peer.port)
    try:
        s = await peer2.session()
        r = await s.report("r1")
        assert r.outcome == pb.OUTCOME_SUCCEEDED
        await until(lambda: len(rt(w).spool) == 0, "acked")
    finally:
        await peer2.stop()


async def test_the_spool_survives_a_restart(peer: Peer, start_worker, tmp_path: Path) -> None:
    peer.ack_reports = False

    async def ok(ctx):
        return "ok"

    w1 = await start_worker(peer, {"h": ok}, spool_dir=tmp_path, worker_id=None)
    s1 = await peer.session()
    s1.send(assign("r1", token=1))
    first = await s1.report("r1")
    w1._test_task.cancel()  # the process dies before the ack
    await until(lambda: s1.closed.is_set(), "the first worker gone")
    peer.ack_reports = True
    w2 = await start_worker(peer, {"h": ok}, spool_dir=tmp_path, worker_id=None)
    assert w2.worker_id == w1.worker_id, "the generated id is kept in the spool directory"
    s2 = await peer.session(2)
    assert s2.hello.worker_id == w1.worker_id
    assert await s2.report("r1") == first
    await until(lambda: not (tmp_path / file_name(("r1", 1))).exists(), "deleted once acked")
    assert (tmp_path / "worker-id").read_text().strip() == w1.worker_id
