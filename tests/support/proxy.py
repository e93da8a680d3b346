"""A TCP proxy the tests can cut and restore, to stage a Postgres or Redis outage."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import parse_qs, urlsplit, urlunsplit

Address = tuple[str, int] | str  # (host, port) or a unix socket path


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


class Proxy:
    """Forwards 127.0.0.1:port to the upstream; `down()` drops every connection."""

    def __init__(self, upstream: Address) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.is_up = True
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and reset the open ones."""
        with self.lock:
            self.is_up = False
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
            self.sockets.clear()

    def up(self) -> None:
        """Let connections through again."""
        self.is_up = True

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
                client.close()
                continue
            upstream = self._connect_upstream()
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()
