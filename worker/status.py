"""What `contextlog status` reports: per-shard lag and pending work, dead letters, events
stored; job queues, idle timers, the summary backlog and failed jobs."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
import psycopg
import redis
from rq import Queue, Worker

from schema import keys
from schema.queries import query
from worker.jobs import IDLE, SUMMARIES
from worker.streams import entry_time_ms


def _queue(client: redis.Redis, name: str, now: dt.datetime) -> QueueStatus:
    q = Queue(name, connection=client)
    scheduled = q.scheduled_job_registry
    overdue = len(scheduled.get_jobs_to_schedule(int(now.timestamp() - OVERDUE_S)))
    oldest = None
    first = q.get_job_ids(0, 1)
    if first:
        job = q.fetch_job(first[0])
        if job is not None and job.enqueued_at is not None:
            at = job.enqueued_at.replace(tzinfo=job.enqueued_at.tzinfo or dt.UTC)
            oldest = max(0.0, (now - at).total_seconds())
    return QueueStatus(
        name,
        q.count,
        scheduled.count,
        q.started_job_registry.count,
        q.failed_job_registry.count,
        oldest,
        overdue,
    )


class ShardStatus(msgspec.Struct, frozen=True):
    """One shard stream as its consumer group sees it."""

    shard: int
    stream_length: int
    lag: int | None
    pending: int
    oldest_pending_age_s: float | None
    owner: str | None
    events_stored: int


class QueueStatus(msgspec.Struct, frozen=True):
    """One RQ queue: jobs waiting, delayed (idle timers), running, failed."""

    name: str
    queued: int
    scheduled: int
    started: int
    failed: int
    oldest_queued_age_s: float | None
    overdue: int  # scheduled jobs past their time: nobody runs the scheduler


class Status(msgspec.Struct, frozen=True):
    """The whole report; `healthy` is false when work waits that nothing will do."""

    healthy: bool
    problems: list[str]
    shards: list[ShardStatus]
    dead_letters: int
    dead_letters_by_reason: dict[str, int]
    events_stored: int
    ingest_consumers: int
    queues: list[QueueStatus] = []
    workers: int = 0
    scheduler: str | None = None  # the worker whose scheduler holds the lock
    summary_backlog: int = 0
    oldest_pending_summary_age_s: float | None = None
    effects_waiting: int = 0  # notices and jobs committed but not yet relayed


OVERDUE_S = 120.0  # a timer this late means no scheduler is running


def _group(client: Any, stream: str) -> dict[str, Any] | None:
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:  # no such stream yet
        return None
    for g in groups:
        name = g["name"].decode() if isinstance(g["name"], bytes) else g["name"]
        if name == keys.INGEST_GROUP:
            return dict(g)
    return None


def _shard(client: Any, shard: int, owner: str | None, stored: int, now_ms: int) -> ShardStatus:
    stream = keys.stream(shard)
    length = int(client.xlen(stream))
    group = _group(client, stream)
    lag: int | None = length if group is None else group.get("lag")
    pending, age = 0, None
    if group is not None and group["pending"]:
        summary = client.xpending(stream, keys.INGEST_GROUP)
        pending = int(summary["pending"])
        oldest = summary["min"].decode() if isinstance(summary["min"], bytes) else summary["min"]
        age = max(0.0, (now_ms - entry_time_ms(oldest)) / 1000)
    return ShardStatus(
        shard, length, None if lag is None else int(lag), pending, age, owner, stored
    )


def gather(
    client: redis.Redis, conn: psycopg.Connection[Any], shards: int, now: dt.datetime
) -> Status:
    """Read the status of every shard from Redis and the stored counts from Postgres."""
    r: Any = client  # replies are bytes: decode_responses is off
    stored = {int(row[0]): int(row[3]) for row in conn.execute(query("checkpoints")).fetchall()}
    conn.rollback()
    holders = [h.decode() if h else None for h in r.mget([keys.lease(s) for s in range(shards)])]
    now_ms = int(now.timestamp() * 1000)
    rows = [_shard(r, s, holders[s], stored.get(s, 0), now_ms) for s in range(shards)]
    reasons = {
        k.decode().removeprefix("dead:"): int(v)
        for k, v in r.hgetall(keys.STATS).items()
        if k.startswith(b"dead:")
    }
    consumers = int(r.zcount(keys.MEMBERS, now_ms, "+inf"))
    problems = [
        f"shard {row.shard} has work waiting and no ingest owner"
        for row in rows
        if row.owner is None and (row.pending or row.lag)
    ]
    queues = [_queue(client, name, now) for name in (IDLE, SUMMARIES)]
    workers = Worker.count(connection=client)
    lock = r.get(f"rq:scheduler-lock:{IDLE}")
    backlog, oldest = conn.execute(query("summary_backlog")).fetchone() or (0, None)
    waiting = conn.execute(query("effects_waiting")).fetchone()
    conn.rollback()
    for q in queues:
        if (q.queued or q.overdue) and not workers:
            problems.append(f"queue {q.name} has jobs and no worker is running")
        elif q.overdue:
            problems.append(f"{q.overdue} {q.name} jobs are overdue: is a scheduler running?")
    return Status(
        queues=queues,
        workers=workers,
        scheduler=lock.decode() if lock else None,
        summary_backlog=int(backlog),
        oldest_pending_summary_age_s=None if oldest is None else (now - oldest).total_seconds(),
        effects_waiting=int(waiting[0]) if waiting else 0,
        healthy=not problems,
        problems=problems,
        shards=rows,
        dead_letters=int(r.xlen(keys.DEAD_LETTERS)),
        dead_letters_by_reason=reasons,
        events_stored=sum(stored.values()),
        ingest_consumers=consumers,
    )
