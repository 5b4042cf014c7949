"""The HTTP side of :class:`dex.remote.worker.Worker`: the four calls of the remote-worker API
(docs/reference/contract.md §13) over ``urllib``, and the backoff its callers wait with.

Standard library only (and ``dex.domain``), so a process with nothing but ``dex-engine``
installed, no ``[web]`` extra, can run a worker. A refused or failed call raises
:class:`WorkerCallError` carrying the HTTP status (0 when no answer came at all: the server is
down, the connection broke, the call timed out), dex's error type and message, and the
``Retry-After`` the server asked for.
"""

from __future__ import annotations

import http.client
import json
import random
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from dex.domain.values import failure_text

# a long poll's answer may take its wait plus the claim; beyond this margin the call is given up
_ANSWER_MARGIN = 30.0
# a short call (complete, fail, heartbeat) that takes longer than this is treated as failed
SHORT_CALL_TIMEOUT = 30.0


class WorkerCallError(Exception):
    """A call of the API that did not succeed. ``status`` is the HTTP status, or 0 when no answer
    came; ``kind`` and ``message`` are dex's ``{"error": {"type", "message"}}`` when it sent one."""

    def __init__(self, status: int, kind: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status or 'no answer'} {kind}: {message}")
        self.status = status
        self.kind = kind
        self.message = message
        self.retry_after = retry_after

    @property
    def lease_lost(self) -> bool:
        """409: the task is no longer ours (the lease lapsed, another worker has it, the run ended)."""
        return self.status == 409

    @property
    def transient(self) -> bool:
        """No answer, or the server or its store failed: the same call may succeed later."""
        return self.status == 0 or self.status == 429 or self.status >= 500


def encode_value(value: Any) -> bytes:
    """``value`` as strict JSON in UTF-8. A value with no such form (a set, NaN, a lone surrogate
    in a string) raises ``TypeError``, ``ValueError`` or ``UnicodeEncodeError`` here, before any
    call is made."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


class ActivityTaskClient:
    """The remote-worker API of one dex server at ``url``, with its bearer ``token``."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self._url = url.rstrip("/") + "/v1/activity-tasks"
        self._headers = {"content-type": "application/json", "accept": "application/json"}
        if token is not None:
            self._headers["authorization"] = f"Bearer {token}"

    def poll(self, worker_id: str, names: list[str], count: int, wait_seconds: float) -> list[dict[str, Any]]:
        """Claim up to ``count`` tasks named in ``names``, waiting up to ``wait_seconds`` for one."""
        body = {"worker_id": worker_id, "names": names, "max": count, "wait_seconds": wait_seconds}
        answer = self._post("/poll", encode_value(body), wait_seconds + _ANSWER_MARGIN)
        if not isinstance(answer, list):
            raise WorkerCallError(200, "BadAnswer", "the poll did not answer a list of tasks")
        return answer

    def heartbeat(self, task_id: int, lease_version: int, worker_id: str) -> bool:
        """Renew the task's lease; True when the run asks the task to stop (``cancel_requested``)."""
        body = {"lease_version": lease_version, "worker_id": worker_id}
        answer = self._post(f"/{task_id}/heartbeat", encode_value(body), SHORT_CALL_TIMEOUT)
        return bool(isinstance(answer, dict) and answer.get("cancel_requested"))

    def complete(self, task_id: int, lease_version: int, worker_id: str, result: bytes) -> None:
        """Report the task's result; ``result`` is its JSON text (see :func:`encode_value`)."""
        head = encode_value({"lease_version": lease_version, "worker_id": worker_id})
        self._post(f"/{task_id}/complete", head[:-1] + b',"result":' + result + b"}", SHORT_CALL_TIMEOUT)

    def fail(
        self,
        task_id: int,
        lease_version: int,
        worker_id: str,
        *,
        kind: str,
        message: str,
        terminal: bool,
        retry_after_seconds: float | None,
    ) -> None:
        """Report the task's failure. The texts are sent as dex keeps them (a lone surrogate as its
        visible escape, at most 40,000 characters), so any exception's text can be sent."""
        error = {
            "type": failure_text(kind) or "Error",
            "message": failure_text(message),
            "terminal": terminal,
            "retry_after_seconds": retry_after_seconds,
        }
        body = {"lease_version": lease_version, "worker_id": worker_id, "error": error}
        self._post(f"/{task_id}/fail", encode_value(body), SHORT_CALL_TIMEOUT)

    def _post(self, path: str, data: bytes, timeout: float) -> Any:
        request = urllib.request.Request(self._url + path, data=data, headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _refusal(exc) from None
        except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, timed out, a cut answer
            raise WorkerCallError(0, type(exc).__name__, str(exc)) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise WorkerCallError(200, "BadAnswer", "the answer is not JSON") from None


def _refusal(exc: urllib.error.HTTPError) -> WorkerCallError:
    kind, message = "HTTPError", str(exc.reason)
    try:
        error = json.loads(exc.read()).get("error", {})
        kind, message = str(error.get("type", kind)), str(error.get("message", message))
    except (OSError, ValueError, AttributeError):
        pass  # not dex's JSON error (a proxy's page, a cut answer): the status says enough
    retry_after: float | None = None
    try:
        header = exc.headers.get("Retry-After") if exc.headers is not None else None
        retry_after = float(header) if header is not None else None
    except ValueError:
        retry_after = None
    return WorkerCallError(exc.code, kind, message, retry_after)


class Backoff:
    """Growing pauses between failed calls: ``initial`` seconds, doubled at each failure up to
    ``maximum``, each drawn between half and all of that (so workers that lost one server do not
    come back in step). A server's ``Retry-After`` is honoured when it asks for longer."""

    def __init__(
        self, initial: float = 0.5, maximum: float = 30.0, uniform: Callable[[float, float], float] | None = None
    ) -> None:
        self._initial = initial
        self._maximum = maximum
        self._uniform = uniform or random.uniform
        self._failures = 0

    def next_pause(self, retry_after: float | None = None) -> float:
        """The pause before the next call, one more failure counted."""
        ceiling = min(self._maximum, self._initial * 2 ** min(self._failures, 32))
        self._failures += 1
        pause = self._uniform(ceiling / 2, ceiling)
        return max(pause, min(retry_after, self._maximum)) if retry_after is not None else pause

    def reset(self) -> None:
        """A call succeeded: the next failure pauses ``initial`` again."""
        self._failures = 0
