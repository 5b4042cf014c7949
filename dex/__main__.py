"""``python -m dex`` / ``dex``: the command line (see :mod:`dex.cli`)."""

from __future__ import annotations

import sys

from dex.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
