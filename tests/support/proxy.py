"""A TCP proxy the tests can break, to stage the network faults of a Postgres or Redis.

    proxy = Proxy(postgres_upstream(url)); url = via(url, proxy.port)
    proxy.down(); proxy.up()                 # connections reset, new ones refused; back
    proxy.latency(0.15, 0.3)                 # every chunk delayed 150-300 ms, in order
    proxy.black_hole(); proxy.heal()         # packets stop: nothing moves, nothing closes
    proxy.reset_after(b"COMMIT")             # reset the connection that sends it, once
                                             # forwarded: the server got it, the answer is lost

A black hole is what a client sees of a half-open connection (a NAT or firewall that
forgot it, a failover): its writes are taken, nothing answers and nothing is closed. On
loopback the proxy's kernel acknowledges every packet, so TCP keepalives cannot see it;
only the client's own deadlines do.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import random
import socket
import struct
import threading
import time
from urllib.parse import parse_qs, urlsplit, urlunsplit

Address = tuple[str, int] | str  # (host, port) or a unix socket path
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN


def postgres_upstream(url: str) -> Address:
    """Where a postgresql:// URL points: TCP host and port, or the unix socket file."""
    parts = urlsplit(url)
    host = parse_qs(parts.query).get("host", [parts.hostname or "/var/run/postgresql"])[0]
    port = parts.port or 5432
    return f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)


def redis_upstream(url: str) -> Address:
    """Where a redis:// or unix:// URL points."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return (parts.hostname or "127.0.0.1", parts.port or 6379)


def via(url: str, port: int) -> str:
    """`url` rewritten to go through a proxy on 127.0.0.1:`port` (database/db kept)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        db = parse_qs(parts.query).get("db", ["0"])[0]
        return f"redis://127.0.0.1:{port}/{db}"
    query = "&".join(p for p in parts.query.split("&") if p and not p.startswith("host="))
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, f"{user}127.0.0.1:{port}", parts.path, query, ""))


def reset(s: socket.socket) -> None:
    """Close `s` with a TCP reset (what a crashed peer or a middlebox sends)."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        # Wakes a thread blocked reading it (sending nothing), so that the close below
        # really closes it: a socket another thread reads from is closed only after.
        s.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        s.close()


class Proxy:
    """Forwards 127.0.0.1:port to the upstream, with the faults of the module docstring."""

    def __init__(self, upstream: Address) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.is_up = True
        self.hole = False  # black hole: take every byte, forward none, close nothing
        self.delay = (0.0, 0.0)  # each chunk's latency, drawn from this range
        self.trigger: bytes | None = None  # reset the connection that sends this, once
        self.resets = 0  # connections reset by `reset_after`
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and reset the open ones."""
        with self.lock:
            self.is_up = False
            for s in self.sockets:
                reset(s)
            self.sockets.clear()

    def up(self) -> None:
        """Let connections through again."""
        self.is_up = True

    def latency(self, low: float, high: float | None = None) -> None:
        """Delay every chunk, each way, by `low` to `high` seconds (0, 0: none)."""
        self.delay = (low, low if high is None else high)

    def black_hole(self) -> None:
        """Packets stop: open and new connections are taken, and get nothing more."""
        self.hole = True

    def heal(self) -> None:
        """End the black hole; what it swallowed is lost, as a real network loses it."""
        self.hole = False

    def reset_after(self, pattern: bytes) -> None:
        """Reset the next connection whose client sends `pattern`, right after that chunk
        reached the upstream: the server acts on it, the client never hears back."""
        self.trigger = pattern

    def close(self) -> None:
        """Stop the proxy."""
        self.down()
        self.listener.close()

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(self.upstream)
            return s
        return socket.create_connection(self.upstream)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.is_up:
                reset(client)
                continue
            with self.lock:
                self.sockets.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        while self.hole:  # a connection made in the hole hangs until it heals
            time.sleep(0.01)
        try:
            upstream = self._connect_upstream()
        except OSError:
            reset(client)
            return
        with self.lock:
            self.sockets.append(upstream)
        pair = (client, upstream)
        for src, dst, outbound in ((client, upstream, True), (upstream, client, False)):
            _Pump(self, src, dst, pair, outbound).start()


class _Pump:
    """One direction of one connection: chunks read, delayed and forwarded in order."""

    def __init__(
        self,
        proxy: Proxy,
        src: socket.socket,
        dst: socket.socket,
        pair: tuple[socket.socket, socket.socket],
        outbound: bool,
    ) -> None:
        self.proxy = proxy
        self.src, self.dst, self.pair = src, dst, pair
        self.outbound = outbound  # client -> upstream
        self.queue: list[tuple[float, int, bytes]] = []  # (due, order, chunk)
        self.order = itertools.count()
        self.ready = threading.Condition()
        self.last_due = 0.0
        self.closed = False

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        try:
            while data := self.src.recv(65536):
                if self.proxy.hole:
                    continue  # swallowed
                low, high = self.proxy.delay
                due = max(time.monotonic() + random.uniform(low, high), self.last_due)
                self.last_due = due
                with self.ready:
                    heapq.heappush(self.queue, (due, next(self.order), data))
                    self.ready.notify()
        except OSError:
            pass
        with self.ready:
            self.closed = True
            self.ready.notify()

    def _write(self) -> None:
        try:
            while (chunk := self._next()) is not None:
                self.dst.sendall(chunk)
                trigger = self.proxy.trigger
                if self.outbound and trigger is not None and trigger in chunk:
                    self.proxy.trigger = None
                    self.proxy.resets += 1
                    time.sleep(0.05)  # the server has it, and answers into the void
                    for s in self.pair:
                        reset(s)
                    return
        except OSError:
            pass
        for s in self.pair:
            with contextlib.suppress(OSError):
                s.close()

    def _next(self) -> bytes | None:
        """The next chunk once due; None once the source closed and all is sent."""
        with self.ready:
            while True:
                if self.queue:
                    due = self.queue[0][0]
                    wait = due - time.monotonic()
                    if wait <= 0:
                        return heapq.heappop(self.queue)[2]
                    self.ready.wait(wait)
                elif self.closed:
                    return None
                else:
                    self.ready.wait()
