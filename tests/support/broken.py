"""Servers that misbehave, for the CLI's outage tests: a TCP listener on 127.0.0.1 that

- `silent`: accepts connections and never answers (a stalled host, a full disk);
- `closes`: accepts and hangs up at once (a crashing or overloaded server);
- `errors`: speaks just enough of the protocol to refuse everything: a Redis answering each
  command with an error, a Postgres answering the start-up with FATAL 57P03 (the database
  system is starting up), an HTTP server answering 500.

`unreachable_url` gives a port with nothing listening.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from typing import Final

from tests.support.servers import free_port

MODES: Final = ("silent", "closes", "errors")
REDIS_ERROR: Final = b"-ERR contextlog test: injected failure\r\n"
_PG_DECLINE: Final = (80877103, 80877104)  # SSLRequest, GSSENCRequest: answered "N"
_API_ERROR: Final = b'{"type":"error","error":{"type":"api_error","message":"injected"}}'
_HTTP_500: Final = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_API_ERROR), _API_ERROR)
)


def url_for(kind: str, port: int) -> str:
    """A URL of `kind` (redis, postgres, http) on 127.0.0.1:`port`."""
    return {
        "redis": f"redis://127.0.0.1:{port}/0",
        "postgres": f"postgresql://postgres@127.0.0.1:{port}/postgres",
        "http": f"http://127.0.0.1:{port}",
    }[kind]


def unreachable_url(kind: str) -> str:
    """A URL whose port refuses connections."""
    return url_for(kind, free_port())


class BrokenServer:
    """A listener that misbehaves as `mode` says, for a server of `kind`."""

    def __init__(self, kind: str, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}: {mode!r}")
        self.kind, self.mode = kind, mode
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.url = url_for(kind, self._listener.getsockname()[1])
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> BrokenServer:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        for s in self._held:
            with contextlib.suppress(OSError):
                s.close()
        self._listener.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name=f"broken-{self.mode}")
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.mode == "closes":
                conn.close()
            elif self.mode == "silent":
                self._held.append(conn)  # open, unread, unanswered until the test ends
            else:
                self._held.append(conn)
                self._spawn(self._refuse, conn)

    def _refuse(self, conn: socket.socket) -> None:
        conn.settimeout(0.1)
        answer = {"redis": _redis_errors, "postgres": _postgres_fatal, "http": _http_500}
        with contextlib.suppress(OSError):
            answer[self.kind](conn, self._stop)


def _recv(conn: socket.socket, stop: threading.Event) -> bytes:
    """The next bytes from `conn` (b"" when it closed or the test ends)."""
    while not stop.is_set():
        try:
            return conn.recv(65536)
        except TimeoutError:
            continue
    return b""


def _redis_errors(conn: socket.socket, stop: threading.Event) -> None:
    """One error for each command (a pipeline's too), however the bytes arrive."""
    buffer = b""
    while data := _recv(conn, stop):
        buffer += data
        while (command := _one_command(buffer)) is not None:
            buffer = buffer[command:]
            conn.sendall(REDIS_ERROR)


def _one_command(buffer: bytes) -> int | None:
    """The length of the first complete RESP command in `buffer`, or None."""
    if not buffer.startswith(b"*"):
        end = buffer.find(b"\r\n")  # an inline command
        return None if end < 0 else end + 2
    head = buffer.find(b"\r\n")
    if head < 0:
        return None
    at = head + 2
    for _ in range(int(buffer[1:head])):
        size_end = buffer.find(b"\r\n", at)
        if size_end < 0:
            return None
        at = size_end + 2 + int(buffer[at + 1 : size_end]) + 2
        if at > len(buffer):
            return None
    return at


def _postgres_fatal(conn: socket.socket, stop: threading.Event) -> None:
    """Decline encryption, read the start-up message, answer FATAL and hang up."""
    buffer = b""
    while data := _recv(conn, stop):
        buffer += data
        while len(buffer) >= 8:
            size, code = struct.unpack("!ii", buffer[:8])
            if len(buffer) < size:
                break
            buffer = buffer[size:]
            if code in _PG_DECLINE:
                conn.sendall(b"N")
                continue
            fields = b"SFATAL\0VFATAL\0C57P03\0Mthe database system is starting up\0\0"
            conn.sendall(b"E" + struct.pack("!i", len(fields) + 4) + fields)
            return


def _http_500(conn: socket.socket, stop: threading.Event) -> None:
    """Answer any request with a 500 in the Messages API's error envelope."""
    buffer = b""
    while data := _recv(conn, stop):
        buffer += data
        if b"\r\n\r\n" in buffer:
            conn.sendall(_HTTP_500)
            return
