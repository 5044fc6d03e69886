"""`aiayn serve`: an HTTP translation server with dynamic batching (see `aiayn.apps.serve.app`).

    from aiayn.apps.serve import ServeConfig, create_app, run_server
    run_server(create_app(translator, ServeConfig(), Path("runs/base")), "127.0.0.1", 8000)

One uvicorn worker; one inference thread owns the model (`aiayn.apps.serve.batcher`).
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
from typing import Any

from fastapi import FastAPI

from aiayn.apps.serve.app import create_app
from aiayn.apps.serve.protocol import header_timeout_protocol
from aiayn.apps.serve.settings import ServeConfig

__all__ = ["ServeConfig", "ServerError", "create_app", "listen", "run_server", "uvicorn_config"]

log = logging.getLogger(__name__)


class ServerError(Exception):
    """The server could not start (its address), or stopped serving (its inference thread)."""


def uvicorn_config(app: FastAPI, **options: Any) -> Any:
    """uvicorn's `Config` for `app` (made by `create_app`): one worker, and HTTP/1.1 whose
    request line and headers must arrive within the app's `header_timeout_s`.

    Args:
        options: more of `uvicorn.Config`'s arguments (host, port, access_log, ...).
    """
    import uvicorn

    settings: ServeConfig = app.state.settings
    http = header_timeout_protocol(settings.header_timeout_s)
    return uvicorn.Config(app, workers=1, http=http, **options)


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address `host` names, at `port` (as uvicorn would bind them).

    Raises:
        ServerError: an address that is not this machine's, or a port in use, naming
            the address and the fix.
    """
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as err:
        raise ServerError(
            f"--host {host!r}: not an address to listen on ({err}); give an address of "
            "this machine, such as 127.0.0.1 or 0.0.0.0"
        ) from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.set_inheritable(True)
    except OSError as err:
        for sock in sockets:
            sock.close()
        fixes = {
            errno.EADDRINUSE: "choose another --port, or stop what holds it",
            errno.EACCES: "ports below 1024 need privileges: choose a --port of 1024 or more",
            errno.EADDRNOTAVAIL: "give an address of this machine as --host",
        }
        fix = fixes.get(err.errno, "check --host and --port")
        raise ServerError(
            f"cannot listen on {host}:{port} ({err.strerror or err}); {fix}"
        ) from None
    return sockets


def run_server(app: FastAPI, host: str, port: int, access_log: bool = True) -> None:
    """Serve `app` until SIGINT or SIGTERM, then drain and return.

    On either signal uvicorn stops accepting connections, waits for the requests in
    flight, and runs the app's shutdown (the batcher decodes what is queued). It then
    raises the signal again for whoever handled it before; the handlers installed
    here take it, so that a SIGTERM ends the process with exit status 0.

    Raises:
        ServerError: the address cannot be listened on (before anything starts), or
            the inference thread stopped: the server then shuts down, so that the
            process exits non-zero and a supervisor restarts it.
    """
    import uvicorn

    sockets = listen(host, port)

    def stopped(sig: int, frame: object) -> None:
        log.info("stopped by signal %d", sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopped)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:  # uvicorn says so only for the sockets it binds itself
                where = f"[{host}]" if ":" in host else host
                uvicorn_log.info("Uvicorn running on http://%s:%d (CTRL+C to quit)", where, port)

    uvicorn_log = logging.getLogger("uvicorn.error")
    server = Server(uvicorn_config(app, host=host, port=port, access_log=access_log))

    def fatal() -> None:  # on the inference thread: uvicorn polls should_exit
        server.should_exit = True

    app.state.batcher.on_fatal = fatal
    try:
        server.run(sockets=sockets)
    except SystemExit as exit:  # uvicorn's own startup failure (it logged why)
        if exit.code:
            raise ServerError(
                f"the server did not start (uvicorn's exit status {exit.code})"
            ) from None
    finally:
        for sock in sockets:
            sock.close()
    failure = app.state.batcher.failure
    if failure is not None:
        raise ServerError(
            f"the inference thread stopped ({type(failure).__name__}: {failure}); the server "
            "shut down so that it can be restarted"
        )
