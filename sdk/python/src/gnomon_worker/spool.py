"""Reports written but not yet acknowledged by the leader.

Persist, then send: a report enters the spool before it is sent and leaves
it only when the leader acks it. With a directory, each report is one file
(written to a temporary file, fsync'd, then renamed into place) and the
spool is loaded again at start, so reports survive a restart; the leader
dedupes re-sent reports by (run, attempt). Without one, memory only.
"""

from __future__ import annotations

import base64
import logging
import os
import uuid
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

from ._pb import worker_pb2 as pb

log = logging.getLogger("gnomon_worker")

Key = Tuple[str, int]

_PREFIX = "report-"
_SUFFIX = ".pb"
_TMP = ".tmp-"


def file_name(key: Key) -> str:
    """The spool file of a report: the run id (base64url) and the attempt."""
    run = base64.urlsafe_b64encode(key[0].encode()).decode().rstrip("=")
    return f"{_PREFIX}{run}-{key[1]}{_SUFFIX}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Spool:
    """The unacknowledged reports, by (run_id, attempt)."""

    def __init__(self, directory: Optional[Path]) -> None:
        self.directory = directory
        self._reports: Dict[Key, pb.Report] = {}
        if directory is not None:
            self._load()

    def _load(self) -> None:
        assert self.directory is not None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            entries = sorted(os.listdir(self.directory))
        except OSError as e:
            log.error("cannot open the report spool %s (%s); reports are kept in memory only", self.directory, e)
            self.directory = None
            return
        for name in entries:
            path = self.directory / name
            if name.startswith(_TMP):
                # A write that did not finish: its report was never sent.
                try:
                    path.unlink()
                except OSError:
                    pass
                continue
            if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
                continue
            try:
                report = pb.Report.FromString(path.read_bytes())
            except Exception as e:  # noqa: BLE001 (a damaged file must not stop the worker)
                log.error("skipping unreadable spooled report %s: %s", path, e)
                continue
            self._reports[(report.run_id, report.attempt)] = report
        if self._reports:
            log.info("re-sending %d spooled reports", len(self._reports))

    def put(self, report: pb.Report) -> None:
        """Keeps a report until it is acked: on disk first (when there is a
        directory), then in memory."""
        key = (report.run_id, report.attempt)
        if self.directory is not None:
            path = self.directory / file_name(key)
            tmp = self.directory / f"{_TMP}{uuid.uuid4().hex}"
            try:
                with open(tmp, "wb") as f:
                    f.write(report.SerializeToString())
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
                _fsync_dir(self.directory)
            except OSError as e:
                log.error("cannot spool the report of %s/%d (%s); keeping it in memory", key[0], key[1], e)
                try:
                    tmp.unlink()
                except OSError:
                    pass
        self._reports[key] = report

    def remove(self, key: Key) -> None:
        """Forgets a report (acked, or of an aborted attempt)."""
        if self._reports.pop(key, None) is None:
            return
        if self.directory is not None:
            try:
                (self.directory / file_name(key)).unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("cannot delete the spooled report of %s/%d: %s", key[0], key[1], e)

    def get(self, key: Key) -> Optional[pb.Report]:
        """The spooled report of an attempt, if any."""
        return self._reports.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._reports

    def __len__(self) -> int:
        return len(self._reports)

    def values(self) -> Iterator[pb.Report]:
        """The spooled reports, oldest first."""
        return iter(list(self._reports.values()))
