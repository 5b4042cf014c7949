"""Who may use the app, and from where (docs/reference/contract.md §12): a token, a session cookie, the same origin.

``Guard`` is an ASGI middleware around the whole app, so a route added later (the remote
workers' ``/v1/activity-tasks``) is covered without doing anything. Without a token the app
serves whoever reaches it, which is why ``dex web`` binds 127.0.0.1 and refuses any other
address without one; it then also refuses a ``Host`` that is not a loopback name, so a web
page whose domain was made to resolve to 127.0.0.1 (DNS rebinding) cannot drive it.

With a token, every request but the sign-in form and the static files needs it: as
``Authorization: Bearer TOKEN`` (API clients), or as the session cookie the sign-in form sets
(the pages). The cookie holds when it was issued and when it expires (``session_lifetime``
after the sign-in, 12 hours by default), signed under a key derived from the token
(:mod:`dex.web.signing`): never the token, never a value that stays good for ever, and one that
changing the token ends. It is HttpOnly and SameSite=Strict, and Secure behind TLS. Tokens and
signatures are compared in constant time (``hmac.compare_digest``). Wrong tokens typed into
the sign-in form are limited per client (:mod:`dex.web.signin_limit`).

A state-changing request (POST, PUT, PATCH, DELETE) is refused with a 403 when the browser
says it comes from another origin: ``Sec-Fetch-Site: cross-site``, or an ``Origin`` (else a
``Referer``) that is not this app's own. Browsers send ``Origin`` with every form post and
``fetch``; a client that sends neither (curl) is not a browser another site could drive.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import timedelta
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.datastructures import Headers
from starlette.responses import RedirectResponse, Response

from dex.web.errors import ApiError, error_response
from dex.web.signing import Signer

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COOKIE = "dex_session"
SESSION = "session"  # the signing purpose of session cookies
DEFAULT_SESSION_LIFETIME = timedelta(hours=12)
CLOCK_SKEW = 60  # seconds a cookie's issue time may lie ahead of this host's clock (replicas)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PATHS = ("/signin", "/static/")  # reachable without the token: the sign-in form and its assets
# the Host names a tokenless app answers: loopback ones, and "testserver", the name Starlette's
# TestClient sends (an in-process call that no browser makes: no page can be served from it
# unless the machine's own resolver says so), so TestClient(create_app(engine)) works as is
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]", "testserver"})
# on every response: the pages load nothing but their own files, run no inline script, and may
# not be framed by another site (whose page could trick a click on an action)
HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; script-src 'self'; style-src 'self'; "
        b"frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)


def session_value(token: str, issued_at: float, lifetime: timedelta = DEFAULT_SESSION_LIFETIME) -> str:
    """What the session cookie of an app with ``token`` holds for a sign-in at ``issued_at``
    (Unix seconds): ``ISSUED.EXPIRES.SIGNATURE``, never the token."""
    return session_cookie(Signer.for_app(token), issued_at, lifetime)


def session_cookie(signer: Signer, issued_at: float, lifetime: timedelta) -> str:
    issued = int(issued_at)
    text = f"{issued}.{issued + max(1, int(lifetime.total_seconds()))}"
    return f"{text}.{signer.signature(SESSION, text)}"


def session_valid(value: str, signer: Signer, now: float) -> bool:
    """Whether ``value`` is a session cookie ``signer`` made that has not expired at ``now``."""
    issued, _, rest = value.partition(".")
    expires, _, signature = rest.partition(".")
    if not (issued.isdigit() and expires.isdigit() and len(issued) < 20 and len(expires) < 20):
        return False
    if not signer.verify(SESSION, f"{issued}.{expires}", signature):
        return False
    return int(issued) <= now + CLOCK_SKEW and now < int(expires)


def token_matches(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("utf-8"))


def root_of(scope: Scope) -> str:
    """Where the app is mounted (``/dex`` inside another app, "" on its own)."""
    return str(scope.get("root_path", "")).rstrip("/")


def route_path(scope: Scope) -> str:
    """The request's path within the app (without the mount point)."""
    path: str = scope.get("path", "")
    root = root_of(scope)
    return path[len(root) :] if root and path.startswith(root) else path


def host_name(host_header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8765`` → ``::1``, ``localhost:80`` → ``localhost``)."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")] if "]" in host_header else host_header
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class Guard:
    """The ASGI middleware that enforces the rules of the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        allowed_hosts: frozenset[str] = LOOPBACK_HOSTS,
        signer: Signer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app, self.token = app, token
        self._signer = signer if signer is not None else Signer.for_app(token)
        self._allowed_hosts = allowed_hosts
        self._clock = clock  # the wall clock: a cookie's times must mean the same after a restart

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *HEADERS]
            await send(message)

        refusal = self.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def refusal(self, scope: Scope) -> Response | None:
        """The response that refuses this request, or None to let it through."""
        headers = Headers(scope=scope)
        path = route_path(scope)
        is_api = path.startswith("/v1")
        host = headers.get("host", "")
        if self.token is None and host_name(host).lower() not in self._allowed_hosts:
            return _refuse(
                is_api, 403, "Forbidden", "this dashboard has no token, so it only answers to a loopback Host"
            )
        if scope.get("method", "GET") not in SAFE_METHODS and not self._same_origin(headers, scope):
            return _refuse(is_api, 403, "Forbidden", "a state-changing request from another origin was refused")
        if self.token is None or path == "/signin" or path.startswith("/static/"):
            return None
        if self._authenticated(headers):
            return None
        if is_api:
            return error_response(ApiError(401, "Unauthorized", "this API needs 'Authorization: Bearer <token>'"))
        target = path + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
        return RedirectResponse(root_of(scope) + "/signin?next=" + quote(target, safe=""), status_code=303)

    def _authenticated(self, headers: Headers) -> bool:
        assert self.token is not None
        authorization = headers.get("authorization", "")
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() == "bearer" and given and token_matches(given.strip(), self.token):
            return True
        cookie = _cookie(headers.get("cookie", ""), COOKIE)
        return cookie is not None and session_valid(cookie, self._signer, self._clock())

    def _same_origin(self, headers: Headers, scope: Scope) -> bool:
        if headers.get("sec-fetch-site", "") == "cross-site":
            return False
        own = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}".lower()
        origin = headers.get("origin")
        if origin is not None and origin != "null":
            return origin.lower().rstrip("/") == own
        if origin == "null":
            return False
        referer = headers.get("referer")
        if referer is not None:
            parts = urlsplit(referer)
            return f"{parts.scheme}://{parts.netloc}".lower() == own
        return True  # no browser sent this (see the module docstring)


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value
    return None


def _refuse(is_api: bool, status: int, kind: str, message: str) -> Response:
    if is_api:
        return error_response(ApiError(status, kind, message))
    return Response(message, status_code=status, media_type="text/plain; charset=utf-8")


def safe_next(target: str | None) -> str:
    """Where the sign-in form goes next: a path of this app only (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
