"""Where the dashboard's "Docs" link goes: the documentation site's page about the dashboard.

The site (``mkdocs build``, see README.md) is served under ``/docs/`` when the dashboard is
given the built directory (``create_app(docs_dir=...)``, ``dex web --docs-dir``); without it,
``/docs/`` answers a page saying how to build and serve it. Or it lives wherever you publish
it: ``create_app(..., docs_url=...)`` (``dex web --docs-url``, or
``DEX_DOCS_URL``) names its base URL; the link is that base plus the page's path in the site.
The default base, ``/docs/``, is a path on the dashboard's own host: a reverse proxy in front
of the dashboard that serves the built site there makes the link work with no setting at all.
Only a path or an http(s) URL is taken, so the link cannot be made to run script
(``javascript:``) or leave the web.
"""

from __future__ import annotations

import os

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from dex.web.pages import render

DEFAULT_DOCS_URL = "/docs/"
# the dashboard's page in the site (mkdocs.yml; tests/docs/test_site.py checks it is built)
DASHBOARD_PAGE = "how-to/web-dashboard/"


def docs_url_problem(url: object) -> str | None:
    """Why ``url`` cannot be the documentation's base URL, or None when it can."""
    if not isinstance(url, str):
        return f"docs_url must be a string, got {type(url).__name__}"
    if not url.startswith(("/", "http://", "https://")) or url.startswith("//"):
        return f"docs_url must be a path (/docs/) or an http(s) URL, got {url!r}"
    if not url.isprintable() or any(c.isspace() for c in url) or any(c in url for c in "\"'<>`\\"):
        return "docs_url must be printable, without spaces, quotes, angle brackets or backslashes"
    return None


def dashboard_docs_link(docs_url: str) -> str:
    """The link to the dashboard's page of the documentation whose base URL is ``docs_url``."""
    return docs_url.rstrip("/") + "/" + DASHBOARD_PAGE


def docs_mount(docs_dir: str | os.PathLike[str] | None) -> BaseRoute:
    """``/docs``: the built site in ``docs_dir``, or the page that says how to get it."""
    if docs_dir is not None:
        return Mount("/docs", app=StaticFiles(directory=os.fspath(docs_dir), html=True), name="docs")

    async def missing(request: Request) -> Response:
        return render(request, "docs_missing.html")

    return Route("/docs/{rest:path}", missing, methods=["GET"])
