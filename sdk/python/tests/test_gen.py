"""The committed protocol stubs match what gen.sh makes from the canonical proto."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent.parent
PROTO = HERE.parent.parent / "crates" / "gnomon-proto" / "proto" / "gnomon" / "worker" / "v1" / "worker.proto"
COMMITTED = HERE / "src" / "gnomon_worker" / "_pb"
GENERATED = ["worker_pb2.py", "worker_pb2.pyi", "worker_pb2_grpc.py"]


@pytest.mark.skipif(not PROTO.exists(), reason="the canonical proto is not beside this checkout")
def test_the_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    subprocess.run(["bash", str(HERE / "gen.sh"), str(tmp_path)], check=True,
                   env={**os.environ, "PYTHON": sys.executable})
    stale = [name for name in GENERATED
             if (tmp_path / name).read_bytes() != (COMMITTED / name).read_bytes()]
    assert not stale, f"{stale} differ from worker.proto: run sdk/python/gen.sh and commit the result"


def test_the_grpc_stub_imports_its_messages_from_the_package() -> None:
    text = (COMMITTED / "worker_pb2_grpc.py").read_text()
    assert "from . import worker_pb2 as" in text
    assert "from gnomon.worker" not in text
