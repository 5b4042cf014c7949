"""Values the app hands out and must get back unchanged: paging cursors, the note a page shows
after an action, the sign-in cookie.

Each is signed with an HMAC-SHA256 under the app's key and a purpose (so a value signed as one
thing is never taken for another), and what comes back with a signature that does not match is
refused before it is read: a forged cursor cannot ask the store for more rows than the pages so
far have shown, and a link cannot make a page say what the app never said.

With a token, the key is derived from it (an HMAC of a fixed label under the token), so the
cursors and sessions of one token stay valid across restarts and replicas, and changing the
token ends them all. Without one, the key is random per app: a cursor from before a restart is
refused (the client starts from the first page again).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets


class Signer:
    """Signs text for a purpose and checks such signatures (in constant time)."""

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) < 16:
            raise ValueError("a signing key must be at least 16 bytes")
        self._key = key

    @classmethod
    def for_app(cls, token: str | None) -> Signer:
        """The signer of an app with ``token`` (see the module docstring)."""
        if token is None:
            return cls(secrets.token_bytes(32))
        return cls(hmac.new(token.encode("utf-8"), b"dex web signing key v1", hashlib.sha256).digest())

    def signature(self, purpose: str, text: str) -> str:
        """The signature of ``text`` for ``purpose``: 43 URL-safe characters."""
        message = purpose.encode("utf-8") + b"\x00" + text.encode("utf-8", "surrogatepass")
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")

    def verify(self, purpose: str, text: str, signature: str) -> bool:
        """Whether ``signature`` is this signer's for ``text`` and ``purpose``."""
        expected = self.signature(purpose, text)
        return hmac.compare_digest(expected.encode("ascii"), signature.encode("utf-8", "surrogateescape"))
