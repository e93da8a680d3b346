"""The composition root: builds clients from settings and hands them to the code that needs them.

Nothing connects at import time; every process (and every forked child) calls these.
"""

from __future__ import annotations

import gc
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import psycopg
import redis
import structlog
from psycopg.rows import TupleRow
from rq import Queue

from contextlog.producers import connection
from contextlog.producers.connection import SyncClient
from contextlog.producers.liveness import Watchdog, postgres_options
from contextlog.producers.producer import Producer
from contextlog.producers.reader import ContextReader
from contextlog.schema import keys, signing
from contextlog.schema.errors import ConfigError, Unavailable
from contextlog.schema.queries import query
from contextlog.worker.app import memory
from contextlog.worker.app.clock import Clock, SystemClock
from contextlog.worker.app.config import QUEUE_REDIS_VAR, Settings
from contextlog.worker.effects.notify import RedisNotifier
from contextlog.worker.effects.relay import Relay
from contextlog.worker.effects.scrub import Scrubber
from contextlog.worker.ingest.loop import Ingest
from contextlog.worker.ingest.streams import Streams, set_absent
from contextlog.worker.store.eventlog import (
    IDLE_TRANSACTION_FLOOR_S,
    EventLog,
    PostgresEventLog,
    bound_waits,
)
from contextlog.worker.tasks import idle, retention
from contextlog.worker.tasks import resources as resources_
from contextlog.worker.tasks.indexer import Indexer
from contextlog.worker.tasks.queue import SUMMARIES, Jobs
from contextlog.worker.tasks.resources import Resources
from contextlog.worker.tasks.rqworker import ContextlogWorker
from contextlog.worker.tasks.sweeper import Heartbeat, Loop
from contextlog.worker.tasks.timers import IDLE, Timers
from contextlog.worker.tasks.webhooks import QUEUE as WEBHOOKS
from contextlog.worker.tasks.webhooks import Deliveries, Dispatcher

if TYPE_CHECKING:
    from contextlog.worker.tasks.compaction import ApiCompactor

PgConn = psycopg.Connection[TupleRow]

# Net allocations of tracked objects (containers) between two young-generation collections
# in an ingest process; Python's default is 700.
INGEST_GC_THRESHOLD = 50_000
log = structlog.get_logger("contextlog.bootstrap")

if TYPE_CHECKING:
    from contextlog.worker.api.services import Services
    from contextlog.worker.tasks.summarize import Summarizer


@dataclass(frozen=True)
class Waits:
    """How long a client waits to connect and for an answer (None: the default of the
    process that uses it). Long-running processes ride outages out; a CLI command fails
    fast (`FAIL_FAST`)."""

    connect_s: float | None = None
    answer_s: float | None = None


LONG_RUNNING: Final = Waits()  # ingest, the worker, the API: each client's own defaults
FAIL_FAST: Final = Waits(connect_s=2, answer_s=2)  # a command: one line within seconds


def redis_client(settings: Settings, waits: Waits = LONG_RUNNING) -> SyncClient:
    """A client for `REDIS_URL`: the streams, leases, dead letters and notifications
    (a Redis, its database number honoured, or a Redis Cluster). A command waits at most
    `redis_answer_s` for its answer, well inside a lease (`liveness`: keepalives too)."""
    answer = redis_answer_s(settings) if waits.answer_s is None else waits.answer_s
    connect = {} if waits.connect_s is None else {"socket_connect_timeout": waits.connect_s}
    return connection.connect(
        settings.redis_url, socket_timeout=answer, health_check_interval=15, **connect
    )


REDIS_ANSWER_MAX_S = 5.0


def redis_answer_s(settings: Settings) -> float:
    """How long ingest waits for Redis to answer a command: a blocking read's own wait plus
    a third of the lease (at most REDIS_ANSWER_MAX_S, at least 1 s). A Redis that stopped
    answering is noticed in time to keep the leases (the old 30 s outlived them: all four
    were lost, again and again, while Redis hung)."""
    spare = max(1.0, min(REDIS_ANSWER_MAX_S, settings.lease_seconds / 3))
    return settings.block_ms / 1000 + spare


QUEUE_ANSWER_S: Final = 30.0  # RQ's dequeue blocks for 15 s (worker_ttl - 15)


def queue_client(settings: Settings, waits: Waits = LONG_RUNNING) -> redis.Redis:
    """A Redis client for `CONTEXTLOG_QUEUE_REDIS_URL` (default: REDIS_URL): RQ's queues
    and scheduler, idle timers, compaction claims, worker heartbeats."""
    answer = QUEUE_ANSWER_S if waits.answer_s is None else waits.answer_s
    connect = {} if waits.connect_s is None else {"socket_connect_timeout": waits.connect_s}
    url = settings.queue_redis_url
    return redis.Redis.from_url(
        url, **connection.options(url, socket_timeout=answer, health_check_interval=15, **connect)
    )


