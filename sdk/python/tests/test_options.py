"""Worker options: defaults, validation, the worker id, handler registration
and the error types."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from gnomon_worker import NonRetryable, RetryAfter, Tls, Worker


def test_defaults() -> None:
    w = Worker(servers=["127.0.0.1:7400"])
    c = w.config
    assert c.servers == ["127.0.0.1:7400"]
    assert (c.capacity, c.prefetch, c.drain_timeout, c.self_fence_fraction) == (16, 0, 30.0, 0.7)
    assert c.labels == {} and c.token is None and c.tls is None and c.spool_dir is None
    assert w.worker_id == f"py-{socket.gethostname().split('.')[0]}-{os.getpid()}"


def test_servers_may_be_a_comma_separated_string() -> None:
    assert Worker(servers="a:1, b:2,,c:3").config.servers == ["a:1", "b:2", "c:3"]
    assert Worker(servers=["a:1,b:2", "[::1]:3"]).config.servers == ["a:1", "b:2", "[::1]:3"]


@pytest.mark.parametrize("opts, words", [
    ({"servers": []}, "at least one server"),
    ({"servers": " , "}, "at least one server"),
    ({"servers": "nohost"}, "not host:port"),
    ({"servers": "h:port"}, "not host:port"),
    ({"servers": 7400}, "servers must be"),
    ({"capacity": 0}, "capacity must be between 1 and 4096"),
    ({"capacity": 4097}, "capacity must be between 1 and 4096"),
    ({"capacity": True}, "capacity must be an integer"),
    ({"capacity": "8"}, "capacity must be an integer"),
    ({"prefetch": -1}, "prefetch must be between 0 and 65536"),
    ({"prefetch": 65537}, "prefetch must be between 0 and 65536"),
    ({"self_fence_fraction": 0}, "strictly between 0 and 1"),
    ({"self_fence_fraction": 1.0}, "strictly between 0 and 1"),
    ({"self_fence_fraction": float("nan")}, "strictly between 0 and 1"),
    ({"drain_timeout": -1}, "drain_timeout"),
    ({"labels": {"a": 1}}, "labels"),
    ({"token": ""}, "token"),
    ({"tls": "yes"}, "tls"),
    ({"worker_id": " "}, "worker_id"),
])
def test_bad_options_are_refused_at_construction(opts, words) -> None:
    opts = {"servers": "127.0.0.1:7400", **opts}
    with pytest.raises(ValueError, match=words):
        Worker(**opts)


def test_limits_are_accepted() -> None:
    Worker(servers="h:1", capacity=4096, prefetch=65536, self_fence_fraction=0.99, drain_timeout=0)
    Worker(servers="h:1", capacity=1, tls=Tls(ca="ca.pem", cert="c.pem", key="k.pem"), token="t")


def test_tls_needs_cert_and_key_together() -> None:
    with pytest.raises(ValueError, match="together"):
        Tls(cert="c.pem")


def test_a_generated_worker_id_is_kept_in_the_spool_dir(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    a = Worker(servers="h:1", spool_dir=spool)
    b = Worker(servers="h:1", spool_dir=str(spool))
    assert a.worker_id == b.worker_id and a.worker_id.startswith("py-")
    assert (spool / "worker-id").read_text().strip() == a.worker_id
    assert Worker(servers="h:1", spool_dir=spool, worker_id="given").worker_id == "given"


def test_handlers_are_registered_once_by_name() -> None:
    w = Worker(servers="h:1")

    @w.handler("b")
    def b(ctx):
        return 1

    w.register("a", lambda ctx: None)
    assert b(None) == 1, "the decorator returns the function"
    assert w.handlers == ["a", "b"]
    with pytest.raises(ValueError, match="already registered"):
        w.register("a", lambda ctx: None)
    with pytest.raises(ValueError):
        w.register("", lambda ctx: None)
    with pytest.raises(TypeError):
        w.register("c", "not callable")  # type: ignore[arg-type]


async def test_a_worker_without_handlers_does_not_run() -> None:
    with pytest.raises(RuntimeError, match="handler"):
        await Worker(servers="h:1").run_async()


def test_error_types() -> None:
    assert NonRetryable("bad input").message == "bad input"
    assert str(NonRetryable("bad input")) == "bad input"
    assert RetryAfter(1.5).retry_after_ms == 1500
    assert RetryAfter(2, "rate limited").message == "rate limited"
    assert str(RetryAfter(2)) == "retry after 2 s"
    assert RetryAfter(0.0004).retry_after_ms == 0
    with pytest.raises(ValueError):
        RetryAfter(-1)
    with pytest.raises(TypeError):
        RetryAfter("5")  # type: ignore[arg-type]
