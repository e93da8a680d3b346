"""A Messages API on a real socket that misbehaves on request, for the worker's fault tests.

Each request picks its behaviour from a marker in its body: a conversation whose messages
say `fault:drip` gets a server that drips its answer one byte at a time. The summary
prompt carries the transcript, so one server serves many conversations, each with its
own fault, at once. A request without a marker gets a normal answer.

    with FaultyAPIServer() as api:            # point ANTHROPIC_BASE_URL at api.url
        producer.post_message(agent, "c1", "user", "fault:huge")

Add a behaviour: a method `_fault_<name>(handler, body)` (the marker is `fault:<name>`).
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tests.support.fake_anthropic import DEFAULT_TEXT, check_request, error_body, message_body

MARKER = re.compile(rb"fault:([a-z0-9_]+)")
HUGE_CHARS = 300_000  # above the 200,000 characters a summary event may hold
DRIP_INTERVAL_S = 2.0
SLOW_S = 4.0

Handler = BaseHTTPRequestHandler


class FaultyAPIServer:
    """Serves `POST /v1/messages` on 127.0.0.1, misbehaving as each request's marker says."""

    def __init__(self, *, drip_interval: float = DRIP_INTERVAL_S, slow: float = SLOW_S) -> None:
        self.drip_interval = drip_interval
        self.slow = slow
        self.requests: Counter[str] = Counter()  # behaviour -> requests received
        self.in_flight: Counter[str] = Counter()  # behaviour -> requests being answered
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="faulty-api", daemon=True
        )

    def __enter__(self) -> FaultyAPIServer:
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing.set()  # drips stop writing
        self._httpd.shutdown()
        self._thread.join()
        self._httpd.server_close()

    def seen(self, behaviour: str) -> int:
        """Requests received for `behaviour`."""
        with self._lock:
            return self.requests[behaviour]

    def busy(self, behaviour: str) -> int:
        """Requests for `behaviour` being answered right now."""
        with self._lock:
            return self.in_flight[behaviour]

    # -- serving -----------------------------------------------------------------------
    def _handle(self, handler: Handler) -> None:
        raw = handler.rfile.read(int(handler.headers.get("content-length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        problems = check_request(body)
        if handler.path.split("?")[0] != "/v1/messages" or problems:
            _send_json(handler, 400, error_body(400, "; ".join(problems) or handler.path))
            return
        found = MARKER.search(raw)
        behaviour = found.group(1).decode() if found else "ok"
        fault: Callable[[Handler, dict[str, Any]], None] = getattr(
            self, f"_fault_{behaviour}", self._fault_ok
        )
        with self._lock:
            self.requests[behaviour] += 1
            self.in_flight[behaviour] += 1
        try:
            fault(handler, body)
        except OSError:
            pass  # the client gave up (a timeout): that is what some faults are for
        finally:
            with self._lock:
                self.in_flight[behaviour] -= 1

    def _fault_ok(self, handler: Handler, body: dict[str, Any]) -> None:
        _send_json(handler, 200, message_body(DEFAULT_TEXT, body["model"]))

    def _fault_slow(self, handler: Handler, body: dict[str, Any]) -> None:
        """A correct answer after `slow` seconds: a window to kill the worker in."""
        self._closing.wait(self.slow)
        self._fault_ok(handler, body)

    def _fault_drip(self, handler: Handler, body: dict[str, Any]) -> None:
        """Headers at once, then the body one byte every `drip_interval` seconds: each
        read succeeds well within a read timeout, the whole answer takes minutes."""
        payload = json.dumps(message_body(DEFAULT_TEXT, body["model"])).encode()
        _send_head(handler, 200, len(payload))
        for i in range(len(payload)):
            handler.wfile.write(payload[i : i + 1])
            handler.wfile.flush()
            if self._closing.wait(self.drip_interval):
                return

    def _fault_huge(self, handler: Handler, body: dict[str, Any]) -> None:
        """A 200 whose text is longer than any event may carry."""
        text = ("A very long summary. " * (HUGE_CHARS // 20 + 1))[:HUGE_CHARS]
        _send_json(handler, 200, message_body(text, body["model"]))

    def _fault_nul(self, handler: Handler, body: dict[str, Any]) -> None:
        """A 200 whose text holds U+0000, which Postgres text and jsonb refuse."""
        _send_json(handler, 200, message_body("before\u0000after the NUL", body["model"]))

    def _fault_e400(self, handler: Handler, body: dict[str, Any]) -> None:
        _send_json(handler, 400, error_body(400, "fake 400: not retryable"))

    def _fault_e500(self, handler: Handler, body: dict[str, Any]) -> None:
        _send_json(handler, 500, error_body(500, "fake 500, every time"))

    def _fault_e429(self, handler: Handler, body: dict[str, Any]) -> None:
        _send_json(handler, 429, error_body(429, "fake rate limit"), {"retry-after": "1"})

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                server._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the test output is not the place for an access log."""

        return _Handler


def _send_head(
    handler: Handler, status: int, length: int, headers: dict[str, str] | None = None
) -> None:
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(length))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.flush()


def _send_json(
    handler: Handler, status: int, body: object, headers: dict[str, str] | None = None
) -> None:
    payload = json.dumps(body).encode()
    _send_head(handler, status, len(payload), headers)
    handler.wfile.write(payload)
    handler.wfile.flush()
