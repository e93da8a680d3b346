"""The HTTP API for tests: the app in process (Starlette's TestClient), keys made as
`contextlog keys create` makes them, and a local receiver for webhooks."""

from __future__ import annotations

import http.server
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from starlette.testclient import TestClient

from contextlog.worker.api import keys
from contextlog.worker.api.app import build_app
from contextlog.worker.api.routes import ENDPOINTS
from contextlog.worker.api.services import Services
from contextlog.worker.app import bootstrap
from contextlog.worker.app.config import Settings
from tests.support.processes import Process, offline_env
from tests.support.running import eventually
from tests.support.servers import free_port


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


def healthy(url: str) -> bool:
    """Whether a `contextlog api` answers its health check at `url`."""
    try:
        with urllib.request.urlopen(url + "/v1/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@contextmanager
def api_process(
    database_url: str, redis_url: str, log: Path, **extra: str
) -> Iterator[tuple[str, Process]]:
    """A `contextlog api` process (as in the Procfile) on a free port, once it answers."""
    port = free_port()
    env = offline_env(
        database_url,
        redis_url,
        CONTEXTLOG_API_PORT=str(port),
        CONTEXTLOG_LOG_LEVEL="warning",
        **extra,
    )
    api = Process("api", env, log).start()
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: healthy(url), timeout=60, what=f"contextlog api\n{api.tail()}")
        yield url, api
    finally:
        api.stop()


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
