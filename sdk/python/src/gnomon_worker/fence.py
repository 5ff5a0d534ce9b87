"""The fencing value of an attempt."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fence:
    """Identifies one attempt of a run and the leader token it was assigned under.

    Side effects that must never be applied twice by overlapping attempts can
    be guarded with it: store the highest ``token`` (and ``attempt``) applied
    for ``run_id`` next to the data, and refuse a write that carries a lower
    one.
    """

    #: The run this attempt belongs to.
    run_id: str
    #: The attempt number (1, 2, ...).
    attempt: int
    #: The fencing token of the assignment; later assignments carry higher ones.
    token: int
