"""Ingest drains a full Redis (`maxmemory` reached, `noeviction`), which frees it; producers
are told Redis is full. On private servers: Redis 7 (the machine's) and Redis 6.2."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from contextlog.producers import Producer, Unavailable
from contextlog.schema import keys
from contextlog.worker.app.clock import FakeClock
from contextlog.worker.app.config import Settings
from contextlog.worker.ingest import deadletters
from contextlog.worker.ingest.loop import Ingest
from contextlog.worker.ingest.streams import Streams
from contextlog.worker.store.eventlog import MemoryEventLog
from tests.support import services
from tests.support.servers import RedisServer, ServerMissing, redis_server_binary

SHARDS = 4


@pytest.fixture
def redis7(tmp_path: Path) -> Iterator[Any]:
    try:
        redis_server_binary()
    except ServerMissing as e:
        services.unavailable("a private redis-server", str(e))
    with RedisServer(appendonly=False, workdir=tmp_path) as server:
        client = redis.Redis.from_url(server.url)
        if not client.info("server")["redis_version"].startswith("7"):
            services.unavailable("redis-server 7", client.info("server")["redis_version"])
        yield client
        client.close()


def ingest(client: Any, log: MemoryEventLog, name: str = "c1") -> Ingest:
    settings = Settings(shards=SHARDS, block_ms=1, lease_seconds=6, consumer=name)
    clock = FakeClock()
    return Ingest(
        settings, Streams(client, name), lambda: log, clock, threading.Event(), clock.sleep
    )


def fill(client: Any) -> tuple[Producer, list[str]]:
    """Twenty valid messages and one bad entry on the streams."""
    producer = Producer(client, shards=SHARDS)
    ids = [producer.post_message("alpha", f"c{i % 5}", "user", f"m{i}") for i in range(20)]
    client.xadd(keys.stream(keys.shard_of("alpha", "c0", SHARDS)), {"e": b"{broken"})
    return producer, ids


def full(client: Any) -> None:
    """Redis at its maxmemory: every command that may need memory is refused."""
    client.config_set("maxmemory", 1)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("probe", "x")


def test_a_full_redis_7_is_drained_by_an_ingest_that_starts_then(redis7: Any) -> None:
    producer, ids = fill(redis7)
    full(redis7)
    with pytest.raises(Unavailable, match="Redis is full"):
        producer.post_message("alpha", "c0", "user", "refused")
    log = MemoryEventLog()
    ing = ingest(redis7, log)
    for _ in range(5):
        ing.step()
    # It took every lease (a few bytes, allowed while full), stored, dead-lettered, acked
    # and trimmed (all but each stream's last entry, its group's position): Redis has its
    # memory back.
    assert len(ing.leases.owned) == SHARDS and ing.crashes == 0
    assert sorted(str(a.event.event_id) for _, a in log.rows) == sorted(ids)
    assert [f[b"reason"] for _, f in deadletters.newest(redis7, SHARDS, 10)] == [b"malformed"]
    assert all(redis7.xlen(keys.stream(s)) <= 1 for s in range(SHARDS))
    redis7.config_set("maxmemory", 0)
    producer.post_message("alpha", "c0", "user", "accepted again")


def test_a_full_redis_6_is_drained_by_the_ingest_that_holds_its_shards(redis62: Any) -> None:
    producer, ids = fill(redis62)
    log = MemoryEventLog()
    ing = ingest(redis62, log)
    ing.leases.rebalance()  # the leases were taken before Redis filled up
    full(redis62)
    with pytest.raises(Unavailable, match="Redis is full"):
        producer.post_message("alpha", "c0", "user", "refused")
    for _ in range(5):
        ing.step()
    assert len(ing.leases.owned) == SHARDS and ing.crashes == 0
    assert sorted(str(a.event.event_id) for _, a in log.rows) == sorted(ids)
    # Redis 6 cannot run a script while full: the bad entry waits for memory, unacked.
    assert deadletters.count(redis62, SHARDS) == 0 and "redis" in ing.health.down
    redis62.config_set("maxmemory", 0)
    for _ in range(3):
        ing.step()
    assert deadletters.count(redis62, SHARDS) == 1 and not ing.health.down
