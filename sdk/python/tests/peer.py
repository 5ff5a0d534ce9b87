"""A scripted gnomon leader for the tests: an in-process grpc.aio server of
the Worker service whose every move the test decides."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import grpc
import grpc.aio

from gnomon_worker._pb import worker_pb2 as pb
from gnomon_worker._pb import worker_pb2_grpc as pb_grpc

WAIT = 10.0  # generous: a condition that holds arrives far sooner


async def until(pred: Callable[[], Any], what: str = "condition", timeout: float = WAIT) -> Any:
    """Polls ``pred`` until it is truthy (returned), or fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def assign(run_id: str, attempt: int = 1, token: int = 1, handler: str = "h", job_payload: Any = None,
           **kw: Any) -> pb.ServerMessage:
    """An Assign of a handler job (``job_payload``: the handler's payload;
    ``payload``: the webhook body)."""
    executor: Dict[str, Any] = {"handler": {"name": handler}}
    if job_payload is not None:
        executor["handler"]["payload"] = job_payload
    kw.setdefault("executor_json", json.dumps(executor))
    kw.setdefault("job", "j")
    kw.setdefault("namespace", "default")
    kw.setdefault("idempotency_key", run_id)
    return pb.ServerMessage(assign=pb.Assign(run_id=run_id, attempt=attempt, token=token, **kw))


def cancel(run_id: str, attempt: int = 1, token: int = 1) -> pb.ServerMessage:
    return pb.ServerMessage(cancel=pb.Cancel(run_id=run_id, attempt=attempt, token=token))


def abort(run_id: str, attempt: int = 1, token: int = 1, reason: str = "superseded") -> pb.ServerMessage:
    return pb.ServerMessage(abort=pb.Abort(run_id=run_id, attempt=attempt, token=token, reason=reason))


def ack_report(run_id: str, attempt: int = 1, rejected: str = "") -> pb.ServerMessage:
    return pb.ServerMessage(ack=pb.Ack(report=pb.AttemptRef(run_id=run_id, attempt=attempt), rejected_reason=rejected))


class PeerSession:
    """One session as the peer sees it."""

    def __init__(self, peer: "Peer", hello: pb.Hello, metadata: Dict[str, str]) -> None:
        self.peer = peer
        self.hello = hello
        self.metadata = metadata
        self.ack_heartbeats = peer.ack_heartbeats
        self.ack_reports = peer.ack_reports
        #: Every message received after the Hello, with its arrival time.
        self.received: List[Tuple[float, pb.WorkerMessage]] = []
        self._out: "asyncio.Queue[Any]" = asyncio.Queue()
        self.closed = asyncio.Event()
        self._cursor = 0

    def send(self, m: pb.ServerMessage) -> None:
        """Sends a message to the worker."""
        self._out.put_nowait(m)

    def end(self, code: Optional[grpc.StatusCode] = None, details: str = "") -> None:
        """Ends the stream (OK, or with an error status)."""
        self._out.put_nowait(("end", code, details))

    def _record(self, m: pb.WorkerMessage) -> None:
        self.received.append((time.monotonic(), m))
        which = m.WhichOneof("msg")
        if which == "heartbeat" and self.ack_heartbeats:
            self.send(pb.ServerMessage(ack=pb.Ack(heartbeat_seq=m.heartbeat.seq)))
        if which == "report" and self.ack_reports:
            self.send(ack_report(m.report.run_id, m.report.attempt))

    def of(self, kind: str) -> List[Any]:
        """The messages of one kind received so far (their inner message)."""
        return [getattr(m, kind) for _, m in self.received if m.WhichOneof("msg") == kind]

    def kinds(self) -> List[str]:
        return [str(m.WhichOneof("msg")) for _, m in self.received]

    async def next(self, kind: str, pred: Callable[[Any], bool] = lambda _m: True, timeout: float = WAIT) -> Any:
        """The next message of ``kind`` (after the previous ``next``) matching ``pred``."""

        def find() -> Any:
            while self._cursor < len(self.received):
                m = self.received[self._cursor][1]
                self._cursor += 1
                if m.WhichOneof("msg") == kind and pred(getattr(m, kind)):
                    return getattr(m, kind)
            return None

        return await until(find, f"a {kind}", timeout)

    async def report(self, run_id: str, attempt: int = 1, timeout: float = WAIT) -> pb.Report:
        """Waits for the report of an attempt (anywhere in the session)."""

        def find() -> Optional[pb.Report]:
            for r in self.of("report"):
                if r.run_id == run_id and r.attempt == attempt:
                    return r
            return None

        return await until(find, f"the report of {run_id}/{attempt}", timeout)

    async def heartbeats_after(self, n: int = 2) -> List[pb.Heartbeat]:
        """Waits for ``n`` more heartbeats from now and returns them."""
        start = len(self.of("heartbeat"))
        await until(lambda: len(self.of("heartbeat")) >= start + n, f"{n} heartbeats")
        return self.of("heartbeat")[start:start + n]


