"""Reaching the real Postgres and Redis from tests: skip on a laptop without them, fail in CI."""

from __future__ import annotations

import os
from typing import Final, NoReturn
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import redis
from psycopg.rows import TupleRow

from contextlog.schema.queries import migrations
from contextlog.worker.store.migrations import migrate

IN_CI = os.environ.get("CI", "").lower() == "true"


def unavailable(what: str, detail: str, hint: str = "run the tests with `make test`") -> NoReturn:
    """Skip (or, in CI, fail) a test whose server is missing, saying how to get one."""
    message = f"{what} is not available ({detail}); {hint}"
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def create_database(base_url: str, name: str, tablespace: str | None = None) -> str:
    """Create a fresh, migrated database next to `base_url`'s (in `tablespace`, if
    given); returns its URL."""
    try:
        admin = psycopg.connect(base_url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        unavailable("Postgres (DATABASE_URL)", str(e).strip())
    where = f' TABLESPACE "{tablespace}"' if tablespace else ""
    with admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"{where}')
    url = with_database(base_url, name)
    with psycopg.connect(url) as conn:
        migrate(conn)
    return url


# Migrations that only add (or redefine) functions today's code calls: `PostgresEventLog`
# (008: the fence; 012: the append's statements) and the reader, which tests use to observe
# an older layout (010: `wait_for`'s wait; 011: the window's definition and cut; 013: its
# edge, inlined).
CALLED_FUNCTIONS: Final = frozenset({8, 10, 11, 12, 13})
# Migrations today's writer needs whole (014: the segments' columns and functions; 020:
# the sessions' `imported_from`), applied early but not recorded: `migrate` applies them
# again in order, which they allow (they add what is missing, and leave threads that have
# a segment as they are).
REAPPLIED: Final = frozenset({14, 20})
# The columns today's writer writes that a later migration adds (009: the running totals),
# added under an older layout as that migration adds them (IF NOT EXISTS: it skips them,
# or adds them again to the table 007 builds).
WRITER_COLUMNS: Final = {
    9: "ALTER TABLE events ADD COLUMN IF NOT EXISTS through bigint;"
    " ALTER TABLE events ADD COLUMN IF NOT EXISTS late boolean;"
    " ALTER TABLE threads ADD COLUMN IF NOT EXISTS tokens_through bigint NOT NULL DEFAULT 0",
    # The restored session of a segment and the session of a note (the erase and expiry
    # take their text out), a session's summary round, a conversation's own retention.
    17: "ALTER TABLE threads ADD COLUMN IF NOT EXISTS seg_session text;"
    " ALTER TABLE notes ADD COLUMN IF NOT EXISTS session_id text;"
    " ALTER TABLE sessions ADD COLUMN IF NOT EXISTS summary_round integer NOT NULL DEFAULT 0;"
    " ALTER TABLE conversations ADD COLUMN IF NOT EXISTS keep_log_days integer,"
    " ADD COLUMN IF NOT EXISTS keep_sessions_days integer",
}


def migrate_layout(conn: psycopg.Connection[TupleRow], upto: int) -> list[str]:
    """Migrate up to `upto` (the tables as that release left them) plus the later
    function-only migrations today's writer and reader call and the columns it writes, so tests can
    fill the database with today's `PostgresEventLog`; `migrate` applies the others later,
    in order. Returns the names applied."""
    applied = migrate(conn, upto=upto)
    with conn.transaction():
        # In version order: a migration applied early may need the columns of an earlier
        # one (014 reads 009's), and later columns may go on its tables (017's on 014's).
        for m in migrations():
            if m.version > upto and m.version in WRITER_COLUMNS:
                conn.execute(WRITER_COLUMNS[m.version])
            if m.version > upto and m.version in CALLED_FUNCTIONS | REAPPLIED:
                conn.execute(m.sql.encode())
            if m.version > upto and m.version in CALLED_FUNCTIONS:
                conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                    (m.version, m.name),
                )
                applied.append(f"{m.version:03d}_{m.name}")
    return applied


def later_than(version: int) -> list[str]:
    """The names of the migrations after `version`, as `migrate` reports them applied."""
    return [f"{m.version:03d}_{m.name}" for m in migrations() if m.version > version]


def drop_database(base_url: str, name: str) -> None:
    """Drop a test database, disconnecting whoever is still on it."""
    with psycopg.connect(base_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def redis_or_skip(url: str | None) -> redis.Redis:
    """A client for `url`, or skip/fail when Redis does not answer."""
    if not url:
        unavailable("Redis (REDIS_URL)", "REDIS_URL is not set")
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        client.ping()
    except redis.RedisError as e:
        unavailable("Redis (REDIS_URL)", str(e))
    return client


# Written into every Redis database the suite or the benchmarks flush, so that the next
# flush knows the keys there are ours. Outside the contextlog:* namespace on purpose.
OWNED_MARK = "tests:flushed-by-contextlog-tests"


class NotOurs(Exception):
    """Raised when a Redis database to flush holds keys a test run did not write."""


def flush_owned(client: redis.Redis) -> None:
    """FLUSHDB, but only a database that is empty or that a test run marked as its own:
    a REDIS_URL exported for the application must never lose its data to `make test`."""
    size = int(client.dbsize())
    if size and not client.exists(OWNED_MARK):
        db = client.connection_pool.connection_kwargs.get("db", 0)
        raise NotOurs(
            f"Redis database {db} holds {size} keys that no test run wrote; refusing to flush"
            " it. Point REDIS_URL at an empty database (e.g. redis://127.0.0.1:6379/15)."
        )
    client.flushdb()
    client.set(OWNED_MARK, "1")


def truncate(url: str) -> None:
    """Empty every contextlog table between tests."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename <> 'schema_migrations'"
            ).fetchall()
        ]
        if tables:
            conn.execute("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY")
