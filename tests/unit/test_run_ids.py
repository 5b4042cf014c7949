"""Run ids are version-7 UUIDs: time-ordered across milliseconds, unique within one; their random
bits come from the OS a page at a time, never twice, also not across fork()."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from dex.app.ports.ids import Entropy, new_run_id


def test_a_run_id_is_a_version_7_uuid_string() -> None:
    run_id = new_run_id()
    parsed = uuid.UUID(run_id)
    assert str(parsed) == run_id
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122


def test_run_ids_sort_by_their_creation_millisecond() -> None:
    base = 1_795_000_000_000 * 1_000_000  # nanoseconds
    ids = [new_run_id(base + step * 1_000_000) for step in range(0, 2000, 7)]
    assert ids == sorted(ids)
    assert uuid.UUID(ids[0]).int >> 80 == 1_795_000_000_000  # the leading 48 bits are the milliseconds


def test_run_ids_made_in_one_millisecond_differ() -> None:
    ids = {new_run_id(1_795_000_000_000_000_000) for _ in range(10_000)}
    assert len(ids) == 10_000


def test_entropy_hands_out_each_byte_once_and_fetches_a_new_page_when_one_runs_out() -> None:
    fetched: list[int] = []

    def source(n: int) -> bytes:
        fetched.append(n)
        return os.urandom(n)

    entropy = Entropy(page=25, source=source)
    chunks = [entropy.take(10) for _ in range(5)]  # 2 per page of 25: the rest of a page is not split
    assert fetched == [25, 25, 25]
    assert all(len(chunk) == 10 for chunk in chunks)
    assert len(set(chunks)) == 5
    assert entropy.take(40) and fetched[-1] == 40  # a request larger than a page gets a page of its own


def test_entropy_is_shared_safely_between_threads() -> None:
    entropy = Entropy(page=64)
    taken: list[bytes] = []

    def worker() -> None:
        for _ in range(2000):
            taken.append(entropy.take(10))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(taken) == 8000
    assert len(set(taken)) == 8000  # no chunk handed out twice


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_does_not_repeat_its_parents_random_bits() -> None:
    new_run_id()  # the parent has a page in hand
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write_end, "".join(new_run_id(0)[-12:] for _ in range(20)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = "".join(new_run_id(0)[-12:] for _ in range(20))
    assert len(child) == len(parent) == 240
    assert child != parent  # the child fetched its own page
