"""A total wall-clock budget for an HTTP request, enforced at the socket.

httpx2's timeouts apply to each connect, write and read: a server that drips one byte
every 2 s never trips a 3 s read timeout, and held a summary worker for minutes. Here
every socket operation's timeout is capped by what remains of the request's budget, so
the request ends (as a timeout) at its deadline, however the server sends. The budget
is per thread (a sync client reads its response in the calling thread).
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpcore2
import httpx2


class Deadlines:
    """The current thread's deadline, set around a request with `within`."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._local = threading.local()

    @contextlib.contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        """Run the block's requests with `seconds` in total."""
        previous = getattr(self._local, "at", None)
        self._local.at = self._monotonic() + seconds
        try:
            yield
        finally:
            self._local.at = previous

    def cap(self, timeout: float | None, what: str) -> float | None:
        """`timeout` shortened to the time left; raises a timeout once none is left."""
        at: float | None = getattr(self._local, "at", None)
        if at is None:
            return timeout
        left = at - self._monotonic()
        if left <= 0:
            raise _TIMEOUTS[what]("the request's total time budget ran out")
        return left if timeout is None else min(timeout, left)


_TIMEOUTS: dict[str, type[httpcore2.TimeoutException]] = {
    "connect": httpcore2.ConnectTimeout,
    "read": httpcore2.ReadTimeout,
    "write": httpcore2.WriteTimeout,
}


class _Stream(httpcore2.NetworkStream):
    def __init__(self, inner: httpcore2.NetworkStream, deadlines: Deadlines) -> None:
        self._inner = inner
        self._deadlines = deadlines

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._deadlines.cap(timeout, "read"))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._deadlines.cap(timeout, "write"))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.NetworkStream:
        tls = self._inner.start_tls(
            ssl_context, server_hostname, self._deadlines.cap(timeout, "connect")
        )
        return _Stream(tls, self._deadlines)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore2.NetworkBackend):
    """httpcore2's network backend with every socket timeout capped by `deadlines`."""

    def __init__(self, inner: httpcore2.NetworkBackend, deadlines: Deadlines) -> None:
        self._inner = inner
        self._deadlines = deadlines

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        capped = self._deadlines.cap(timeout, "connect")
        stream = self._inner.connect_tcp(host, port, capped, local_address, socket_options)
        return _Stream(stream, self._deadlines)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.NetworkStream:
        capped = self._deadlines.cap(timeout, "connect")
        return _Stream(
            self._inner.connect_unix_socket(path, capped, socket_options), self._deadlines
        )

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def transport(deadlines: Deadlines) -> httpx2.HTTPTransport:
    """httpx2's default transport (proxy and TLS settings from the environment), its
    sockets bounded by `deadlines`.

    httpx2 has no parameter for a network backend; its connection pool (httpcore2's,
    whose `network_backend` is public API) keeps the one it was built with in
    `_network_backend`, the one attribute this reaches into (httpx2 2.16 is pinned).
    """
    t = httpx2.HTTPTransport()
    pool: Any = t._pool
    pool._network_backend = DeadlineBackend(pool._network_backend, deadlines)
    return t