def pg_connector(settings: Settings, waits: Waits = LONG_RUNNING) -> Callable[[], PgConn]:
    """A function opening a fresh Postgres connection for `DATABASE_URL`, with keepalives
    and a connect timeout (`liveness.postgres_options`)."""
    connect_s = {} if waits.connect_s is None else {"connect_timeout": waits.connect_s}

    def connect() -> PgConn:
        options = postgres_options(settings.database_url, **connect_s)
        return psycopg.connect(settings.database_url, application_name="contextlog", **options)

    return connect


def relay(
    settings: Settings, client: SyncClient | None = None, queue: redis.Redis | None = None
) -> Relay:
    """Where committed effects go: notices to adapter streams (REDIS_URL), jobs and idle
    timers to RQ (the queue Redis)."""
    client = client or redis_client(settings)
    queue = queue or queue_client(settings)
    timeout = int(settings.summary_timeout * settings.summary_attempts * 2) + 60
    return Relay(
        RedisNotifier(client),
        Jobs(queue, job_timeout=timeout),
        Timers(queue),
        scrubber=Scrubber(client, queue),
    )


def open_event_log(
    settings: Settings,
    client: SyncClient | None = None,
    queue: redis.Redis | None = None,
    clock: Clock | None = None,
) -> Callable[[], EventLog]:
    """A function opening the Postgres event log; connection failures become `Unavailable`.
    `clock`: the time the log records (`events.recorded_at`), the process's."""
    clock = clock or SystemClock()
    connect = pg_connector(settings)
    effects = relay(settings, client, queue)
    watchdog = Watchdog()  # one thread cuts every connection's overdue calls
    # A call may wait for Postgres as long as a stalled transaction may last (its lease,
    # 5 s at least): past it, the batch would be fenced anyway.
    deadline = max(settings.lease_seconds, IDLE_TRANSACTION_FLOOR_S)

    def open_log() -> EventLog:
        try:
            conn = connect()
            bound_waits(conn, settings.lease_seconds)
            return PostgresEventLog(
                conn,
                defaults=settings.conversation,
                relay=effects,
                now=clock.now,
                watchdog=watchdog,
                deadline_s=deadline,
            )
        except psycopg.OperationalError as e:
            raise Unavailable(f"Postgres: {e}") from e

    return open_log


def summarizer(settings: Settings) -> Summarizer:
    """The Anthropic summarizer when ANTHROPIC_API_KEY is set, the local one otherwise."""
    return api_tools(settings)[0]


def api_tools(settings: Settings) -> tuple[Summarizer, ApiCompactor | None]:
    """The summarizer and the compactor: over the Anthropic API (one client) when
    ANTHROPIC_API_KEY is set; else the local summarizer, and no compactor."""
    # Imported here: `anthropic` takes ~0.8 s to import, and ingest never needs it.
    from contextlog.worker.tasks.compaction import ApiCompactor
    from contextlog.worker.tasks.deadline import Deadlines
    from contextlog.worker.tasks.summarize import AnthropicSummarizer, LocalSummarizer, make_client

    if not settings.anthropic_api_key:
        return LocalSummarizer(), None
    deadlines = Deadlines()  # CONTEXTLOG_SUMMARY_TIMEOUT is each request's whole budget
    client = make_client(
        settings.anthropic_api_key,
        base_url=settings.anthropic_base_url,
        timeout=settings.summary_timeout,
        deadlines=deadlines,
    )
    summaries = AnthropicSummarizer(
        client,
        settings.summary_model,
        attempts=settings.summary_attempts,
        deadlines=deadlines,
        budget=settings.summary_timeout,
    )
    return summaries, ApiCompactor(client, summaries.retry, deadlines, settings.summary_timeout)


def signing_key(settings: Settings) -> signing.Key:
    """The key that signs workers' results: CONTEXTLOG_SIGNING_KEY, or the one kept in
    Postgres (made by the first process that needs it), read on first use."""
    if settings.signing_key is not None:
        return signing.Key.of(settings.signing_key.encode())

    def load() -> bytes:
        try:
            with pg_connector(settings)() as conn:
                row = conn.execute(
                    query("signing_key"), {"value": secrets.token_bytes(32)}
                ).fetchone()
                conn.commit()
        except psycopg.Error as e:
            raise Unavailable(f"Postgres: the signing key could not be read: {e}") from e
        if row is None:
            raise Unavailable("Postgres: the signing key could not be made")
        return bytes(row[0])

    return signing.Key(load)


