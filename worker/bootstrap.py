"""The composition root: builds clients from settings and hands them to the code that needs them.

Nothing connects at import time; every process (and every forked child) calls these.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import redis
from psycopg.rows import TupleRow

from schema import keys
from schema.errors import ConfigError, Unavailable
from worker.clock import Clock, SystemClock
from worker.config import Settings
from worker.eventlog import EventLog, PostgresEventLog, migrate
from worker.ingest import Ingest
from worker.streams import Streams

PgConn = psycopg.Connection[TupleRow]


def redis_client(settings: Settings) -> redis.Redis:
    """A Redis client for `REDIS_URL` (its database number honoured)."""
    return redis.Redis.from_url(settings.redis_url, socket_timeout=30, health_check_interval=15)


def pg_connector(settings: Settings) -> Callable[[], PgConn]:
    """A function opening a fresh Postgres connection for `DATABASE_URL`."""

    def connect() -> PgConn:
        return psycopg.connect(
            settings.database_url, connect_timeout=5, application_name="contextlog"
        )

    return connect


def open_event_log(settings: Settings) -> Callable[[], EventLog]:
    """A function opening the Postgres event log; connection failures become `Unavailable`."""
    connect = pg_connector(settings)

    def open_log() -> EventLog:
        try:
            return PostgresEventLog(connect())
        except psycopg.OperationalError as e:
            raise Unavailable(f"Postgres: {e}") from e

    return open_log


def run_migrations(settings: Settings) -> list[str]:
    """Bring the database schema up to date."""
    with pg_connector(settings)() as conn:
        return migrate(conn)


def claim_shard_count(client: redis.Redis, shards: int) -> None:
    """Record the shard count for producers, or refuse to run with a different one."""
    client.set(keys.SHARDS_KEY, shards, nx=True)
    current = int(client.get(keys.SHARDS_KEY) or shards)
    if current != shards:
        raise ConfigError(
            f"{keys.SHARDS_VAR}={shards}, but this Redis was set up with {current} shards; "
            f"resharding is not supported: set {keys.SHARDS_VAR}={current}"
        )


def build_ingest(
    settings: Settings, stop: threading.Event | None = None, clock: Clock | None = None
) -> Ingest:
    """An ingest loop wired to the configured Redis and Postgres."""
    client = redis_client(settings)
    claim_shard_count(client, settings.shards)
    streams = Streams(client, settings.consumer)
    return Ingest(settings, streams, open_event_log(settings), clock or SystemClock(), stop)
