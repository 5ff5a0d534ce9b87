"""Starting an attempt the leader assigned (queued FIFO past capacity),
running its handler to an outcome, and stopping one (cancelled, timed out,
superseded or lost)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import traceback
from typing import Any, Callable, Deque, Dict, NamedTuple, Optional, Tuple

from ._pb import worker_pb2 as pb
from .assignment import read_assignment, refusal, result_text
from .config import Config
from .context import Context
from .errors import MAX_RETRY_AFTER_MS, NonRetryable, RetryAfter
from .live import FLUSH_INTERVAL, OutputBuffer
from .spool import Spool
from .threads import ThreadPool

log = logging.getLogger("gnomon_worker")

Key = Tuple[str, int]

#: How long an attempt runs before its Started is sent; one that ends sooner
#: is told by its Report alone (which carries its start time).
STARTED_AFTER = 0.02
#: How long past the drain deadline a handler that ignores its cancellation
#: is waited for before it is reported lost and left behind.
ABANDON_AFTER = 1.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def is_async_handler(fn: Callable[..., Any]) -> bool:
    """Whether a handler is a coroutine function (run as a task, not in a thread)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


class Ending(NamedTuple):
    """How a handler call ended, before cancellation causes are applied."""

    outcome: "pb.Outcome"
    text: str
    no_retry: bool = False
    retry_after_ms: int = 0


def _retry_ending(e: RetryAfter) -> Ending:
    """How a handler that raised RetryAfter ends; a plain FAILED when its
    delay is not valid (its seconds changed after it was made)."""
    try:
        ms = e.retry_after_ms
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise ValueError(f"invalid RetryAfter delay: {ms!r} ms")
        return Ending(pb.OUTCOME_FAILED, f"RetryAfter: {e}\n", retry_after_ms=min(ms, MAX_RETRY_AFTER_MS))
    except Exception as bad:  # noqa: BLE001
        why = str(bad)
        if not why.startswith("invalid RetryAfter delay"):
            why = f"invalid RetryAfter delay ({type(bad).__name__}: {why})"
        return Ending(pb.OUTCOME_FAILED, f"{why}\n")


class Held:
    """An attempt this worker holds: queued for a slot, then executing."""

    def __init__(self, assign: pb.Assign, handler: Callable[..., Any], ctx: Context, output: OutputBuffer) -> None:
        self.key: Key = (assign.run_id, assign.attempt)
        self.token = assign.token
        self.timeout_ms = assign.timeout_ms
        self.handler = handler
        self.ctx = ctx
        self.output = output
        #: Superseded: stop and do not report.
        self.aborted = False
        #: Stopped by self-fencing or the drain: report LOST.
        self.lost = False
        #: "cancel" or "timeout", whichever stopped it first.
        self.cause: Optional[str] = None
        self.why = ""
        self.executing = False
        self.started_sent = False
        self.started_ms = 0
        #: The coroutine handler's task (cancelled on stop).
        self.inner: Optional["asyncio.Future[Any]"] = None
        self.task: Optional["asyncio.Task[None]"] = None


