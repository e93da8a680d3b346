"""What `contextlog status` reports: per-shard lag and pending work, dead letters, events stored."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
import psycopg
import redis

from schema import keys
from schema.queries import query
from worker.streams import entry_time_ms


class ShardStatus(msgspec.Struct, frozen=True):
    """One shard stream as its consumer group sees it."""

    shard: int
    stream_length: int
    lag: int | None
    pending: int
    oldest_pending_age_s: float | None
    owner: str | None
    events_stored: int


class Status(msgspec.Struct, frozen=True):
    """The whole report; `healthy` is false when work waits on a shard nobody owns."""

    healthy: bool
    problems: list[str]
    shards: list[ShardStatus]
    dead_letters: int
    dead_letters_by_reason: dict[str, int]
    events_stored: int
    ingest_consumers: int


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
    return Status(
        healthy=not problems,
        problems=problems,
        shards=rows,
        dead_letters=int(r.xlen(keys.DEAD_LETTERS)),
        dead_letters_by_reason=reasons,
        events_stored=sum(stored.values()),
        ingest_consumers=consumers,
    )
