"""`aiayn serve`: an HTTP translation server with dynamic batching (see `aiayn.apps.serve.app`).

    from aiayn.apps.serve import ServeConfig, create_app, run_server
    run_server(create_app(translator, ServeConfig(), Path("runs/base")), "127.0.0.1", 8000)

One uvicorn worker; one inference thread owns the model (`aiayn.apps.serve.batcher`).
"""

from __future__ import annotations

import logging
import signal

from fastapi import FastAPI

from aiayn.apps.serve.app import create_app
from aiayn.apps.serve.settings import ServeConfig

__all__ = ["ServeConfig", "create_app", "run_server"]

log = logging.getLogger(__name__)


def run_server(app: FastAPI, host: str, port: int, access_log: bool = True) -> None:
    """Serve `app` until SIGINT or SIGTERM, then drain and return.

    On either signal uvicorn stops accepting connections, waits for the requests in
    flight, and runs the app's shutdown (the batcher decodes what is queued). It then
    raises the signal again for whoever handled it before; the handlers installed
    here take it, so that a SIGTERM ends the process with exit status 0.
    """
    import uvicorn

    def stopped(sig: int, frame: object) -> None:
        log.info("stopped by signal %d", sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopped)
    config = uvicorn.Config(app, host=host, port=port, workers=1, access_log=access_log)
    uvicorn.Server(config).run()
