"""An attempt's output: the 64 KiB tail of its Report, its logger, and the
live Output pieces."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

import gnomon_worker.attempts as attempts_mod
from gnomon_worker import Context
from gnomon_worker._pb import worker_pb2 as pb
from gnomon_worker.context import AttemptLog
from gnomon_worker.live import (FLUSH_INTERVAL, LIVE_BUFFER_BYTES, LIVE_RATE_BYTES, MAX_OUTPUT_BYTES, PIECE_BYTES,
                                OutputBuffer, tail_text)

from helpers import rt
from peer import Peer, abort, assign, until

KIB = 1024


def test_a_short_output_is_kept_whole() -> None:
    b = OutputBuffer()
    b.write("héllo\n")
    assert b.text() == "héllo\n"


def test_the_tail_is_the_last_64k_with_a_note() -> None:
    b = OutputBuffer()
    for i in range(2000):
        b.write(f"line {i:05d} " + "x" * 90 + "\n")
    text = b.text()
    assert len(text.encode()) <= MAX_OUTPUT_BYTES
    assert text.endswith("line 01999 " + "x" * 90 + "\n")
    assert text.startswith("[gnomon: ") and "earlier bytes dropped]\n" in text
    note, rest = text.split("\n", 1)
    assert int(note.split()[1]) + len(rest.encode()) == b.total


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_the_tail_is_cut_at_a_character_boundary(char: str) -> None:
    for shift in range(4):
        data = ("a" * shift + char * 40000).encode()
        text = tail_text(data, len(data))
        encoded = text.encode()
        assert len(encoded) <= MAX_OUTPUT_BYTES
        assert "\ufffd" not in text, "no character cut in half"
        assert text.split("\n", 1)[1].strip(char) == ""
        assert len(encoded) > MAX_OUTPUT_BYTES - 60


def test_lone_surrogates_do_not_break_the_output() -> None:
    b = OutputBuffer()
    b.write("bad \udc80 char")
    pb.Report(output=b.text()).SerializeToString()


def test_live_pieces_are_at_most_16k_with_contiguous_offsets() -> None:
    b = OutputBuffer()
    b.write("a" * (40 * KIB))
    pieces = b.take_pieces(now=0.0)
    assert [(o, len(d)) for o, d in pieces] == [(0, 16 * KIB), (16 * KIB, 16 * KIB), (32 * KIB, 8 * KIB)]
    assert b.take_pieces(now=0.1) == []
    b.write("bc")
    assert b.take_pieces(now=0.2) == [(40 * KIB, b"bc")]


def test_live_output_is_limited_to_64k_per_second() -> None:
    b = OutputBuffer()
    b.write("z" * (200 * KIB))
    first = b.take_pieces(now=10.0)
    assert sum(len(d) for _, d in first) == LIVE_RATE_BYTES
    assert all(len(d) <= PIECE_BYTES for _, d in first)
    assert b.take_pieces(now=10.5) == [], "the budget is spent for this second"
    second = b.take_pieces(now=11.0)
    assert second[0][0] == LIVE_RATE_BYTES, "nothing skipped: the buffer held it"
    assert sum(len(d) for _, d in second) == LIVE_RATE_BYTES


def test_a_full_buffer_drops_the_oldest_unsent_bytes() -> None:
    b = OutputBuffer()
    b.write("a" * (64 * KIB))
    assert sum(len(d) for _, d in b.take_pieces(now=0.0)) == 64 * KIB
    b.write("b" * (300 * KIB))
    pieces = b.take_pieces(now=1.0)
    dropped = 300 * KIB - LIVE_BUFFER_BYTES
    assert pieces[0][0] == 64 * KIB + dropped, "the offset skips the dropped bytes"
    assert b.total == 364 * KIB, "the offset counts every byte written"
    # Everything still buffered comes out, in order, at the rate allowed.
    got = pieces
    t = 1.0
    while True:
        t += 1.0
        more = b.take_pieces(now=t)
        if not more:
            break
        got += more
    for (o1, d1), (o2, _) in zip(got, got[1:]):
        assert o1 + len(d1) == o2
    assert got[-1][0] + len(got[-1][1]) == b.total


def test_the_logger_writes_level_and_message_lines() -> None:
    lines = []
    log = AttemptLog(lines.append, "r/1")
    log.info("resizing %s to %dpx", "cat.png", 64)
    log.debug("d")
    log.warning("w")
    log.warn("w2")
    log.error("e %s")
    log.critical("c")
    log.info("bad %d", "not a number")
    try:
        raise KeyError("k")
    except KeyError:
        log.exception("failed")
    assert lines[:6] == ["INFO resizing cat.png to 64px\n", "DEBUG d\n", "WARNING w\n", "WARNING w2\n",
                         "ERROR e %s\n", "CRITICAL c\n"]
    assert lines[6].startswith("INFO bad %d")
    assert lines[7].startswith("ERROR failed\nTraceback") and "KeyError: 'k'" in lines[7]
    assert lines[7].endswith("\n")


def test_handler_lines_are_passed_to_the_handler_logger(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gnomon_worker.handler")
    AttemptLog(lambda _l: None, "r7/2").info("x=%d", 3)
    assert [r.getMessage() for r in caplog.records] == ["r7/2 x=3"]


async def test_live_output_is_streamed_then_flushed_before_the_report(peer: Peer, start_worker) -> None:
    release = asyncio.Event()

    async def chatty(ctx: Context) -> str:
        ctx.log.info("first")
        await release.wait()
        for i in range(200):
            ctx.log.info("line %03d %s", i, "y" * 100)
        return "end"

    await start_worker(peer, {"chatty": chatty})
    s = await peer.session()
    s.send(assign("r1", handler="chatty", token=1))
    first = await s.next("output")
    assert (first.run_id, first.attempt, first.token, first.offset, first.data) == ("r1", 1, 1, 0, b"INFO first\n")
    release.set()
    report = await s.report("r1")
    kinds = s.kinds()
    assert kinds.index("started") < kinds.index("output")
    assert kinds[kinds.index("report") - 1] == "output", "flushed just before the report"
    pieces = s.of("output")
    assert all(len(p.data) <= PIECE_BYTES for p in pieces)
    for a, b in zip(pieces, pieces[1:]):
        assert a.offset + len(a.data) == b.offset
    streamed = b"".join(p.data for p in pieces)
    assert len(streamed) < LIVE_RATE_BYTES
    assert streamed.decode() == report.output, "the live stream is the report's output"
    assert report.output.endswith("y" * 100 + "\nend")


async def test_a_short_attempts_output_is_streamed_before_its_report(
        peer: Peer, start_worker, monkeypatch: pytest.MonkeyPatch) -> None:
    def quick(ctx: Context) -> str:
        ctx.log.info("quick")
        return "end"

    # However slow the machine, the attempt ends before its Started is due.
    monkeypatch.setattr(attempts_mod, "STARTED_AFTER", 30.0)
    await start_worker(peer, {"quick": quick})
    s = await peer.session()
    s.send(assign("r1", handler="quick", token=1))
    report = await s.report("r1")
    assert s.of("started") == [], "it ended before its Started was due"
    pieces = s.of("output")
    assert [(p.run_id, p.attempt, p.token, p.offset) for p in pieces] == [("r1", 1, 1, 0)]
    assert pieces[0].data.decode() == report.output == "INFO quick\nend"
    kinds = s.kinds()
    assert kinds.index("output") == kinds.index("report") - 1, "flushed just before the report"


@pytest.mark.parametrize("how", ["abort", "fence_self"])
async def test_no_live_output_for_superseded_or_self_fenced_attempts(peer: Peer, start_worker, how: str) -> None:
    more, done = threading.Event(), threading.Event()

    def stubborn(ctx: Context) -> str:  # ignores ctx.cancelled
        ctx.log.info("first")
        more.wait(10)
        ctx.log.info("after the stop")
        done.wait(10)
        return "end"

    w = await start_worker(peer, {"h": stubborn})
    s = await peer.session()
    try:
        s.send(assign("r1"))
        first = await s.next("output")
        assert first.data == b"INFO first\n"
        held = rt(w).held[("r1", 1)]
        if how == "abort":
            s.send(abort("r1"))
        else:
            rt(w).fence_self("test fence")
        await until(lambda: held.aborted or held.lost, "the stop")
        more.set()
        await asyncio.sleep(4 * FLUSH_INTERVAL)
        assert len(s.of("output")) == 1, "nothing streamed after the stop"
    finally:
        more.set()
        done.set()
    await until(lambda: not rt(w).held, "the attempt to end")
    if how == "fence_self":
        assert (await s.report("r1")).outcome == pb.OUTCOME_LOST
