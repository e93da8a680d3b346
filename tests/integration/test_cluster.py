"""contextlog on a Redis Cluster: producers, ingest, dead letters, status, and a master's
failover under load. The streams' Redis is a private 3-master cluster (tests.support.
cluster); RQ's queues and idle timers stay on the standalone test Redis
(CONTEXTLOG_QUEUE_REDIS_URL), as RQ cannot use a cluster."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from contextlog.producers import AsyncProducer, Producer, Unavailable
from contextlog.producers.ids import uuid7
from contextlog.schema import events as ev
from contextlog.schema import keys
from contextlog.worker.app.clock import SystemClock
from contextlog.worker.app.config import Settings
from contextlog.worker.app.status import gather
from contextlog.worker.ingest import deadletters
from tests.support.cluster import RedisCluster3
from tests.support.running import count_events, eventually, running, settings_for, stored_ids

SHARDS = 4
CONVERSATIONS = [f"c{i}" for i in range(16)]  # spread over all 4 shards, so all 3 masters


@pytest.fixture
def settings(db: str, redis_url: str, redis_cluster: RedisCluster3) -> Settings:
    """Streams on the cluster, RQ on the standalone test Redis."""
    return settings_for(db, redis_cluster.url, CONTEXTLOG_QUEUE_REDIS_URL=redis_url)


@pytest.fixture
def cluster_client(redis_cluster: RedisCluster3) -> Iterator[Any]:
    client = redis_cluster.client()
    yield client
    client.close()


def test_the_shards_span_every_master(redis_cluster: RedisCluster3, cluster_client: Any) -> None:
    """The premise of the other tests: the conversations used here reach all 3 masters."""
    shards = {keys.shard_of("alpha", c, SHARDS) for c in CONVERSATIONS}
    nodes = {cluster_client.get_node_from_key(keys.stream(s)).port for s in shards}
    assert shards == set(range(SHARDS)) and nodes == set(redis_cluster.masters())


def test_sync_producer_pushes_to_a_cluster(
    redis_cluster: RedisCluster3, cluster_client: Any
) -> None:
    producer = Producer.from_url(redis_cluster.url, shards=SHARDS)
    ids = [producer.post_message("alpha", c, "user", "hi") for c in CONVERSATIONS]
    with producer.batch() as b:  # a pipeline over several shards: not atomic, allowed
        for c in CONVERSATIONS:
            b.post_message("alpha", c, "assistant", "hello")
    one = producer.push_many([_message("c0", f"m{i}") for i in range(3)], atomic=True)
    assert len(set(ids)) == len(CONVERSATIONS) and len(one) == 3
    assert _stream_total(cluster_client) == 2 * len(CONVERSATIONS) + 3
    producer.close()


def test_an_atomic_push_over_several_shards_is_refused_on_a_cluster(
    redis_cluster: RedisCluster3, cluster_client: Any
) -> None:
    producer = Producer.from_url(redis_cluster.url, shards=SHARDS)
    events = [_message(c, "x") for c in CONVERSATIONS[:4]]
    with pytest.raises(ValueError, match="needs events of one shard"):
        producer.push_many(events, atomic=True)
    assert _stream_total(cluster_client) == 0  # nothing half-sent
    producer.close()


def test_async_producer_pushes_to_a_cluster(
    redis_cluster: RedisCluster3, cluster_client: Any
) -> None:
    async def push() -> list[str]:
        producer = AsyncProducer.from_url(redis_cluster.url, shards=SHARDS)
        try:
            ids = [await producer.post_message("alpha", c, "user", "hi") for c in CONVERSATIONS]
            async with producer.batch() as b:
                for c in CONVERSATIONS:
                    b.post_message("alpha", c, "assistant", "hello")
            return ids
        finally:
            await producer.aclose()

    assert len(set(asyncio.run(push()))) == len(CONVERSATIONS)
    assert _stream_total(cluster_client) == 2 * len(CONVERSATIONS)


def test_ingest_on_a_cluster_stores_every_event_once_in_order(
    db: str, settings: Settings, redis_cluster: RedisCluster3
) -> None:
    producer = Producer.from_url(redis_cluster.url, shards=SHARDS)
    sent: dict[str, list[str]] = {c: [] for c in CONVERSATIONS}
    with running(settings):
        for i in range(10):
            for c in CONVERSATIONS:
                sent[c].append(producer.post_message("alpha", c, "user", f"m{i}"))
        total = 10 * len(CONVERSATIONS)
        eventually(lambda: count_events(db) == total, what=f"{total} events stored")
    for c in CONVERSATIONS:
        assert stored_ids(db, "alpha", c) == sent[c]


def test_dead_letters_and_status_on_a_cluster(
    db: str, redis_url: str, settings: Settings, redis_cluster: RedisCluster3, cluster_client: Any
) -> None:
    """Each rejected entry lands in its shard's dead-letter stream, counted once, and the
    CLI's readers (status, dead-letters) see them all."""
    producer = Producer.from_url(redis_cluster.url, shards=SHARDS)
    with running(settings):
        good = producer.post_message("alpha", "c0", "user", "fine")
        for shard in range(SHARDS):
            cluster_client.xadd(keys.stream(shard), {"e": "not json"})
        eventually(
            lambda: count_events(db) == 1 and deadletters.count(cluster_client, SHARDS) == 4,
            what="1 stored, 4 dead letters",
        )
    assert stored_ids(db, "alpha", "c0") == [good]
    letters = deadletters.newest(cluster_client, SHARDS, 10)
    assert sorted(f[b"stream"].decode() for _, f in letters) == [
        keys.stream(s) for s in range(SHARDS)
    ]
    queue = Settings.from_env({"REDIS_URL": redis_url})
    from contextlog.worker.app.bootstrap import queue_client

    with psycopg.connect(db) as conn:
        status = gather(cluster_client, conn, SHARDS, SystemClock().now(), queue_client(queue))
    assert status.dead_letters == 4 and status.dead_letters_by_reason == {"malformed": 4}
    assert status.events_stored == 1 and [s.pending for s in status.shards] == [0] * SHARDS


