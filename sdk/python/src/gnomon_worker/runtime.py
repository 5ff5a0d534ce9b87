"""The worker's state and how it answers the leader's messages.

Everything here runs on the worker's event loop: the leader's messages, the
heartbeats, the watchdog and the end of every attempt. So an attempt leaves
the held set and its report enters the spool (and the outbound stream) in one
step: every heartbeat either lists an attempt or follows its report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Optional

from ._pb import worker_pb2 as pb
from .attempts import ABANDON_AFTER, Attempts, Held, Key
from .config import Config
from .spool import Spool
from .threads import ThreadPool

log = logging.getLogger("gnomon_worker")

#: The protocol version this SDK speaks.
PROTOCOL_VERSION = 1
#: How often the self-fencing watchdog looks.
WATCHDOG_INTERVAL = 0.1
#: How long past the drain deadline a drain waits for its reports' acks.
ACK_WAIT = 5.0


def now_ms() -> int:
    """Wall-clock time in milliseconds since the Unix epoch."""
    return int(time.time() * 1000)


class Runtime(Attempts):
    """One worker process's protocol state. Not thread-safe: use it from its loop."""

    def __init__(self, config: Config, handlers: Dict[str, Callable[..., Any]]) -> None:
        self.config = config
        self.handlers = dict(handlers)
        #: Attempts held (executing or queued), in the order they were assigned.
        self.held: Dict[Key, Held] = {}
        #: Held attempts waiting for a slot, FIFO.
        self.queue: Deque[Key] = deque()
        #: Attempts holding a slot.
        self.executing = 0
        self.spool = Spool(config.spool_dir)
        #: The session's outbound messages; None between sessions.
        self.outbound: Optional["asyncio.Queue[Optional[pb.WorkerMessage]]"] = None
        self.max_token = 0
        #: When the newest acknowledged heartbeat (or the Hello) was *sent*:
        #: the leader's lease runs from its receipt, which is no earlier, so a
        #: fence counted from here never outlasts the leader's view.
        self.last_ack = time.monotonic()
        #: Send times of the heartbeats not yet acknowledged, by sequence.
        self.heartbeats_sent: Dict[int, float] = {}
        #: Sessions established so far.
        self.welcomes = 0
        self.lease_ttl = 10.0
        self.draining = False
        #: When the drain gives up waiting for running attempts (monotonic).
        self.drain_deadline: Optional[float] = None
        self.pool = ThreadPool(config.capacity)
        #: The tasks of the executing attempts.
        self.tasks: Dict["asyncio.Task[None]", Held] = {}

    # -- sending ---------------------------------------------------------

    def send(self, msg: pb.WorkerMessage) -> bool:
        """Queues a message on the current session, if there is one."""
        if self.outbound is None:
            return False
        self.outbound.put_nowait(msg)
        return True

    def spool_report(self, report: pb.Report) -> None:
        """Persists a report, then sends it if a session is up."""
        self.spool.put(report)
        self.send(pb.WorkerMessage(report=report))

    def acked(self, key: Key) -> None:
        """Forgets a report the leader has acknowledged."""
        self.spool.remove(key)

    # -- fencing ---------------------------------------------------------

    def fence_lapsed(self) -> bool:
        """No heartbeat sent within the safety fraction of the lease has been
        acknowledged: this worker may no longer hold anything."""
        return time.monotonic() - self.last_ack > self.lease_ttl * self.config.self_fence_fraction

    def fence_self(self, why: str) -> None:
        """Stops every held attempt and reports it LOST."""
        keys = [k for k, h in self.held.items() if not h.lost]
        if not keys:
            return
        log.warning("self-fencing (%s): stopping %d attempts and reporting them lost", why, len(keys))
        for key in keys:
            self.stop_attempt(key, "lost", why)

    async def watchdog(self) -> None:
        """Self-fences whenever the fence has lapsed (checked every 100 ms)."""
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL)
            if self.fence_lapsed():
                self.fence_self("no heartbeat acknowledged within the safety fraction of the lease")

    # -- drain -----------------------------------------------------------

    def begin_drain(self) -> None:
        """Starts the drain: heartbeats say draining; running attempts get
        ``drain_timeout`` to finish."""
        if self.drain_deadline is not None:
            return
        self.drain_deadline = time.monotonic() + self.config.drain_timeout
        self.draining = True
        log.info("draining: no new assignments; waiting for %d held attempts", len(self.held))

    def hurry_drain(self) -> None:
        """Ends the wait for running attempts now (a second signal)."""
        if self.drain_deadline is None:
            self.begin_drain()
        assert self.drain_deadline is not None
        self.drain_deadline = min(self.drain_deadline, time.monotonic())

    def drain_done(self) -> bool:
        """One step of the drain; true once it is over."""
        assert self.drain_deadline is not None
        now = time.monotonic()
        if now >= self.drain_deadline:
            self.fence_self("drain timeout")
        if now >= self.drain_deadline + ABANDON_AFTER:
            self.abandon_stuck()
        if not self.held and (len(self.spool) == 0 or now >= self.drain_deadline + ACK_WAIT):
            return True
        return False

    # -- the leader's messages -------------------------------------------

    def hello(self) -> pb.Hello:
        """The Hello of a new session."""
        return pb.Hello(
            worker_id=self.config.worker_id,
            labels=self.config.labels,
            capacity=self.config.capacity,
            executors=["handler"],
            handlers=sorted(self.handlers),
            running=[pb.AttemptRef(run_id=k[0], attempt=k[1]) for k, h in self.held.items() if not h.lost],
            protocol_version=PROTOCOL_VERSION,
            prefetch=self.config.prefetch,
        )

    def heartbeat(self, seq: int) -> pb.Heartbeat:
        """Heartbeat ``seq``, describing what the worker holds now."""
        running = self.executing
        return pb.Heartbeat(
            seq=seq,
            running=running,
            load=running / self.config.capacity,
            attempts=[pb.AttemptRef(run_id=k[0], attempt=k[1]) for k in self.held],
            draining=self.draining,
            queued=max(0, len(self.held) - running),
        )

    def welcome(self, w: pb.Welcome, hello_sent: float, outbound: "asyncio.Queue[Any]") -> None:
        """Takes in a Welcome: the new session is up."""
        for r in w.superseded:
            self.stop_attempt((r.run_id, r.attempt), "abort", "superseded")
        self.max_token = max(self.max_token, w.leader_token)
        self.lease_ttl = max(w.lease_ttl_ms, 500) / 1000.0
        self.last_ack = max(self.last_ack, hello_sent)
        self.heartbeats_sent.clear()
        self.welcomes += 1
        self.outbound = outbound
        for report in self.spool.values():
            outbound.put_nowait(pb.WorkerMessage(report=report))

    def handle(self, m: pb.ServerMessage) -> None:
        """Acts on one message of the leader (after the Welcome)."""
        which = m.WhichOneof("msg")
        if which == "assign":
            a = m.assign
            if a.token < self.max_token:
                log.warning("assignment of %s/%d with a stale token %d ignored (highest seen: %d)",
                            a.run_id, a.attempt, a.token, self.max_token)
                return
            self.max_token = a.token
            # A worker whose fence has lapsed may have been declared dead and
            # its attempts given to another: drop, do not queue.
            if self.fence_lapsed():
                log.warning("assignment of %s/%d dropped: no heartbeat acknowledged within the fence",
                            a.run_id, a.attempt)
                return
            self.start_attempt(a)
        elif which == "cancel":
            c = m.cancel
            if c.token >= self.max_token:
                self.stop_attempt((c.run_id, c.attempt), "cancel", "cancelled")
        elif which == "abort":
            a = m.abort
            if a.token >= self.max_token:
                log.warning("attempt %s/%d aborted by the leader: %s", a.run_id, a.attempt, a.reason)
                self.stop_attempt((a.run_id, a.attempt), "abort", a.reason or "aborted")
                self.acked((a.run_id, a.attempt))
        elif which == "ack":
            ack = m.ack
            if ack.HasField("heartbeat_seq"):
                seq = ack.heartbeat_seq
                sent = self.heartbeats_sent.get(seq)
                if sent is not None:
                    self.last_ack = max(self.last_ack, sent)
                for s in [s for s in self.heartbeats_sent if s <= seq]:
                    del self.heartbeats_sent[s]
            if ack.HasField("report"):
                if ack.rejected_reason:
                    log.warning("report of %s/%d rejected by the leader: %s",
                                ack.report.run_id, ack.report.attempt, ack.rejected_reason)
                self.acked((ack.report.run_id, ack.report.attempt))
