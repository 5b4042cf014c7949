"""The kept connection's liveness check: a socket with something to read (data, or the peer gone)
is told from an idle one, without waiting and, on POSIX, without letting go of the GIL."""

from __future__ import annotations

import ctypes
import os
import socket

import pytest

from dex.adapters.postgres import connection


def test_an_idle_socket_is_not_readable_and_one_with_data_or_a_closed_peer_is() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert connection._readable(ours.fileno()) is False
        theirs.sendall(b"N")  # a notice, say
        assert connection._readable(ours.fileno()) is True
        ours.recv(1)
        assert connection._readable(ours.fileno()) is False
        theirs.close()  # the server went away
        assert connection._readable(ours.fileno()) is True


def test_a_closed_descriptor_counts_as_readable_so_the_full_check_runs() -> None:
    ours, theirs = socket.socketpair()
    fd = ours.fileno()
    ours.close()
    theirs.close()
    assert connection._readable(fd) is True  # poll() reports POLLNVAL: not a usable connection


@pytest.mark.skipif(os.name != "posix", reason="poll() is POSIX")
def test_on_posix_the_check_is_libcs_poll_called_with_the_gil_held() -> None:
    poll = connection._POLL
    assert poll is not None
    # a PyDLL function: ctypes calls it without releasing the GIL
    assert poll._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]
