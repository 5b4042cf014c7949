"""Run ids: UUIDs whose leading bits are the creation time (version 7, RFC 9562).

A run id is the first column of the keys of ``runs``, ``history``, ``inbox`` and the task
tables. Random (version 4) ids scatter the inserts of new runs over every leaf page of those
indexes; time-ordered ids keep them together at the right-hand edge of each index, so the
pages a start or a completion writes stay in the database's buffer cache however large the
tables grow. (On the benchmark's tables of 200,000 runs, which still fit the machine's
memory, the difference was within the measurement's spread.) The low 74 bits are random, so
ids made in the same millisecond, by any process, still differ.

The random bits come from ``os.urandom`` a page at a time (:class:`Entropy`), not ten bytes per
id: ``os.urandom`` lets go of the GIL for its system call, and a thread taking the GIL back
waits behind every other thread that wants it. Under load that wait was ~0.1 ms of each
``start_workflow`` (a py-spy profile of the I/O batch: 5 % of the starting thread's time on
that one line). A forked child starts with a fresh page, so parent and child never share bits.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


class Entropy:
    """Random bytes from the operating system's generator, fetched ``page`` bytes at a time.

    Thread-safe; ``take`` lets go of the GIL only when it fetches a new page. Bytes are never
    handed out twice, also not across ``fork()``: the child drops the page it inherited."""

    def __init__(self, page: int = 4096, source: Callable[[int], bytes] = os.urandom) -> None:
        self._page, self._source = page, source
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0

    def take(self, n: int) -> bytes:
        with self._lock:
            if self._at + n > len(self._bytes):
                self._bytes, self._at = self._source(max(self._page, n)), 0
            chunk = self._bytes[self._at : self._at + n]
            self._at += n
            return chunk

    def forget(self) -> None:
        """Drop the fetched page (a forked child must not repeat its parent's bits)."""
        self._lock = threading.Lock()  # the parent's may have been held by another thread at fork
        self._bytes, self._at = b"", 0


_ENTROPY = Entropy()
if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_ENTROPY.forget)


def new_run_id(now_ns: int | None = None) -> str:
    """A new run id: a version-7 UUID string (48 bits of Unix milliseconds, then random)."""
    millis = (time.time_ns() if now_ns is None else now_ns) // 1_000_000
    random_bits = int.from_bytes(_ENTROPY.take(10), "big")  # 80 bits; 74 of them are kept
    value = (millis & ((1 << 48) - 1)) << 80 | random_bits
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # the RFC 4122 / 9562 variant
    digits = f"{value:032x}"  # what str(uuid.UUID(int=value)) gives, without building the UUID
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
