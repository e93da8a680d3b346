"""What every `contextlog` subcommand shares: exit codes, a console that prints user data
literally, clients that fail fast when a server is down, and argument checks."""

from __future__ import annotations

import argparse
from typing import Final, NoReturn

import psycopg
import redis
from psycopg.rows import TupleRow
from rich.console import Console

from contextlog.producers import ContextReader, Producer
from contextlog.producers.connection import SyncClient
from contextlog.schema.errors import Unavailable, one_line
from contextlog.worker.app import bootstrap
from contextlog.worker.app.config import Settings
from contextlog.worker.app.status import disk_full
from contextlog.worker.store.migrations import migrate

EXIT_UNHEALTHY: Final = 1
EXIT_ERROR: Final = 2  # bad input, bad configuration, a refused request
EXIT_UNAVAILABLE: Final = 3  # Postgres or Redis cannot be reached
# A command run by hand (or by a health check) says a server is down in a moment, not
# after the pool's 10 s wait: it connects with libpq's smallest connect_timeout (2 s), and
# a Redis that takes connections but never answers (a stalled host, a full disk under AOF
# fsync) fails it in ~2 s too. No command of the CLI blocks longer in Redis
# (`notifications --follow` reads with 1 s). The clients are the composition root's.
WAITS: Final = bootstrap.FAIL_FAST

# Markup, emoji codes and highlighting off: names, messages and dead letters are user
# data and must print as they are ("[/x]" once crashed `dead-letters`). Styles are given
# with `rich.text.Text`, never as markup inside strings.
console = Console(markup=False, emoji=False, highlight=False)


class Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr and exit 2, pointing at --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: {message} (see {self.prog} --help)\n")


def positive(text: str) -> int:
    """An argument that must be a whole number >= 1."""
    return _whole(text, 1)


def non_negative(text: str) -> int:
    """An argument that must be a whole number >= 0."""
    return _whole(text, 0)


MAX_WAIT_S: Final = 600


def wait_seconds(text: str) -> float:
    """An argument that is a number of seconds to wait, 0 to MAX_WAIT_S."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= MAX_WAIT_S:
        raise argparse.ArgumentTypeError(f"must be 0 to {MAX_WAIT_S} seconds, not {text}")
    return value


def add_conversation(p: argparse.ArgumentParser) -> None:
    """The conversation a command is about: AGENT CHANNEL."""
    p.add_argument("agent", help="the bot (agent) of the conversation")
    p.add_argument("channel", help="the channel of the conversation")


def add_json(p: argparse.ArgumentParser) -> None:
    """`--json`: the data as JSON instead of text for people."""
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def add_wait(p: argparse.ArgumentParser) -> None:
    """`--wait SECONDS` for ingest's answer to a command (session commands, import)."""
    p.add_argument(
        "--wait",
        type=wait_seconds,
        default=5.0,
        metavar="SECONDS",
        help="wait this long for ingest's answer (done or refused, which exits 2); "
        "0: do not wait (default 5)",
    )


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {least} or more, not {value}")
    return value


def redis_client(settings: Settings) -> SyncClient:
    """A client for `REDIS_URL` (a Redis or a Redis Cluster) that fails fast (`WAITS`)."""
    return bootstrap.redis_client(settings, WAITS)


def queue_client(settings: Settings) -> redis.Redis:
    """A client for the queue Redis (`CONTEXTLOG_QUEUE_REDIS_URL`, default REDIS_URL)."""
    return bootstrap.queue_client(settings, WAITS)


def producer(settings: Settings, *, operator: bool = False) -> Producer:
    """A producer on `REDIS_URL`, as an adapter has one, after checking Redis answers;
    an `operator`'s signs what only workers and operators may send (an erase) with the
    deployment's key (`bootstrap.signing_key`: the environment's, or Postgres')."""
    client = redis_client(settings)
    check_redis(client)
    key = bootstrap.signing_key(settings) if operator else None
    return Producer(
        client,
        shards=settings.shards,
        max_entry_bytes=settings.max_entry_bytes,
        signing_key=key,
    )


def pg_connect(settings: Settings) -> psycopg.Connection[TupleRow]:
    """A Postgres connection for `DATABASE_URL`; an unreachable server is `Unavailable`."""
    try:
        return bootstrap.pg_connector(settings, WAITS)()
    except psycopg.OperationalError as e:
        why = "Postgres refuses connections: its disk is full; " if disk_full(str(e), True) else ""
        raise Unavailable(f"cannot reach Postgres (DATABASE_URL): {why}{one_line(e)}") from e


def migrated(settings: Settings) -> list[str]:
    """Apply pending migrations (the names applied), failing fast like `pg_connect`."""
    with pg_connect(settings) as conn:
        return migrate(conn)


def reader(settings: Settings) -> ContextReader:
    """A context reader, after checking Postgres answers: the reader's pool would retry
    for 10 s and log every attempt before giving up."""
    pg_connect(settings).close()
    return ContextReader.from_url(settings.database_url, **settings.reader_options())


def check_redis(client: SyncClient, variable: str = "REDIS_URL") -> None:
    """Fail at once (as `Unavailable`) when Redis cannot be reached."""
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise Unavailable(f"cannot reach Redis ({variable}): {one_line(e)}") from e


def check_servers(settings: Settings, *, queue: bool = False) -> None:
    """Before a long-running process starts: Postgres (migrated) and Redis answer, or it
    exits in ~2 s with one line; its own clients then ride out later outages."""
    migrated(settings)
    clients: list[tuple[SyncClient, str]] = [(redis_client(settings), "REDIS_URL")]
    if queue and settings.queue_redis_url != settings.redis_url:
        clients.append((queue_client(settings), "CONTEXTLOG_QUEUE_REDIS_URL"))
    for client, variable in clients:
        try:
            check_redis(client, variable)
        finally:
            client.close()
