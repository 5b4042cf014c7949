"""How secrets are shown: never. The one place a DSN's password or a token is redacted.

Everything that may print or ``repr`` a connection string (the command line's errors, the
PostgreSQL adapter's errors and ``repr``, log lines) shows it through :func:`redact_dsn`, and
driver text that may quote it through :func:`scrub`; a token (``dex web --token``) is only ever
shown as :func:`hidden`. These work on any string, also one that libpq cannot parse or that
holds what cannot be encoded (a NUL, a lone surrogate: what bytes that are not UTF-8 become
on a command line), because an error about such a DSN must not be the one that shows it.

The password is found by the DSN's own syntax, not by libpq (which refuses exactly the DSNs
these errors are about): in a URI, the part of the user information after the first ``:``
and any ``password``/``sslpassword`` query parameter; in ``key=value`` form, the value of
those keys, quoted or not. Redaction errs towards hiding too much: an unterminated quote
hides the rest of the string.
"""

from __future__ import annotations

import re
import urllib.parse

REDACTED = "***"

_SECRET_KEYS = r"(?:ssl)?password"  # libpq's keys whose values are secrets (sslpassword: a client key's)
# postgresql:// or postgres:// then user information: up to the first "@" before any "/" as libpq
# reads it, and up to the last "@" as a user who did not percent-encode an "@" or "/" meant it
_URI_USERINFO = re.compile(r"^(\s*postgres(?:ql)?://)([^@/]*)@", re.IGNORECASE)
_URI_USERINFO_WIDEST = re.compile(r"^(\s*postgres(?:ql)?://)(.*)@", re.IGNORECASE | re.DOTALL)
_URI_PARAM = re.compile(rf"([?&]{_SECRET_KEYS}=)([^&]*)")
# key = value; a value is quoted ('...' with backslash escapes, maybe unterminated) or runs to a space
_PAIR = re.compile(rf"(?<![\w.-])({_SECRET_KEYS}\s*=\s*)('(?:[^'\\]|\\.)*(?:'|\\?$)|(?:[^\s\\]|\\.)*)", re.DOTALL)


def _is_uri(dsn: str) -> bool:
    return re.match(r"\s*postgres(?:ql)?://", dsn, re.IGNORECASE) is not None


def _raw_secrets(dsn: str) -> list[str]:
    """Each secret of ``dsn`` as it is written there."""
    found: list[str] = []
    if _is_uri(dsn):
        for pattern in (_URI_USERINFO, _URI_USERINFO_WIDEST):
            userinfo = pattern.match(dsn)
            if userinfo is not None and ":" in userinfo.group(2):
                found.append(userinfo.group(2).partition(":")[2])
        found.extend(match.group(2) for match in _URI_PARAM.finditer(dsn))
    else:
        found.extend(match.group(2) for match in _PAIR.finditer(dsn))
    return [secret for secret in found if secret]


def _spellings(raw: str, uri: bool) -> set[str]:
    """``raw`` and the forms a driver may show it in: percent-decoded, or unquoted and unescaped."""
    if uri:
        return {raw, urllib.parse.unquote(raw, errors="replace"), urllib.parse.unquote(raw, errors="surrogateescape")}
    unquoted = raw[1:-1] if len(raw) > 1 and raw.startswith("'") and raw.endswith("'") else raw.lstrip("'")
    return {raw, unquoted, re.sub(r"\\(.)", r"\1", unquoted)}


def secrets_of(dsn: str) -> list[str]:
    """Every spelling of every secret ``dsn`` holds, the longest first (so that a secret holding
    another is replaced whole)."""
    uri = _is_uri(dsn)
    spellings = {spelling for raw in _raw_secrets(dsn) for spelling in _spellings(raw, uri)}
    return sorted((s for s in spellings if s), key=len, reverse=True)


def printable(text: str) -> str:
    """``text`` as one line that any terminal and encoder takes: control characters (a NUL, a
    newline) and lone surrogates as backslash escapes."""
    escaped = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in escaped)


def redact_dsn(dsn: object) -> str:
    """``dsn`` as it may be shown: every secret replaced by ``***``, the rest printable."""
    if not isinstance(dsn, str):
        return f"<{type(dsn).__name__}, not a DSN>"
    return printable(without_secrets(dsn))


def without_secrets(dsn: str) -> str:
    """``dsn`` with every secret replaced by ``***``, otherwise as it is (not yet printable)."""
    if _is_uri(dsn):
        shown = _URI_USERINFO_WIDEST.sub(lambda m: m.group(1) + _without_password(m.group(2)) + "@", dsn, count=1)
        return _URI_PARAM.sub(lambda m: m.group(1) + REDACTED, shown)
    return _PAIR.sub(lambda m: m.group(1) + REDACTED, dsn)


def _without_password(userinfo: str) -> str:
    user, colon, _password = userinfo.partition(":")
    return f"{user}:{REDACTED}" if colon else user


def scrub(text: str, dsn: str) -> str:
    """``text`` (a driver's message, say) with every spelling of ``dsn``'s secrets replaced by ``***``."""
    for secret in secrets_of(dsn):
        text = text.replace(secret, REDACTED)
    return text


def hidden(secret: object) -> str:
    """What is shown of a token: that one was given, never any of it."""
    return "<hidden>" if secret else "<empty>"


def token_problem(token: object) -> str | None:
    """Why ``token`` cannot be an access token (``dex web``, the gRPC server), in words that
    never quote it; None if it can be one. A token must be a non-empty printable str without
    surrounding spaces: a NUL, a newline or a lone surrogate could not cross an HTTP header."""
    if not isinstance(token, str):
        return f"a token must be a str, got {type(token).__name__}"
    if not token or token != token.strip() or not token.isprintable():
        # a lone surrogate is no printable character, so this refuses one too
        return "a token must be a non-empty printable string without surrounding spaces"
    return None