def build_resources(settings: Settings, clock: Clock | None = None) -> Resources:
    """Resources for jobs; nothing connects until first used."""
    summaries, compactor = api_tools(settings)
    return Resources(
        settings=settings,
        reader=ContextReader.from_url(settings.database_url, defaults=settings.conversation),
        # The worker's producer signs its results (summaries, compactions, auto-saves).
        producer=Producer(
            redis_client(settings), shards=settings.shards, signing_key=signing_key(settings)
        ),
        summarizer=summaries,
        clock=clock or SystemClock(),
        timers=Timers(queue_client(settings)),
        compactor=compactor,
    )


def install(res: Resources) -> None:
    """Make `res` what this process's jobs use (`tasks.resources`)."""
    resources_.install(res)


def resources() -> Resources:
    """This process's job resources: the installed ones, else built from the environment
    and installed (tests, scripts)."""
    res = resources_.installed()
    if res is None:
        res = build_resources(Settings.from_env())
        install(res)
    return res


def claim_shard_count(client: SyncClient, shards: int) -> None:
    """Record the shard count for producers, or refuse to run with a different one."""
    set_absent(client, keys.SHARDS_KEY, shards)  # on a full Redis too: ingest drains it
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
    queue = queue_client(settings)
    memory.check_policy(redis_clients(settings, client, queue), settings.accept_eviction)
    claim_shard_count(client, settings.shards)
    streams = Streams(client, settings.consumer)
    clock = clock or SystemClock()
    return Ingest(
        settings,
        streams,
        open_event_log(settings, client, queue, clock=clock),
        clock,
        stop,
        signing_key=signing_key(settings),
    )


def redis_clients(
    settings: Settings, client: SyncClient, queue: redis.Redis
) -> list[tuple[str, SyncClient]]:
    """The Redis servers a process writes to, named by their variable (the queue Redis
    only where it is another server)."""
    named: list[tuple[str, SyncClient]] = [("REDIS_URL", client)]
    if settings.queue_redis_url != settings.redis_url:
        named.append((QUEUE_REDIS_VAR, queue))
    return named


def tune_gc_for_batches() -> None:
    """Collect garbage less often in a process that holds whole batches: for ingest.

    A batch holds ~10 tracked objects (event, dicts, rows, ...) per entry, thousands of
    entries at a time, and frees them all when it is stored. At Python's default (a
    collection every 700 net allocations) every batch was scanned several times and
    pushed into the older generations, whose collections also walked every object the
    imports made: 17% of ingest's CPU time. Here a young collection starts only past
    INGEST_GC_THRESHOLD net allocations (cycles are still collected, later), and what
    start-up made is frozen out of every collection. Call it once everything is built.
    """
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(INGEST_GC_THRESHOLD, older, oldest)


def build_worker(
    settings: Settings, on_stop: Callable[[], object] | None = None
) -> ContextlogWorker:
    """An RQ worker on the `summaries` and `idle` queues (`install` its job resources
    first); `on_stop` hears of a stop signal first (`signals.Stopper.request`).

    SimpleWorker runs jobs in this process: jobs wait on the network, not the CPU, and
    the Postgres pool, Redis client and Anthropic client are kept across jobs instead
    of being rebuilt by a forked child for each one (~450 against ~100 jobs/s here).
    Scale out with more worker processes. A dead worker of the same name is taken
    over, and the scheduler child exits with its worker (see worker.rqworker).
    """
    client = queue_client(settings)
    queues = [Queue(name, connection=client) for name in (IDLE, SUMMARIES, WEBHOOKS)]
    worker = ContextlogWorker(
        queues,
        connection=client,
        name=worker_name(settings),
        # RQ's scheduler runs in one worker, under a lock that expires 61 s after its
        # holder dies; the others try to take it at each maintenance pass. RQ's default
        # pass is every 10 min; every 15 s (and a 15 s dequeue wait, from worker_ttl)
        # makes due timers fire within ~61 + 15 + 15 s of the scheduler's worker dying.
        maintenance_interval=MAINTENANCE_S,
        worker_ttl=WORKER_TTL_S,
    )
    worker.on_stop = on_stop
    return worker


def check_worker_redis(settings: Settings) -> None:
    """Refuse (`ConfigError`) to run the worker on a Redis that may evict keys: a check
    before it starts, so it fails fast (`FAIL_FAST`) on a Redis that does not answer."""
    client, queue = redis_client(settings, FAIL_FAST), queue_client(settings, FAIL_FAST)
    try:
        memory.check_policy(redis_clients(settings, client, queue), settings.accept_eviction)
    finally:
        client.close()
        queue.close()


