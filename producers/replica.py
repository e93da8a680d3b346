"""Context reads from a Postgres streaming replica (a hot standby), the primary as fallback.

A read names how fresh it must be, and the replica serves it only when it is that fresh:

- `wait_for` reads are exact. The reader waits on the primary until the event is committed
  (a standby cannot LISTEN) and takes the primary's WAL insert position in the same look
  (`await_event_at`); the replica serves the read once it has replayed up to there
  (`replica_replayed`, sent in one pipeline with the reads). Replay only moves forward, so
  reads after a passing check see the event. A replica not there within `wait` seconds
  (polled every `POLL_SECONDS`) leaves the read to the primary: counted as `behind`.
- Other reads go to the replica directly, in one pipeline with `replica_lag`; a replica
  more than `max_lag` seconds behind leaves the read to the primary: counted as `lagging`.
- A replica that cannot be reached (or is no standby) leaves reads to the primary for
  `RETRY_SECONDS`, counted as `down` and logged once; then it is tried again.

Reads that need no primary (no `wait_for`, a replica within its bound) never touch it, so
they go on while the primary is down.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Protocol, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from contextlog.schema.defaults import REPLICA_MAX_LAG, REPLICA_WAIT
from contextlog.schema.errors import ConfigError, one_line
from contextlog.schema.queries import query

MAX_LAG: Final = REPLICA_MAX_LAG  # seconds a replica may be behind (no wait_for)
WAIT: Final = REPLICA_WAIT  # seconds a wait_for read waits for the replica's replay
POLL_SECONDS: Final = 0.005  # how often a wait_for read looks at the replica's replay
RETRY_SECONDS: Final = 5.0  # how long an unreachable replica is left alone
CONNECT_WAIT: Final = 1.0  # seconds to wait for a pooled replica connection
PRIMARY: Final = "primary"
REPLICA: Final = "replica"
REASONS: Final = ("lagging", "behind", "down", "error")

# stdlib logging: adapters need no structlog (the worker routes it through structlog).
log = logging.getLogger("contextlog.replica")
T = TypeVar("T")
# A read in two halves: `send(conn)` queues its statements on a connection in pipeline
# mode and returns how to collect their results once the pipeline has synced. A replica
# read queues its freshness check first, so check and reads travel in one sync: nested
# pipelines sync at each block's end, a second round trip (2x the time of one sync with
# the same statements, here).
Send = Callable[[Any], Callable[[], T]]
ASend = Callable[[Any], Awaitable[Callable[[], Awaitable[T]]]]


def fetch_sent(conn: Any, send: Send[T]) -> T:
    """What `send` queues, in one round trip, collected."""
    with conn.pipeline():
        collect = send(conn)
    return collect()


async def afetch_sent(conn: Any, send: ASend[T]) -> T:
    """`fetch_sent` on an asyncio connection."""
    async with conn.pipeline():
        collect = await send(conn)
    return await collect()


class NotStandby(psycopg.OperationalError):
    """Raised when the replica URL names a server that is not in recovery (no standby)."""


class Timer(Protocol):
    """Monotonic time and sleeping, injected so tests need not wait for real time."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    async def asleep(self, seconds: float) -> None: ...


class SystemTimer:
    """The real clock."""

    def monotonic(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """time.sleep()."""
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        """asyncio.sleep()."""
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class Policy:
    """How far behind the replica may be: `max_lag` seconds for reads without wait_for;
    `wait` seconds for it to replay the awaited event before the primary serves instead."""

    max_lag: float = MAX_LAG
    wait: float = WAIT

    def __post_init__(self) -> None:
        for name, value in (("max_replica_lag", self.max_lag), ("replica_wait", self.wait)):
            if not value >= 0:  # also refuses NaN
                raise ConfigError(f"{name} must be a number of seconds >= 0: {value!r}")


@dataclass
class Routing:
    """Reads served by each server, and why the primary served them (`REASONS`)."""

    served: dict[str, int] = field(default_factory=lambda: {PRIMARY: 0, REPLICA: 0})
    fallbacks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, by: str, reason: str | None = None) -> None:
        """One read served `by` a server (after a fallback for `reason`)."""
        with self._lock:
            self.served[by] += 1
            if reason is not None:
                self.fallbacks[reason] += 1

    def snapshot(self) -> dict[str, int]:
        """The counters, flat: primary, replica, and one per fallback reason."""
        with self._lock:
            return {**self.served, **self.fallbacks}


@dataclass(frozen=True)
class Served(Generic[T]):
    """A read's result, the server that served it, and how to reach that server again
    (attachments are fetched from where the context was read)."""

    value: T
    by: str
    connect: Callable[[], Any]


class _Base:
    def __init__(self, policy: Policy, timer: Timer | None) -> None:
        self.policy = policy
        self.timer = timer or SystemTimer()
        self.routing = Routing()
        self._down_until = float("-inf")
        self._suspect = False  # its pooled connections may be broken: check them first

    def _up(self) -> bool:
        return self.timer.monotonic() >= self._down_until

    def _failed(self, e: psycopg.Error) -> str:
        """The fallback reason for a replica error; a lost or refused connection (or no
        standby) keeps the replica out of use for RETRY_SECONDS, logged once."""
        if not isinstance(e, psycopg.OperationalError):  # e.g. a recovery conflict
            log.info("replica read failed, the primary serves it: %s", one_line(e))
            return "error"
        if self._up():
            log.warning(
                "replica unavailable, reading from the primary for %.0fs: %s",
                RETRY_SECONDS,
                one_line(e),
            )
        self._down_until = self.timer.monotonic() + RETRY_SECONDS
        self._suspect = True
        return "down"

    def _lag_ok(self, row: tuple[Any, ...] | None) -> bool:
        lag = _standby(row)[1]
        return lag is not None and float(lag) <= self.policy.max_lag


