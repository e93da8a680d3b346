"""How every connection notices a peer that stopped answering, and how long that takes.

A half-open connection (packets stop without a FIN or RST: a NAT or firewall that forgot
the flow, a failover, a cable) looks alive to a client waiting for an answer: without
help it waits for ever. Three things bound the wait:

- TCP keepalives: an idle connection is probed after KEEPALIVE_IDLE_S, then every
  KEEPALIVE_INTERVAL_S; after KEEPALIVE_COUNT unanswered probes the kernel drops it.
- TCP_USER_TIMEOUT: data sent and not acknowledged for USER_TIMEOUT_S drops it too
  (keepalives only probe a connection with nothing in flight).
  Together: a dead peer is noticed within DEAD_PEER_S, for Redis and Postgres alike.
- Deadlines in the client: a server that is reachable but does not answer (a lock, a
  stalled process, a proxy that swallows packets) is cut by `Watchdog` (Postgres) or by
  the socket timeout (Redis), each at a bound stated where it is set.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import psycopg

KEEPALIVE_IDLE_S: Final = 5
KEEPALIVE_INTERVAL_S: Final = 2
KEEPALIVE_COUNT: Final = 3
USER_TIMEOUT_S: Final = 11
# The stated bound: a peer gone without a word is noticed within this many seconds.
DEAD_PEER_S: Final = KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_COUNT
CONNECT_TIMEOUT_S: Final = 5  # a TCP connection (and Postgres's start-up) takes at most this

# Socket options by name, where the platform has them (Linux has all four; macOS names
# the idle time TCP_KEEPALIVE and has no TCP_USER_TIMEOUT).
_TCP_OPTIONS: Final = {
    "TCP_KEEPIDLE": KEEPALIVE_IDLE_S,
    "TCP_KEEPALIVE": KEEPALIVE_IDLE_S,
    "TCP_KEEPINTVL": KEEPALIVE_INTERVAL_S,
    "TCP_KEEPCNT": KEEPALIVE_COUNT,
    "TCP_USER_TIMEOUT": USER_TIMEOUT_S * 1000,
}


def redis_options(socket_timeout: float | None) -> dict[str, Any]:
    """redis-py client options: keepalives, a connect timeout, and `socket_timeout` (the
    longest a command may wait for its answer; it must exceed any BLOCK the client sends;
    None where a client blocks for as long as its caller asks)."""
    options = {
        getattr(socket, name): value
        for name, value in _TCP_OPTIONS.items()
        if hasattr(socket, name)
    }
    return {
        "socket_keepalive": True,
        "socket_keepalive_options": options,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": socket_timeout,
    }


# libpq connection parameters (the same for psycopg.connect and the pools' kwargs).
POSTGRES_OPTIONS: Final = {
    "connect_timeout": CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": KEEPALIVE_IDLE_S,
    "keepalives_interval": KEEPALIVE_INTERVAL_S,
    "keepalives_count": KEEPALIVE_COUNT,
    "tcp_user_timeout": USER_TIMEOUT_S * 1000,
}


def postgres_options(url: str, **overrides: Any) -> dict[str, Any]:
    """libpq parameters for a connection to `url`: POSTGRES_OPTIONS and `overrides`,
    except those the URL sets itself (an operator's choice wins)."""
    given = psycopg.conninfo.conninfo_to_dict(url)
    return {k: v for k, v in {**POSTGRES_OPTIONS, **overrides}.items() if k not in given}


@dataclass
class Guard:
    """One guarded call: `cut` is set if its deadline passed and its socket was shut."""

    fd: int
    due: float
    cut: bool = False
    done: bool = False


class Watchdog:
    """Shuts down the socket of a call still running past its deadline, so the blocked
    call fails at once (libpq sees the connection closed) instead of waiting for a server
    that does not answer. What it cut is broken: the caller discards the connection.

    One thread per watchdog, started on first use (so after any fork) and idle between
    deadlines; guarding a call costs a heap push under a lock.
    """

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.cuts = 0
        self._heap: list[tuple[float, int, Guard]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._pid = 0  # the process whose thread runs; a forked child starts its own

    @contextlib.contextmanager
    def guard(self, fd: int, due: float) -> Iterator[Guard]:
        """Cut the socket `fd` if the block is still running at `due` (`clock` time)."""
        g = Guard(fd, due)
        with self._wake:
            self._start()
            sooner = not self._heap or due < self._heap[0][0]
            heapq.heappush(self._heap, (due, next(self._order), g))
            if sooner:  # the thread sleeps until the soonest deadline: wake it for this one
                self._wake.notify()
        try:
            yield g
        finally:
            with self._wake:
                g.done = True  # never cut once the block has left: the fd may be reused
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)

    def _start(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._heap = [item for item in self._heap if not item[2].done]
            threading.Thread(target=self._run, name="contextlog-watchdog", daemon=True).start()

    def _run(self) -> None:
        with self._wake:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._wake.wait()
                    continue
                wait = self._heap[0][0] - self.clock()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                self._cut(heapq.heappop(self._heap)[2])

    def _cut(self, g: Guard) -> None:
        g.cut = True
        self.cuts += 1
        shut(g.fd)


def shut(fd: int) -> None:
    """Shut a socket down both ways without closing the descriptor its owner holds: any
    read blocked on it returns at once, and the owner closes it as a broken connection."""
    with contextlib.suppress(OSError):
        s = socket.socket(fileno=os.dup(fd))
        try:
            s.shutdown(socket.SHUT_RDWR)
        finally:
            s.close()
