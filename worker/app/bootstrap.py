"""The composition root: builds clients from settings and hands them to the code that needs them.

Nothing connects at import time; every process (and every forked child) calls these.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
import redis
import structlog
from psycopg.rows import TupleRow
from rq import Queue

from contextlog.producers import connection
from contextlog.producers.connection import SyncClient
from contextlog.producers.producer import Producer
from contextlog.producers.reader import ContextReader
from contextlog.schema import keys
from contextlog.schema.errors import ConfigError, Unavailable
from contextlog.worker.app.clock import Clock, SystemClock
from contextlog.worker.app.config import Settings
from contextlog.worker.effects.notify import RedisNotifier
from contextlog.worker.effects.relay import Relay
from contextlog.worker.effects.scrub import Scrubber
from contextlog.worker.ingest.loop import Ingest
from contextlog.worker.ingest.streams import Streams
from contextlog.worker.store.eventlog import EventLog, PostgresEventLog, bound_waits
from contextlog.worker.tasks import idle, retention
from contextlog.worker.tasks.indexer import Indexer
from contextlog.worker.tasks.queue import SUMMARIES, Jobs
from contextlog.worker.tasks.rqworker import ContextlogWorker
from contextlog.worker.tasks.sweeper import Heartbeat, Loop
from contextlog.worker.tasks.timers import IDLE, Timers

if TYPE_CHECKING:
    from contextlog.worker.tasks.compaction import ApiCompactor

PgConn = psycopg.Connection[TupleRow]

# Net allocations of tracked objects (containers) between two young-generation collections
# in an ingest process; Python's default is 700.
INGEST_GC_THRESHOLD = 50_000
log = structlog.get_logger("contextlog.bootstrap")

if TYPE_CHECKING:
    from contextlog.worker.tasks.summarize import Summarizer


def redis_client(settings: Settings) -> SyncClient:
    """A client for `REDIS_URL`: the streams, leases, dead letters and notifications
    (a Redis, its database number honoured, or a Redis Cluster)."""
    return connection.connect(settings.redis_url, socket_timeout=30, health_check_interval=15)


def queue_client(settings: Settings) -> redis.Redis:
    """A Redis client for `CONTEXTLOG_QUEUE_REDIS_URL` (default: REDIS_URL): RQ's queues
    and scheduler, idle timers, compaction claims, worker heartbeats."""
    return redis.Redis.from_url(
        settings.queue_redis_url, socket_timeout=30, health_check_interval=15
    )


def pg_connector(settings: Settings) -> Callable[[], PgConn]:
    """A function opening a fresh Postgres connection for `DATABASE_URL`."""

    def connect() -> PgConn:
        return psycopg.connect(
            settings.database_url, connect_timeout=5, application_name="contextlog"
        )

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

    def open_log() -> EventLog:
        try:
            conn = connect()
            bound_waits(conn, settings.lease_seconds)
            return PostgresEventLog(
                conn, defaults=settings.conversation, relay=effects, now=clock.now
            )
        except psycopg.OperationalError as e:
            raise Unavailable(f"Postgres: {e}") from e

    return open_log


@dataclass
class Resources:
    """What jobs use: built once per worker process (after any fork)."""

    settings: Settings
    reader: ContextReader
    producer: Producer
    summarizer: Summarizer
    clock: Clock
    timers: Timers
    compactor: ApiCompactor | None = None  # the API's compaction (with an API key)


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


def build_resources(settings: Settings, clock: Clock | None = None) -> Resources:
    """Resources for jobs; nothing connects until first used."""
    summaries, compactor = api_tools(settings)
    return Resources(
        settings=settings,
        reader=ContextReader.from_url(settings.database_url, defaults=settings.conversation),
        producer=Producer(redis_client(settings), shards=settings.shards),
        summarizer=summaries,
        clock=clock or SystemClock(),
        timers=Timers(queue_client(settings)),
        compactor=compactor,
    )


_resources: dict[int, Resources] = {}  # by pid: a forked child builds its own


def install(res: Resources) -> None:
    """Make `res` what this process's jobs use (`contextlog worker` and tests)."""
    _resources.clear()
    _resources[os.getpid()] = res


def resources() -> Resources:
    """This process's job resources, built from the environment on first use."""
    res = _resources.get(os.getpid())
    if res is None:
        res = build_resources(Settings.from_env())
        install(res)
    return res


def claim_shard_count(client: SyncClient, shards: int) -> None:
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
    clock = clock or SystemClock()
    return Ingest(settings, streams, open_event_log(settings, client, clock=clock), clock, stop)


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


def build_worker(settings: Settings) -> ContextlogWorker:
    """An RQ worker on the `summaries` and `idle` queues, its job resources installed.

    SimpleWorker runs jobs in this process: jobs wait on the network, not the CPU, and
    the Postgres pool, Redis client and Anthropic client are kept across jobs instead
    of being rebuilt by a forked child for each one (~450 against ~100 jobs/s here).
    Scale out with more worker processes. A dead worker of the same name is taken
    over, and the scheduler child exits with its worker (see worker.rqworker).
    """
    install(build_resources(settings))
    client = queue_client(settings)
    queues = [Queue(name, connection=client) for name in (IDLE, SUMMARIES)]
    return ContextlogWorker(
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
