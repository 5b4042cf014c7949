"""``dex web``: serve the dashboard and the JSON API (docs/reference/contract.md §12) over the configured database.

It binds 127.0.0.1 by default, and refuses any other address unless a token is given
(``--token``, or ``DEX_WEB_TOKEN``, which keeps the token out of the process list): without
one, anyone who can reach the port could cancel runs. The socket is bound before the URL is
printed, so ``--port 0`` prints the port the system chose, and a port in use is one line of
error, not a traceback from the server. The token is never printed.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable
from typing import Any

import click

from dex.cli.database import CommandError, UsageProblem, connection_options, open_engine, progress
from dex.cli.params import SECRET, TEXT, TextPath
from dex.cli.serving import stop_when_set, until_signalled
from dex.views.secrets import token_problem

MISSING_EXTRA = 'the web dashboard needs the web extra: pip install "dex-engine[web]"'
MISSING_GRPC = '--grpc-port needs the grpc extra: pip install "dex-engine[grpc]"'


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (one line of error if it cannot be had)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageProblem(f"--host {host!r} is not an address this machine has: {exc}") from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


@click.command("web")
@connection_options
@click.option("--host", default="127.0.0.1", show_default=True, type=TEXT, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free one).")
@click.option(
    "--token",
    envvar="DEX_WEB_TOKEN",
    type=SECRET,
    help="Require this token (Authorization: Bearer, or the sign-in form) [default: $DEX_WEB_TOKEN]. "
    "Needed to listen on any address but loopback.",
)
@click.option(
    "--grpc-port",
    type=click.IntRange(0, 65535),
    help="Also serve the remote workers' gRPC API on this port of the same host (needs the grpc extra).",
)
@click.option(
    "--docs-url",
    envvar="DEX_DOCS_URL",
    metavar="URL",
    type=TEXT,
    default="/docs/",
    help="Base URL of the documentation site, for the pages' Docs link [default: $DEX_DOCS_URL, else /docs/ "
    "on this host].",
)
@click.option(
    "--docs-dir",
    metavar="DIR",
    type=TextPath(file_okay=False, exists=True),
    help="A built documentation site (mkdocs build) to serve under /docs/.",
)
def web(host: str, port: int, token: str | None, grpc_port: int | None, docs_url: str, docs_dir: str | None) -> None:
    """Serve the web dashboard and the JSON API (under /v1) until Ctrl-C."""
    try:
        import uvicorn

        from dex.remote.service import ActivityTaskService
        from dex.web import create_app
        from dex.web.docs_link import docs_url_problem
    except ImportError:
        raise UsageProblem(MISSING_EXTRA) from None
    serve_grpc: Callable[..., Any] | None = None
    if grpc_port is not None:
        try:
            from dex.remote.grpc_server import serve_grpc as serve
        except ImportError:
            raise UsageProblem(MISSING_GRPC) from None
        serve_grpc = serve
    if token is not None and (problem := token_problem(token)) is not None:
        raise UsageProblem(f"--token (not shown): {problem}")
    if (problem := docs_url_problem(docs_url)) is not None:
        raise UsageProblem(f"--docs-url: {problem}")
    if docs_dir is not None and not os.path.isfile(os.path.join(docs_dir, "index.html")):
        raise UsageProblem(f"--docs-dir: {docs_dir} holds no built site (no index.html): run mkdocs build")
    if not is_loopback(host) and not token:
        raise UsageProblem(
            f"refusing to serve on {host}, which is not a loopback address, without a token: pass --token "
            "(or set DEX_WEB_TOKEN), or serve on 127.0.0.1"
        )
    with open_engine() as engine:
        service = ActivityTaskService(engine)
        app = create_app(
            engine, token=token or None, activity_task_service=service, docs_url=docs_url, docs_dir=docs_dir
        )
        sock = listen(host, port)
        grpc_server = None
        if serve_grpc is not None:
            try:
                grpc_server = serve_grpc(service, host, grpc_port or 0, token=token or None)
            except (OSError, RuntimeError) as exc:
                sock.close()
                raise CommandError(f"cannot serve gRPC on {host}:{grpc_port}: {exc}") from None
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        server = uvicorn.Server(config)
        click.echo(f"serving the dex dashboard at {url_of(sock)}" + (" (token required)" if token else ""))
        if grpc_server is not None:
            click.echo(f"serving the remote workers' gRPC API at {host}:{grpc_server.port}")
        progress("press Ctrl-C to stop")
        try:
            with until_signalled() as stop:
                stop_when_set(stop, server, "dex-web-stop")
                server.run(sockets=[sock])
        finally:
            sock.close()
            if grpc_server is not None:
                grpc_server.stop(grace=1)
