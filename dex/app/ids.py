"""Run ids: UUIDs whose leading bits are the creation time (version 7, RFC 9562).

A run id is the first column of the keys of ``runs``, ``history``, ``inbox`` and the task
tables. Random (version 4) ids scatter the inserts of new runs over every leaf page of those
indexes; time-ordered ids keep them together at the right-hand edge of each index, so the
pages a start or a completion writes stay in the database's buffer cache however large the
tables grow. (On the benchmark's tables of 200,000 runs, which still fit the machine's
memory, the difference was within the measurement's spread.) The low 74 bits are random, so
ids made in the same millisecond, by any process, still differ.
"""

from __future__ import annotations

import os
import time


def new_run_id(now_ns: int | None = None) -> str:
    """A new run id: a version-7 UUID string (48 bits of Unix milliseconds, then random)."""
    millis = (time.time_ns() if now_ns is None else now_ns) // 1_000_000
    random_bits = int.from_bytes(os.urandom(10), "big")  # 80 bits; 74 of them are kept
    value = (millis & ((1 << 48) - 1)) << 80 | random_bits
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # the RFC 4122 / 9562 variant
    digits = f"{value:032x}"  # what str(uuid.UUID(int=value)) gives, without building the UUID
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