def _standby(row: tuple[Any, ...] | None) -> tuple[bool, Any]:
    if row is None or not row[0]:
        raise NotStandby("the replica URL names a server that is not a standby")
    return row[0], row[1]


class Replica(_Base):
    """A replica for the synchronous reader; connects on first use."""

    def __init__(
        self, pool: ConnectionPool[Any], policy: Policy, timer: Timer | None = None
    ) -> None:
        super().__init__(policy, timer)
        self.pool = pool

    def connection(self) -> Any:
        """A pooled replica connection (a context manager), waited for CONNECT_WAIT at most."""
        if self.pool.closed:
            self.pool.open(wait=False)
        elif self._suspect:  # back after being down: drop connections to the old server
            self._suspect = False
            self.pool.check()
        return self.pool.connection(timeout=CONNECT_WAIT)

    def read(self, send: Send[T], lsn: str | None, primary: Callable[[], Any]) -> Served[T]:
        """The read `send` queues, on the replica when it is fresh enough (replayed up to
        `lsn`, or within the lag bound when `lsn` is None), else on the primary."""
        reason = "down"
        if self._up():
            try:
                done = self._at(send, lsn) if lsn is not None else self._recent(send)
            except psycopg.Error as e:
                done, reason = None, self._failed(e)
            else:
                if done is not None:
                    self.routing.count(REPLICA)
                    return Served(done[0], REPLICA, self.connection)
                reason = "lagging" if lsn is None else "behind"
        with primary() as conn:
            value = fetch_sent(conn, send)
        self.routing.count(PRIMARY, reason)
        return Served(value, PRIMARY, primary)

    def _recent(self, send: Send[T]) -> tuple[T] | None:
        with self.connection() as conn:
            with conn.pipeline():  # the lag check and the reads in one round trip
                lag = conn.execute(query("replica_lag"))
                collect = send(conn)
            return (collect(),) if self._lag_ok(lag.fetchone()) else None

    def _at(self, send: Send[T], lsn: str) -> tuple[T] | None:
        deadline = self.timer.monotonic() + self.policy.wait
        params = {"lsn": lsn}
        with self.connection() as conn:
            with conn.pipeline():  # hopeful: the check and the reads in one round trip
                replayed = conn.execute(query("replica_replayed"), params)
                collect = send(conn)
            if _standby(replayed.fetchone())[1]:
                return (collect(),)
            while self.timer.monotonic() < deadline:
                self.timer.sleep(POLL_SECONDS)
                if _standby(conn.execute(query("replica_replayed"), params).fetchone())[1]:
                    return (fetch_sent(conn, send),)  # replay only moves forward: no re-check
        return None

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()


class AsyncReplica(_Base):
    """`Replica` for the asyncio reader."""

    def __init__(
        self, pool: AsyncConnectionPool[Any], policy: Policy, timer: Timer | None = None
    ) -> None:
        super().__init__(policy, timer)
        self.pool = pool

    async def connection(self) -> Any:
        """A pooled replica connection (an async context manager)."""
        if self.pool.closed:
            await self.pool.open(wait=False)
        elif self._suspect:
            self._suspect = False
            await self.pool.check()
        return self.pool.connection(timeout=CONNECT_WAIT)

    async def read(
        self, send: ASend[T], lsn: str | None, primary: Callable[[], Awaitable[Any]]
    ) -> Served[T]:
        """`Replica.read`, for asyncio."""
        reason = "down"
        if self._up():
            try:
                done = await (self._at(send, lsn) if lsn is not None else self._recent(send))
            except psycopg.Error as e:
                done, reason = None, self._failed(e)
            else:
                if done is not None:
                    self.routing.count(REPLICA)
                    return Served(done[0], REPLICA, self.connection)
                reason = "lagging" if lsn is None else "behind"
        async with await primary() as conn:
            value = await afetch_sent(conn, send)
        self.routing.count(PRIMARY, reason)
        return Served(value, PRIMARY, primary)

    async def _recent(self, send: ASend[T]) -> tuple[T] | None:
        async with await self.connection() as conn:
            async with conn.pipeline():
                lag = await conn.execute(query("replica_lag"))
                collect = await send(conn)
            return (await collect(),) if self._lag_ok(await lag.fetchone()) else None

    async def _at(self, send: ASend[T], lsn: str) -> tuple[T] | None:
        deadline = self.timer.monotonic() + self.policy.wait
        params = {"lsn": lsn}
        async with await self.connection() as conn:
            async with conn.pipeline():
                replayed = await conn.execute(query("replica_replayed"), params)
                collect = await send(conn)
            if _standby(await replayed.fetchone())[1]:
                return (await collect(),)
            while self.timer.monotonic() < deadline:
                await self.timer.asleep(POLL_SECONDS)
                cur = await conn.execute(query("replica_replayed"), params)
                if _standby(await cur.fetchone())[1]:
                    return (await afetch_sent(conn, send),)
        return None

    async def aclose(self) -> None:
        """Close the pool."""
        await self.pool.close()