SUMMARY_GRACE_S = 120.0  # a summary missing this long after its save is queued again
MAINTENANCE_S = 15
WORKER_TTL_S = 30


def worker_name(settings: Settings) -> str:
    """The RQ worker's name: stable across restarts when CONTEXTLOG_CONSUMER is."""
    return f"contextlog-{settings.consumer}"


def sweep_forever(settings: Settings, stop: threading.Event) -> None:
    """The worker's reconciliation and upkeep: at start, then every
    CONTEXTLOG_SWEEP_SECONDS, queue again the summaries whose jobs were lost and re-arm the
    idle timers Redis lost (Redis data loss, a worker that died in a job), index messages
    stored before search existed, and apply the retention policy. No error ends it (see
    `Loop`)."""
    res = resources()
    client = queue_client(settings)
    jobs = relay(settings, queue=client).jobs
    connect = pg_connector(settings)

    def cycle() -> None:
        if n := jobs.requeue_pending(res.reader, res.clock.now(), SUMMARY_GRACE_S):
            log.info("lost summary jobs queued again", count=n)
        if n := idle.sweep(res.reader, res.timers, res.clock.now()):
            log.info("idle timers re-armed", count=n)
        retention.backfill_step(connect)
        retention.run_step(settings, connect, res.producer, res.clock.now())

    beat = Heartbeat(client, worker_name(settings), settings.sweep_seconds)
    Loop("sweeper", cycle, settings.sweep_seconds, beat, res.clock, stop).run()


def index_forever(settings: Settings, stop: threading.Event) -> None:
    """The worker's search indexer (tasks/indexer.py), until `stop` is set."""
    Indexer(pg_connector(settings), stop).run()


WEBHOOK_POLL_S = 0.5  # how often the dispatcher looks for notices when it found none


def dispatch_webhooks_forever(settings: Settings, stop: threading.Event) -> None:
    """The worker's webhook dispatcher: notices of followed streams to delivery jobs,
    until `stop`. An error is logged and the loop goes on after a pause."""
    res = resources()
    deliveries = Deliveries(queue_client(settings), settings.webhook_attempts)
    dispatcher = Dispatcher(
        res.reader.connection, redis_client(settings), deliveries, worker_name(settings)
    )
    while not stop.is_set():
        try:
            found = dispatcher.cycle()
        except (Unavailable, psycopg.Error, redis.RedisError) as e:
            log.warning("webhook dispatch failed; retrying", error=str(e))
            found = 0
            stop.wait(settings.backoff_max)
        if not found:
            stop.wait(WEBHOOK_POLL_S)


def build_api_services(settings: Settings, clock: Clock | None = None) -> Services:
    """What `contextlog api` serves requests with; nothing connects until it is opened."""
    # Imported here: the `api` extra's modules are needed by the api process only.
    from psycopg_pool import AsyncConnectionPool

    from contextlog.producers.producer import AsyncProducer
    from contextlog.producers.reader import AsyncContextReader
    from contextlog.worker.api.keys import Keys
    from contextlog.worker.api.limits import RateLimiter
    from contextlog.worker.api.services import Services

    clock = clock or SystemClock()
    options = settings.reader_options()
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        settings.database_url,
        min_size=1,
        max_size=4,
        open=False,
        kwargs={"autocommit": True, "connect_timeout": 5, "application_name": "contextlog-api"},
    )
    client = redis_client(settings)
    queue = queue_client(settings)
    limits = {"shards": settings.shards, "max_entry_bytes": settings.max_entry_bytes}
    return Services(
        settings=settings,
        reader=AsyncContextReader.from_url(settings.database_url, **options),
        # It signs only what an admin key may ask for (an erase): the API builds no other
        # event that only workers and operators send (`api/commands.py`).
        producer=AsyncProducer(
            connection.connect_async(settings.redis_url, socket_timeout=30),
            signing_key=signing_key(settings),
            **limits,
        ),
        sync_reader=ContextReader.from_url(settings.database_url, **options),
        sync_producer=Producer(client, **limits),
        pool=pool,
        redis=connection.connect_async(settings.redis_url, socket_timeout=60),
        keys=Keys(pool.connection, settings.api_key_cache, clock.monotonic),
        limiter=RateLimiter(settings.api_rate, settings.api_burst, clock.monotonic),
        clock=clock,
        deliveries=Deliveries(queue, settings.webhook_attempts),
    )
