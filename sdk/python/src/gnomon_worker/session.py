"""The connection loop: one gRPC session at a time to one of the servers,
NotLeader redirects, reconnects with jittered backoff, and the drain."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import AsyncIterator, List, NamedTuple, Optional, Tuple

import grpc
import grpc.aio

from ._pb import worker_pb2 as pb
from ._pb import worker_pb2_grpc as pb_grpc
from .config import Config
from .runtime import Runtime

log = logging.getLogger("gnomon_worker")

#: Message size limit, both ways.
MAX_MESSAGE_BYTES = 8 << 20
#: The first reconnect delay, doubled after each failure up to BACKOFF_MAX.
BACKOFF_MIN = 0.1
BACKOFF_MAX = 2.0
#: The shortest heartbeat interval honoured.
MIN_HEARTBEAT_INTERVAL = 0.05
#: How often a draining session looks whether the drain is over.
DRAIN_CHECK = 0.1

#: gRPC statuses that mean the Hello was refused (not a transient loss).
REFUSALS = frozenset({
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
})


class SessionEnd(NamedTuple):
    """How a session ended: "redirect" (to ``detail``), "refused", "lost" or "drained"."""

    kind: str
    detail: str = ""


def _from_error(e: grpc.aio.AioRpcError) -> SessionEnd:
    if e.code() in REFUSALS:
        return SessionEnd("refused", f"{e.code().name}: {e.details()}")
    return SessionEnd("lost", f"{e.code().name}: {e.details()}")


def _read(path: Optional[str]) -> Optional[bytes]:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def channel_options() -> List[Tuple[str, int]]:
    """The channel's options: 8 MiB messages, and keepalive pings that find a
    dead connection within a few seconds."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 2000),
        ("grpc.keepalive_timeout_ms", 3000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.enable_retries", 0),
    ]


def make_channel(config: Config, addr: str) -> grpc.aio.Channel:
    """A channel to one server: TLS when configured (files read now), plain otherwise."""
    if config.tls is None:
        return grpc.aio.insecure_channel(addr, options=channel_options())
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(config.tls.ca),
        private_key=_read(config.tls.key),
        certificate_chain=_read(config.tls.cert),
    )
    return grpc.aio.secure_channel(addr, creds, options=channel_options())


async def _requests(out: "asyncio.Queue[Optional[pb.WorkerMessage]]") -> AsyncIterator[pb.WorkerMessage]:
    while True:
        m = await out.get()
        if m is None:
            return
        yield m


async def _reader(rt: Runtime, call: grpc.aio.StreamStreamCall) -> SessionEnd:
    try:
        while True:
            m = await call.read()
            if m is grpc.aio.EOF:
                return SessionEnd("lost", "the server closed the session")
            try:
                rt.handle(m)
            except Exception:  # noqa: BLE001 (one bad message must not end the session)
                log.exception("error while handling a message from the server")
    except grpc.aio.AioRpcError as e:
        return SessionEnd("lost", f"{e.code().name}: {e.details()}")


