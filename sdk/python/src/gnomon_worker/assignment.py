"""Reading an Assign (its executor spec, params and the handler it names)
into what a handler is given, and writing a handler's return value out."""

from __future__ import annotations

import json
import threading
from typing import Any, Callable, Dict, Tuple

from ._pb import worker_pb2 as pb
from .context import AttemptLog, Context
from .live import OutputBuffer, tail_text


def bounded(text: str) -> str:
    """``text`` cut to the output a Report carries (its last 64 KiB, UTF-8 safe)."""
    data = text.encode("utf-8", "replace")
    return tail_text(data, len(data))


def parse_executor(text: str, worker_id: str) -> Tuple[str, Any]:
    """The handler name and payload of an Assign's executor_json, or
    ValueError saying why this worker cannot run it."""
    try:
        spec = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"worker cannot read the executor spec: {e}") from None
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ValueError(f"worker cannot read the executor spec: expected one executor kind, got {text[:200]!r}")
    kind, body = next(iter(spec.items()))
    if kind != "handler":
        raise ValueError(f"worker {worker_id} does not run {kind} jobs (it runs only handler jobs)")
    if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not body["name"]:
        raise ValueError("worker cannot read the executor spec: a handler needs a name")
    return body["name"], body.get("payload")


def parse_params(text: str) -> Dict[str, Any]:
    """The run's params from params_json ({} when empty), or ValueError."""
    if not text:
        return {}
    try:
        params = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"worker cannot read the run's params: {e}") from None
    if not isinstance(params, dict):
        raise ValueError("worker cannot read the run's params: not a JSON object")
    return params


def read_assignment(a: pb.Assign, handlers: Dict[str, Callable[..., Any]],
                    worker_id: str) -> Tuple[Callable[..., Any], Context, OutputBuffer]:
    """The handler an Assign names, the Context it is given and the buffer of
    its output; ValueError (or another error) when the worker cannot run it."""
    name, payload = parse_executor(a.executor_json, worker_id)
    params = parse_params(a.params_json)
    handler = handlers.get(name)
    if handler is None:
        raise ValueError(f"no handler named {name!r} on worker {worker_id} "
                         f"(it has: {', '.join(sorted(handlers)) or 'none'})")
    output = OutputBuffer()
    try:
        ctx = Context(
            run_id=a.run_id, attempt=a.attempt, job=a.job, namespace=a.namespace,
            worker_id=worker_id, scheduled_at_ms=a.scheduled_at_ms, params=params,
            payload=payload, run_payload=a.payload or None, token=a.token,
            idempotency_key=a.idempotency_key, cancelled=threading.Event(),
            log=AttemptLog(output.write, f"{a.run_id}/{a.attempt}"),
        )
    except Exception as e:  # noqa: BLE001 (e.g. a scheduled_at_ms out of range)
        raise ValueError(f"worker cannot read the assignment: {type(e).__name__}: {e}") from None
    return handler, ctx, output


def refusal(e: BaseException) -> str:
    """The output of the Report of an assignment the worker cannot run."""
    try:
        why = str(e)
    except Exception:  # noqa: BLE001 (an exception that cannot say what it is)
        why = "(no message)"
    text = why if isinstance(e, ValueError) else f"worker cannot start the attempt: {type(e).__name__}: {why}"
    return bounded(text)


def result_text(value: Any) -> str:
    """What a handler's return value adds to its output."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
