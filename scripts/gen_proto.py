"""Regenerate the protobuf modules in ``dex/v1/`` from ``proto/dex/v1/*.proto``.

Run from the repository root after changing a ``.proto`` file::

    .venv/bin/python scripts/gen_proto.py            # writes dex/v1/*_pb2.py, *_pb2.pyi, *_pb2_grpc.py
    .venv/bin/python scripts/gen_proto.py --out DIR  # writes DIR/dex/v1/... instead

It runs the ``protoc`` that ships with grpcio-tools, so the output depends only on that
package's version; ``tests/unit/test_proto_generated.py`` checks that the committed modules
match. A proto that defines a service (``service.proto``) also gets its gRPC module
(``*_pb2_grpc.py``, from grpcio-tools' own plugin). The ``.pyi`` stubs come from mypy-protobuf's ``protoc-gen-mypy`` plugin when it is
installed (next to this Python or on ``PATH``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_PACKAGE = Path("dex") / "v1"


def proto_files() -> list[Path]:
    """The ``.proto`` sources, relative to ``proto/``, in a stable order."""
    return sorted(p.relative_to(PROTO_ROOT) for p in (PROTO_ROOT / PROTO_PACKAGE).glob("*.proto"))


def find_mypy_plugin() -> str | None:
    """The ``protoc-gen-mypy`` executable beside this interpreter or on ``PATH``, if any."""
    beside = Path(sys.executable).parent / "protoc-gen-mypy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("protoc-gen-mypy")


def generate(out_dir: Path, *, stubs: bool = True) -> list[Path]:
    """Compile every proto into ``out_dir``; return the files written (relative to ``out_dir``).

    ``stubs=False`` skips the ``.pyi`` files even when the mypy plugin is available.
    """
    from grpc_tools import (
        protoc,  # imported here so that --help works without grpcio-tools
    )

    include = Path(protoc.__file__).parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out_dir}"]
    plugin = find_mypy_plugin() if stubs else None
    if plugin is not None:
        args += [f"--plugin=protoc-gen-mypy={plugin}", f"--mypy_out={out_dir}"]
    sources = proto_files()
    # protoc resolves relative sources against the -I roots; run it from proto/ so that the
    # paths it records in the generated modules do not depend on where the repo lives.
    completed = subprocess.run(
        [sys.executable, "-m", *args, *(str(s) for s in sources)],
        cwd=PROTO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"protoc failed ({completed.returncode}):\n{completed.stderr}")
    services = [s for s in sources if "\nservice " in (PROTO_ROOT / s).read_text()]
    if services:  # gRPC stubs only where there is a service: the message modules stay as they were
        completed = subprocess.run(
            [sys.executable, "-m", *args[:3], f"--grpc_python_out={out_dir}", *(str(s) for s in services)],
            cwd=PROTO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(f"protoc (grpc) failed ({completed.returncode}):\n{completed.stderr}")
    written = []
    for source in sources:
        stem = source.with_suffix("")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            candidate = stem.parent / f"{stem.name}{suffix}"
            if (out_dir / candidate).is_file():
                written.append(candidate)
    return written


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: the repo root)")
    parser.add_argument("--no-stubs", action="store_true", help="do not write .pyi stubs")
    options = parser.parse_args(argv)
    for path in generate(options.out, stubs=not options.no_stubs):
        print(options.out / path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
