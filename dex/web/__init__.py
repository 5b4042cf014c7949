"""dex's web dashboard and JSON API (docs/reference/contract.md §12): ``pip install "dex-engine[web]"``.

``create_app(adapter_or_engine, token=None)`` returns an ASGI application (Starlette) to serve
with uvicorn (``dex web`` does) or to mount in one's own Starlette or FastAPI application.
The core package never imports this one: its dependencies (starlette, jinja2) are optional.
"""

from dex.web.app import create_app
from dex.web.operations import Operation, Param

__all__ = ["Operation", "Param", "create_app"]
