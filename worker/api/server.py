"""`contextlog api`: the app on uvicorn (httptools and uvloop), one process.

Chosen by measurement (tests/bench/frameworks.py; README): Starlette on uvicorn answered
a post and a 100-message context read in ~0.2 ms at p50, against ~0.26 ms for Litestar
on uvicorn and ~0.3-0.6 ms for the others tried. The OpenAPI document is generated from
the same msgspec types the handlers decode (`spec.py`), which a framework's own generator
would otherwise do for us. Scale out with more processes behind a balancer.
"""

from __future__ import annotations

import uvicorn
from starlette.applications import Starlette

from contextlog.worker.api.app import build_app
from contextlog.worker.api.routes import ENDPOINTS
from contextlog.worker.app import bootstrap
from contextlog.worker.app.clock import Clock
from contextlog.worker.app.config import Settings


def app(settings: Settings, clock: Clock | None = None) -> Starlette:
    """The API app for `settings` (its clients open with the app's lifespan)."""
    return build_app(bootstrap.build_api_services(settings, clock), ENDPOINTS)


def serve(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT (uvicorn finishes the requests in flight)."""
    config = uvicorn.Config(
        app(settings),
        host=settings.api_bind,
        port=settings.api_port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=settings.log_level,
        timeout_graceful_shutdown=10,
        server_header=False,
    )
    uvicorn.Server(config).run()