class Attempts:
    """The attempt half of :class:`~gnomon_worker.runtime.Runtime` (which
    holds the state declared here)."""

    config: Config
    handlers: Dict[str, Callable[..., Any]]
    held: Dict[Key, Held]
    queue: Deque[Key]
    executing: int
    spool: Spool
    outbound: Optional["asyncio.Queue[Optional[pb.WorkerMessage]]"]
    pool: ThreadPool
    tasks: Dict["asyncio.Task[None]", Held]

    def fence_lapsed(self) -> bool:
        """Defined by the runtime."""
        raise NotImplementedError

    def send(self, msg: pb.WorkerMessage) -> bool:
        """Defined by the runtime."""
        raise NotImplementedError

    def spool_report(self, report: pb.Report) -> None:
        """Defined by the runtime."""
        raise NotImplementedError

    def start_attempt(self, a: pb.Assign) -> None:
        """Takes an Assign (its token and the fence already checked)."""
        key = (a.run_id, a.attempt)
        if key in self.held or key in self.spool:
            log.info("duplicate assignment of %s/%d ignored", a.run_id, a.attempt)
            return
        try:
            handler, ctx, output = read_assignment(a, self.handlers, self.config.worker_id)
        except Exception as e:  # noqa: BLE001 (whatever the input, the attempt is reported)
            text = refusal(e)
            now = _now_ms()
            log.warning("attempt %s/%d refused: %s", a.run_id, a.attempt, text)
            self.spool_report(pb.Report(run_id=a.run_id, attempt=a.attempt, outcome=pb.OUTCOME_FAILED,
                                        output=text, started_at_ms=now, ended_at_ms=now, token=a.token))
            return
        self.held[key] = Held(a, handler, ctx, output)
        self.queue.append(key)
        if self.executing >= self.config.capacity and len(self.queue) > self.config.prefetch:
            log.warning("holding %d queued attempts, more than prefetch (%d)", len(self.queue), self.config.prefetch)
        self.pump()

    def pump(self) -> None:
        """Starts queued attempts while slots are free, in order. One whose
        slot frees after the fence lapsed never starts: it is reported lost."""
        while self.executing < self.config.capacity and self.queue:
            held = self.held.get(self.queue.popleft())
            if held is None:
                continue
            if self.fence_lapsed():
                held.lost = True
                held.why = "no heartbeat acknowledged within the fence before a slot freed"
                self._end_unstarted(held)
                continue
            held.executing = True
            self.executing += 1
            held.task = asyncio.ensure_future(self._execute(held))
            self.tasks[held.task] = held
            held.task.add_done_callback(self._task_done)

    def _task_done(self, task: "asyncio.Task[None]") -> None:
        self.tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("internal error in an attempt", exc_info=task.exception())

    async def close(self) -> None:
        """Stops what still runs when the worker exits (cancelled, or drained
        with handlers left behind); their threads are left to the process."""
        for task, held in list(self.tasks.items()):
            held.ctx.cancelled.set()
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=1.0)

    async def _execute(self, held: Held) -> None:
        if self._stopped_before_start(held):
            return
        loop = asyncio.get_running_loop()
        held.started_ms = _now_ms()
        timers = [loop.call_later(STARTED_AFTER, self._send_started, held)]
        if held.timeout_ms > 0:
            timers.append(loop.call_later(held.timeout_ms / 1000.0, self._time_out, held))
        try:
            ending = await self._call(held)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 (a bug here must still end the attempt)
            log.error("internal error in attempt %s/%d", *held.key, exc_info=True)
            ending = Ending(pb.OUTCOME_FAILED, f"worker error while ending the attempt: {type(e).__name__}\n")
        finally:
            for t in timers:
                t.cancel()
        self._finish(held, ending)

    def _stopped_before_start(self, held: Held) -> bool:
        """Whether the attempt was stopped (Cancel, Abort, self-fencing) or
        its fence lapsed after pump() gave it a slot but before its task
        first ran. Then its handler is never called: it ends as if stopped
        while queued, and gives its slot back."""
        if self.held.get(held.key) is held:
            lapsed = self.fence_lapsed()
            if not (held.ctx.cancelled.is_set() or lapsed):
                return False
            if lapsed and not (held.lost or held.aborted):
                held.lost = True
                held.why = "no heartbeat acknowledged within the fence before it started"
        if held.executing:
            held.executing = False
            self.executing -= 1
        try:
            if self.held.get(held.key) is held:
                self._end_unstarted(held)
        finally:
            self.pump()
        return True

    async def _call(self, held: Held) -> Ending:
        try:
            if is_async_handler(held.handler):
                held.inner = asyncio.ensure_future(held.handler(held.ctx))
                await asyncio.wait({held.inner})
                value = held.inner.result()
            else:
                fut = asyncio.wrap_future(self.pool.submit(held.handler, held.ctx))
                await asyncio.wait({fut})
                value = fut.result()
                if inspect.isawaitable(value):
                    held.inner = asyncio.ensure_future(value)
                    if held.ctx.cancelled.is_set():
                        held.inner.cancel()
                    await asyncio.wait({held.inner})
                    value = held.inner.result()
            return Ending(pb.OUTCOME_SUCCEEDED, result_text(value))
        except asyncio.CancelledError:
            if held.inner is None or not held.inner.done():
                # This task itself was cancelled: the worker is closing.
                if held.inner is not None:
                    held.inner.cancel()
                raise
            return Ending(pb.OUTCOME_FAILED, "cancelled\n")
        except NonRetryable as e:
            return Ending(pb.OUTCOME_FAILED, f"NonRetryable: {e}\n", no_retry=True)
        except RetryAfter as e:
            return _retry_ending(e)
        except BaseException as e:  # noqa: BLE001 (any handler error fails the attempt)
            return Ending(pb.OUTCOME_FAILED, "".join(traceback.format_exception(type(e), e, e.__traceback__)))

    def _finish(self, held: Held, ending: Ending) -> None:
        ended = _now_ms()
        if held.executing:
            held.executing = False
            self.executing -= 1
        try:
            if self.held.get(held.key) is not held:
                return
            if held.aborted:
                del self.held[held.key]
                log.info("superseded attempt %s/%d stopped; not reported", *held.key)
                return
            if held.lost:
                ending = Ending(pb.OUTCOME_LOST, f"lost: {held.why}\n")
            elif held.cause == "timeout":
                ending = Ending(pb.OUTCOME_TIMED_OUT, f"timed out after {held.timeout_ms / 1000:g} s\n")
            elif held.cause == "cancel":
                ending = Ending(pb.OUTCOME_CANCELLED, "cancelled\n")
            # The last words (result, or why it stopped) end the live stream
            # too; what is pending goes out whole, before the report, whether
            # or not the attempt ran long enough to send its Started.
            held.output.write(ending.text)
            self._flush(held, time.monotonic(), everything=True)
            report = self._report(held, ending, ended)
            del self.held[held.key]
            self.spool_report(report)
        finally:
            # One attempt that fails to end cleanly never stalls the queue.
            self.pump()

    def _report(self, held: Held, ending: Ending, ended: int) -> pb.Report:
        """The attempt's Report; a plain FAILED one if ``ending`` cannot be sent."""
        fields: Dict[str, Any] = dict(run_id=held.key[0], attempt=held.key[1], token=held.token,
                                      started_at_ms=held.started_ms, ended_at_ms=ended)
        try:
            return pb.Report(outcome=ending.outcome, output=held.output.text(), no_retry=ending.no_retry,
                             retry_after_ms=ending.retry_after_ms, **fields)
        except Exception as e:  # noqa: BLE001 (e.g. a field out of range)
            log.error("attempt %s/%d: cannot report its ending (%s); reporting it failed", *held.key, e)
            held.output.write(f"worker could not report this attempt's ending: {type(e).__name__}\n")
            return pb.Report(outcome=pb.OUTCOME_FAILED, output=held.output.text(), **fields)

    def _end_unstarted(self, held: Held) -> None:
        """Ends an attempt that never got a slot."""
        self.held.pop(held.key, None)
        if held.aborted:
            return
        now = _now_ms()
        if held.lost:
            outcome, text = pb.OUTCOME_LOST, f"lost before it started: {held.why}"
        else:
            outcome, text = pb.OUTCOME_CANCELLED, "cancelled before it started"
        self.spool_report(pb.Report(run_id=held.key[0], attempt=held.key[1], outcome=outcome, output=text,
                                    started_at_ms=now, ended_at_ms=now, token=held.token))

    def stop_attempt(self, key: Key, how: str, why: str) -> None:
        """Stops a held attempt. ``how``: "abort" (no report), "cancel"
        (CANCELLED) or "lost" (LOST)."""
        held = self.held.get(key)
        if held is None:
            return
        if how == "abort":
            held.aborted = True
        elif how == "lost":
            if not held.lost:
                held.lost, held.why = True, why
        elif held.cause is None:
            held.cause = "cancel"
        if not held.executing:
            try:
                self.queue.remove(key)
            except ValueError:
                pass
            self._end_unstarted(held)
            return
        self._interrupt(held)

    def _interrupt(self, held: Held) -> None:
        held.ctx.cancelled.set()
        if held.inner is not None and not held.inner.done():
            held.inner.cancel()

    def _time_out(self, held: Held) -> None:
        if self.held.get(held.key) is held and held.executing and held.cause is None:
            held.cause = "timeout"
            self._interrupt(held)

    def _send_started(self, held: Held) -> None:
        if self.held.get(held.key) is held and held.executing:
            held.started_sent = True
            self.send(pb.WorkerMessage(started=pb.Started(
                run_id=held.key[0], attempt=held.key[1], started_at_ms=held.started_ms)))

    def _flush(self, held: Held, now: float, everything: bool = False) -> None:
        if self.outbound is None:
            return
        for offset, data in held.output.take_pieces(now, everything):
            self.send(pb.WorkerMessage(output=pb.Output(
                run_id=held.key[0], attempt=held.key[1], token=held.token, offset=offset, data=data)))

    async def live_flusher(self) -> None:
        """Sends live output every 250 ms, for attempts past their Started
        (a short attempt's output is sent whole as it ends), but not for
        those superseded or self-fenced."""
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            now = time.monotonic()
            for held in list(self.held.values()):
                if held.executing and held.started_sent and not (held.aborted or held.lost):
                    self._flush(held, now)

    def abandon_stuck(self) -> None:
        """Reports LOST, and leaves behind, attempts still executing well after
        they were stopped (a plain function that does not poll ctx.cancelled)."""
        for held in [h for h in self.held.values() if h.executing]:
            log.error("attempt %s/%d did not stop when asked; reporting it lost and leaving it behind", *held.key)
            held.lost, held.why = True, held.why or "did not stop when asked"
            del self.held[held.key]
            held.output.write(f"lost: {held.why} (the handler did not stop when asked)\n")
            self.spool_report(pb.Report(
                run_id=held.key[0], attempt=held.key[1], outcome=pb.OUTCOME_LOST, output=held.output.text(),
                started_at_ms=held.started_ms, ended_at_ms=_now_ms(), token=held.token))