def test_a_masters_failover_under_load_loses_and_doubles_nothing(
    db: str, settings: Settings, redis_cluster: RedisCluster3, cluster_client: Any
) -> None:
    """A steady producer and a running ingest; the master of shard 0 hands over to its
    replica (CLUSTER FAILOVER: the replica catches up first). Every event the producer
    got an id for is stored exactly once, in per-conversation order. A push that fails
    during the switch is retried with the same external id, so it is one event."""
    master = cluster_client.get_node_from_key(keys.stream(0)).port
    load = Load(Producer.from_url(redis_cluster.url, shards=SHARDS))
    with running(settings) as ingest, load:
        eventually(lambda: count_events(db) >= 100, what="ingest under way")
        promoted = redis_cluster.failover(master)
        after = count_events(db)
        eventually(lambda: count_events(db) >= after + 100, what="ingest on after failover")
        load.finish()
        eventually(lambda: count_events(db) == load.total(), timeout=30, what="all stored")
        # Ingest rode the switch as it rides a Redis outage: nothing it did failed on it
        # (leases renewed on the promoted replica, which has no scripts loaded).
        assert ingest.crashes == 0
    assert promoted != master and master not in redis_cluster.masters()
    for c in CONVERSATIONS:
        assert stored_ids(db, "alpha", c) == load.ids(c)


def test_a_killed_master_loses_at_most_its_last_unreplicated_writes(
    db: str, settings: Settings, redis_cluster: RedisCluster3, cluster_client: Any
) -> None:
    """kill -9 of the master of shard 0 under load: its replica takes over. Replication
    is asynchronous, so what the dead master acknowledged just before dying may be gone;
    everything else holds: nothing stored twice, per-conversation order kept, and any
    loss is on the dead master's shards, acknowledged within its last second."""
    master = cluster_client.get_node_from_key(keys.stream(0)).port
    dead_shards = {
        s for s in range(SHARDS) if cluster_client.get_node_from_key(keys.stream(s)).port == master
    }
    load = Load(Producer.from_url(redis_cluster.url, shards=SHARDS))
    with running(settings) as ingest, load:
        eventually(lambda: count_events(db) >= 100, what="ingest under way")
        killed_at = time.monotonic()
        promoted = redis_cluster.kill(master)
        after = count_events(db)
        eventually(lambda: count_events(db) >= after + 100, what="ingest on after the kill")
        load.finish()
        eventually(lambda: _drained(cluster_client), timeout=30, what="every entry acked")
        assert ingest.crashes == 0  # a cluster electing a master is an outage, not a crash
    stored = {c: stored_ids(db, "alpha", c) for c in CONVERSATIONS}
    assert promoted != master
    for c in CONVERSATIONS:
        ids = load.ids(c)
        assert len(set(stored[c])) == len(stored[c])  # none twice
        assert stored[c] == [i for i in ids if i in set(stored[c])]  # order kept
        lost = [i for i in ids if i not in set(stored[c])]
        if lost:
            assert keys.shard_of("alpha", c, SHARDS) in dead_shards
            assert all(killed_at - 1.0 <= load.acked[i] <= killed_at for i in lost), lost


