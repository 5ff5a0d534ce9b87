"""A worker's settings, validated once at construction."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

#: The most attempts a worker may execute at once.
MAX_CAPACITY = 4096
#: The most assignments a worker may hold queued beyond its capacity.
MAX_PREFETCH = 65536
#: The file in the spool directory that keeps a generated worker id.
WORKER_ID_FILE = "worker-id"


@dataclass(frozen=True)
class Tls:
    """TLS settings for the connections to the servers.

    ``ca``: a PEM file of roots to trust (default: the system roots).
    ``cert`` and ``key``: PEM files of a client certificate and its key, for
    servers that require mutual TLS (both or neither). Files are read at every
    connect, so renewed certificates are picked up without a restart.
    """

    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("Tls: cert and key must be given together")


@dataclass(frozen=True)
class Config:
    """The validated settings of a :class:`~gnomon_worker.Worker`."""

    servers: List[str]
    worker_id: str
    capacity: int
    prefetch: int
    labels: Dict[str, str] = field(default_factory=dict)
    token: Optional[str] = None
    tls: Optional[Tls] = None
    spool_dir: Optional[Path] = None
    drain_timeout: float = 30.0
    self_fence_fraction: float = 0.7


def _int_in(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _servers(servers: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(servers, str):
        items = servers.split(",")
    elif isinstance(servers, (list, tuple)):
        items = []
        for s in servers:
            if not isinstance(s, str):
                raise ValueError(f"servers must be strings (host:port), got {s!r}")
            items.extend(s.split(","))
    else:
        raise ValueError(f"servers must be a list of host:port or a comma-separated string, got {servers!r}")
    out = [s.strip() for s in items if s.strip()]
    if not out:
        raise ValueError("servers must name at least one server (host:port)")
    for s in out:
        host, sep, port = s.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"server {s!r} is not host:port")
    return out


def generated_worker_id(spool_dir: Optional[Path]) -> str:
    """The worker id to use when none is given.

    With a spool directory: generated once and kept in ``spool_dir/worker-id``
    so that a restarted worker keeps its identity. Without one:
    ``py-<hostname>-<pid>``.
    """
    host = socket.gethostname().split(".")[0] or "host"
    if spool_dir is None:
        return f"py-{host}-{os.getpid()}"
    path = spool_dir / WORKER_ID_FILE
    try:
        kept = path.read_text(encoding="utf-8").strip()
        if kept:
            return kept
    except FileNotFoundError:
        pass
    new = f"py-{host}-{uuid.uuid4().hex[:12]}"
    tmp = spool_dir / f".{WORKER_ID_FILE}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return new


def make_config(
    *,
    servers: Union[str, Sequence[str]],
    worker_id: Optional[str],
    capacity: int,
    prefetch: int,
    labels: Optional[Mapping[str, str]],
    token: Optional[str],
    tls: Optional[Tls],
    spool_dir: Optional[Union[str, "os.PathLike[str]"]],
    drain_timeout: float,
    self_fence_fraction: float,
) -> Config:
    """Validates the options (raising ValueError) and resolves the worker id."""
    server_list = _servers(servers)
    _int_in("capacity", capacity, 1, MAX_CAPACITY)
    _int_in("prefetch", prefetch, 0, MAX_PREFETCH)
    if isinstance(self_fence_fraction, bool) or not isinstance(self_fence_fraction, (int, float)) \
            or not 0.0 < self_fence_fraction < 1.0:
        raise ValueError(f"self_fence_fraction must be strictly between 0 and 1, got {self_fence_fraction!r}")
    if isinstance(drain_timeout, bool) or not isinstance(drain_timeout, (int, float)) or not drain_timeout >= 0:
        raise ValueError(f"drain_timeout must be a number of seconds >= 0, got {drain_timeout!r}")
    label_map: Dict[str, str] = {}
    for k, v in dict(labels or {}).items():
        if not isinstance(k, str) or not isinstance(v, str) or not k:
            raise ValueError(f"labels must map non-empty strings to strings, got {k!r}: {v!r}")
        label_map[k] = v
    if token is not None and (not isinstance(token, str) or not token):
        raise ValueError("token must be a non-empty string or None")
    if tls is not None and not isinstance(tls, Tls):
        raise ValueError(f"tls must be a gnomon_worker.Tls or None, got {tls!r}")
    spool = Path(spool_dir) if spool_dir is not None else None
    if spool is not None:
        try:
            spool.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"spool_dir {str(spool)!r} cannot be created: {e}") from e
    if worker_id is None:
        wid = generated_worker_id(spool)
    elif not isinstance(worker_id, str) or not worker_id.strip():
        raise ValueError("worker_id must be a non-empty string")
    else:
        wid = worker_id.strip()
    return Config(
        servers=server_list,
        worker_id=wid,
        capacity=capacity,
        prefetch=prefetch,
        labels=label_map,
        token=token,
        tls=tls,
        spool_dir=spool,
        drain_timeout=float(drain_timeout),
        self_fence_fraction=float(self_fence_fraction),
    )