class Peer(pb_grpc.WorkerServicer):
    """The scripted leader. ``script`` decides how each Hello is answered:
    ("welcome", {overrides}), ("not_leader", address) or ("refuse", code, message);
    with the script empty, a Welcome."""

    def __init__(self, *, lease_ttl_ms: int = 10_000, heartbeat_interval_ms: int = 50, leader_token: int = 1,
                 ack_heartbeats: bool = True, ack_reports: bool = True) -> None:
        self.lease_ttl_ms = lease_ttl_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.leader_token = leader_token
        self.ack_heartbeats = ack_heartbeats
        self.ack_reports = ack_reports
        self.script: Deque[Tuple[Any, ...]] = deque()
        self.hellos: List[Tuple[float, pb.Hello, Dict[str, str]]] = []
        self.sessions: List[PeerSession] = []
        self.server: Optional[grpc.aio.Server] = None
        self.port = 0
        self._n = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, port: int = 0, credentials: Optional[grpc.ServerCredentials] = None) -> "Peer":
        """Serves on 127.0.0.1 (``port``, or any free one); TLS with ``credentials``."""
        self.server = grpc.aio.server(options=[
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_ping_strikes", 0),
        ])
        pb_grpc.add_WorkerServicer_to_server(self, self.server)
        if credentials is None:
            self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        else:
            self.port = self.server.add_secure_port(f"127.0.0.1:{port}", credentials)
        assert port in (0, self.port)
        await self.server.start()
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=None)

    async def session(self, n: int = 1, timeout: float = WAIT) -> PeerSession:
        """Waits for the n-th welcomed session (1-based) and returns it."""
        await until(lambda: len(self.sessions) >= n, f"session {n}", timeout)
        return self.sessions[n - 1]

    async def Session(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        md = {k: v for k, v in (context.invocation_metadata() or ())}
        for k, v in (context.auth_context() or {}).items():
            md[f"auth:{k}"] = b",".join(v).decode()
        self.hellos.append((time.monotonic(), first.hello, md))
        action = self.script.popleft() if self.script else ("welcome", {})
        if action[0] == "refuse":
            await context.abort(action[1], action[2])
            return
        if action[0] == "not_leader":
            await context.write(pb.ServerMessage(not_leader=pb.NotLeader(leader_address=action[1])))
            return
        overrides = action[1] if len(action) > 1 else {}
        self._n += 1
        welcome = pb.Welcome(
            session_id=f"s{self._n}",
            lease_ttl_ms=overrides.get("lease_ttl_ms", self.lease_ttl_ms),
            heartbeat_interval_ms=overrides.get("heartbeat_interval_ms", self.heartbeat_interval_ms),
            leader_token=overrides.get("leader_token", self.leader_token),
            superseded=[pb.AttemptRef(run_id=r, attempt=a) for r, a in overrides.get("superseded", [])],
        )
        sess = PeerSession(self, first.hello, md)
        await context.write(pb.ServerMessage(welcome=welcome))
        self.sessions.append(sess)

        async def read() -> None:
            try:
                while True:
                    m = await context.read()
                    if m is grpc.aio.EOF:
                        break
                    sess._record(m)
            except Exception:  # noqa: BLE001 (the worker went away)
                pass
            finally:
                sess.closed.set()
                sess._out.put_nowait(("gone", None, ""))

        reader = asyncio.ensure_future(read())
        try:
            while True:
                item = await sess._out.get()
                if isinstance(item, tuple):
                    if item[0] == "end" and item[1] is not None:
                        await context.abort(item[1], item[2])
                    return
                await context.write(item)
        finally:
            reader.cancel()