class Load:
    """A producer pushing messages round-robin over CONVERSATIONS in a thread: at least
    MIN_MESSAGES, then on until `finish()`. A push that fails (the cluster switching
    masters) is retried with the same external id: one event whatever happened."""

    MIN_MESSAGES = 400

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.sent: dict[str, list[str]] = {c: [] for c in CONVERSATIONS}
        self.acked: dict[str, float] = {}  # event id -> when its push returned
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()
        self.producer.close()

    def finish(self) -> None:
        """Stop pushing (after MIN_MESSAGES) and wait for the thread."""
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the producer is stuck"

    def total(self) -> int:
        """Events pushed so far."""
        return sum(len(ids) for ids in self.sent.values())

    def ids(self, channel: str) -> list[str]:
        """The event ids pushed to one conversation, in order."""
        return self.sent[channel]

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set() or n < self.MIN_MESSAGES:
            c = CONVERSATIONS[n % len(CONVERSATIONS)]
            event_id = self._push(c, n)
            self.acked[event_id] = time.monotonic()
            self.sent[c].append(event_id)
            n += 1

    def _push(self, channel: str, n: int) -> str:
        for _ in range(400):
            try:
                return self.producer.post_message(
                    "alpha", channel, "user", f"m{n}", source="load", external_id=f"m{n}"
                )
            except Unavailable:
                self.stop.wait(0.05)  # the cluster elects a master; not a timer of ours
        raise AssertionError(f"message {n} could not be pushed in 20 s")


def _message(channel: str, text: str) -> ev.Event:
    return ev.MessagePosted(
        event_id=uuid7(),
        agent="alpha",
        channel=channel,
        occurred_at=dt.datetime.now(dt.UTC),
        role="user",
        content=text,
    )


def _drained(client: Any) -> bool:
    """Every entry of every shard stream delivered to ingest and acknowledged."""
    for shard in range(SHARDS):
        stream = keys.stream(shard)
        [group] = client.xinfo_groups(stream)
        last = client.xinfo_stream(stream)["last-generated-id"]
        if group["pending"] or group["last-delivered-id"] != last:
            return False
    return True


def _stream_total(client: Any) -> int:
    return sum(int(client.xlen(keys.stream(s))) for s in range(SHARDS))


def test_cli_status_dead_letters_and_notifications_on_a_cluster(
    db: str,
    redis_url: str,
    redis_cluster: RedisCluster3,
    cluster_client: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The operator's view with REDIS_URL on the cluster and the queues beside it."""
    from contextlog.producers import Notifications
    from contextlog.schema import notices as nt
    from contextlog.worker.cli import main as cli
    from contextlog.worker.effects.notify import RedisNotifier

    env = {
        "DATABASE_URL": db,
        "REDIS_URL": redis_cluster.url,
        "CONTEXTLOG_QUEUE_REDIS_URL": redis_url,
        "CONTEXTLOG_SHARDS": str(SHARDS),
        "CONTEXTLOG_LOG_LEVEL": "warning",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cluster_client.xadd(keys.stream(2), {"e": "not json"})  # waiting, no ingest runs
    assert cli.main(["status", "--json"]) == 1  # unhealthy: shard 2 has work, no owner
    out = capsys.readouterr().out
    assert '"shard 2 has work waiting and no ingest owner"' in out
    assert cli.main(["dead-letters", "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    notice = nt.Notice(
        notice_id="n1",
        kind="summary_ready",
        agent="alpha",
        channel="c0",
        occurred_at=dt.datetime.now(dt.UTC),
        text="done",
    )
    RedisNotifier(cluster_client).publish([("bot", notice), ("other", notice)])
    notes = Notifications.from_url(redis_cluster.url, "bot", consumer="t")
    assert [n.text for n in notes.read(block_ms=None)] == ["done"]
    notes.close()
