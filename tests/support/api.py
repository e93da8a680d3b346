"""The HTTP API for tests: the app in process (Starlette's TestClient), keys made as
`contextlog keys create` makes them, and a local receiver for webhooks."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from starlette.testclient import TestClient

from contextlog.worker.api import keys
from contextlog.worker.api.app import build_app
from contextlog.worker.api.routes import ENDPOINTS
from contextlog.worker.api.services import Services
from contextlog.worker.app import bootstrap
from contextlog.worker.app.config import Settings


def make_key(
    database_url: str,
    agents: list[str],
    rights: str = "post,read,sessions",
    channels: list[str] | None = None,
) -> str:
    """A new key's token."""
    with psycopg.connect(database_url) as conn:
        return keys.create(conn, "test", agents, channels, rights.split(","))


@dataclass
class Api:
    """A client of the app, and what it was built with."""

    client: TestClient
    services: Services
    settings: Settings

    def headers(self, token: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", **extra}


@contextmanager
def serving(settings: Settings) -> Iterator[Api]:
    """The app on `settings`, its lifespan run (clients opened and closed)."""
    services = bootstrap.build_api_services(settings)
    app = build_app(services, ENDPOINTS)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Api(client, services, settings)


@dataclass
class Received:
    """What a webhook receiver got: (headers, body) per request."""

    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    status: int = 200


@contextmanager
def receiver(status: int = 200) -> Iterator[tuple[str, Received]]:
    """A local HTTP server that records POSTs and answers `status`; yields its URL."""
    got = Received(status=status)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            got.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(got.status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", got
    finally:
        server.shutdown()
        server.server_close()
