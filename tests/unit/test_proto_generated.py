"""The committed ``dex/v1`` modules are exactly what ``scripts/gen_proto.py`` makes from ``proto/``.

A ``.proto`` edit without regenerating (or a hand edit of generated code) fails here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("grpc_tools", reason="grpcio-tools is needed to regenerate the protobuf modules")

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path("dex") / "v1"


def _regenerate(out: Path) -> None:
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "gen_proto.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
    )


def test_every_proto_has_a_committed_module() -> None:
    protos = sorted(p.stem for p in (REPO_ROOT / "proto" / PACKAGE).glob("*.proto"))
    assert protos == ["failure", "history", "payload", "retry", "service"]
    committed = sorted(p.name for p in (REPO_ROOT / PACKAGE).glob("*_pb2.py"))
    assert committed == [f"{stem}_pb2.py" for stem in protos]
    # the one proto with a service has its gRPC module too (docs/reference/contract.md §13), and no other has one
    assert sorted(p.name for p in (REPO_ROOT / PACKAGE).glob("*_pb2_grpc.py")) == ["service_pb2_grpc.py"]


def test_committed_modules_match_a_fresh_generation(tmp_path: Path) -> None:
    _regenerate(tmp_path)
    fresh = sorted((tmp_path / PACKAGE).glob("*_pb2.py*")) + sorted((tmp_path / PACKAGE).glob("*_pb2_grpc.py"))
    assert fresh, "protoc wrote nothing"
    assert (tmp_path / PACKAGE / "service_pb2_grpc.py") in fresh
    for path in fresh:
        if path.suffix == ".pyi" and not (REPO_ROOT / PACKAGE / path.name).exists():
            continue  # stubs are optional (mypy-protobuf may be absent where they were generated)
        committed = (REPO_ROOT / PACKAGE / path.name).read_bytes()
        assert committed == path.read_bytes(), f"{PACKAGE / path.name} is stale: run scripts/gen_proto.py"