async def session(rt: Runtime, addr: str, stop: asyncio.Event) -> SessionEnd:
    """One session with one server, from Hello to its end."""
    try:
        channel = make_channel(rt.config, addr)
    except OSError as e:
        return SessionEnd("refused", f"cannot read the TLS files: {e}")
    out: "asyncio.Queue[Optional[pb.WorkerMessage]]" = asyncio.Queue()
    metadata = (("authorization", f"Bearer {rt.config.token}"),) if rt.config.token else None
    # The lease starts when the leader receives this Hello: the fence counts
    # from its sending, not from the Welcome's (possibly late) arrival.
    hello_sent = time.monotonic()
    out.put_nowait(pb.WorkerMessage(hello=rt.hello()))
    call = pb_grpc.WorkerStub(channel).Session(_requests(out), metadata=metadata)
    reader: Optional["asyncio.Task[SessionEnd]"] = None
    stop_wait: Optional["asyncio.Task[bool]"] = None
    try:
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as e:
            return _from_error(e)
        if first is grpc.aio.EOF:
            return SessionEnd("lost", "the server did not answer Hello")
        which = first.WhichOneof("msg")
        if which == "not_leader":
            to = first.not_leader.leader_address
            if not to or to == addr:
                return SessionEnd("lost", "no leader yet")
            return SessionEnd("redirect", to)
        if which != "welcome":
            return SessionEnd("lost", f"the server answered Hello with {which}")
        w = first.welcome
        rt.welcome(w, hello_sent, out)
        log.info("session established with %s (session %s, token %d)", addr, w.session_id, w.leader_token)
        interval = max(w.heartbeat_interval_ms / 1000.0, MIN_HEARTBEAT_INTERVAL)
        reader = asyncio.ensure_future(_reader(rt, call))
        if rt.drain_deadline is None:
            stop_wait = asyncio.ensure_future(stop.wait())
        seq = 0
        next_beat = time.monotonic()
        while True:
            waiting = {reader} if stop_wait is None else {reader, stop_wait}
            wake = next_beat if rt.drain_deadline is None else min(next_beat, time.monotonic() + DRAIN_CHECK)
            done, _ = await asyncio.wait(waiting, timeout=max(0.0, wake - time.monotonic()),
                                         return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                return reader.result()
            if stop_wait is not None and stop_wait in done:
                stop_wait = None
                rt.begin_drain()
                next_beat = time.monotonic()  # tell the leader now
            now = time.monotonic()
            if now >= next_beat:
                seq += 1
                rt.heartbeats_sent[seq] = now
                out.put_nowait(pb.WorkerMessage(heartbeat=rt.heartbeat(seq)))
                next_beat += interval
                if next_beat <= now:
                    next_beat = now + interval
            if rt.drain_deadline is not None and rt.drain_done():
                return SessionEnd("drained")
    finally:
        if rt.outbound is out:
            rt.outbound = None
        for t in (reader, stop_wait):
            if t is not None:
                t.cancel()
        out.put_nowait(None)
        call.cancel()
        await channel.close(grace=None)


async def pause(delay: float, stop: Optional[asyncio.Event]) -> None:
    """The wait before a reconnect; a stop (when given) cuts it short."""
    if stop is None:
        await asyncio.sleep(delay)
        return
    try:
        await asyncio.wait_for(stop.wait(), delay)
    except asyncio.TimeoutError:
        pass


async def run_sessions(rt: Runtime, stop: asyncio.Event) -> None:
    """Runs sessions until ``stop`` is set and the drain is done."""
    tasks = [asyncio.ensure_future(rt.watchdog()), asyncio.ensure_future(rt.live_flusher())]
    servers = rt.config.servers
    backoff = BACKOFF_MIN
    next_server = 0
    redirect: Optional[str] = None
    try:
        while True:
            if stop.is_set():
                rt.begin_drain()
            if rt.drain_deadline is not None and rt.drain_done():
                break
            if redirect is not None:
                addr, redirect = redirect, None
            else:
                addr = servers[next_server % len(servers)]
                next_server += 1
            welcomed = rt.welcomes
            end = await session(rt, addr, stop)
            # After an established session, reconnect quickly: a worker must
            # find the new leader well within its lease.
            if rt.welcomes != welcomed:
                backoff = BACKOFF_MIN
            if end.kind == "drained":
                break
            if end.kind == "redirect":
                log.info("%s is not the leader; following the redirect to %s", addr, end.detail)
                redirect = end.detail
                backoff = BACKOFF_MIN
                continue
            if end.kind == "refused":
                log.error("session refused by %s: %s", addr, end.detail)
            else:
                log.warning("session with %s ended (%s); reconnecting", addr, end.detail)
            await pause(backoff * random.uniform(0.85, 1.15), None if rt.drain_deadline is not None else stop)
            backoff = min(backoff * 2, BACKOFF_MAX)
    finally:
        for t in tasks:
            t.cancel()
        await rt.close()
    log.info("worker %s stopped", rt.config.worker_id)
