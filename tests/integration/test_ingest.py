"""Ingest against the real Postgres and Redis: round trip, takeover, dead letters, outages."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import psycopg

from contextlog.producers import Producer
from contextlog.schema import keys
from contextlog.worker.app import bootstrap
from contextlog.worker.ingest import deadletters
from contextlog.worker.ingest.streams import Streams
from tests.support.proxy import Proxy, postgres_upstream, redis_upstream, via
from tests.support.running import count_events, eventually, running, settings_for, stored_ids


def test_smoke_ingest_round_trip(db: str, redis_url: str) -> None:
    settings = settings_for(db, redis_url)
    producer = Producer.from_url(redis_url, shards=4)
    with running(settings):
        ids = [
            producer.post_message("alpha", "general", role, f"m{i}")
            for i, role in enumerate(["user", "assistant"] * 5)
        ]
        eventually(lambda: count_events(db) == 10, what="10 events stored")
    assert stored_ids(db, "alpha", "general") == ids


def test_bad_entries_are_dead_lettered_and_good_ones_stored(
    db: str, redis_url: str, rds: Any
) -> None:
    settings = settings_for(db, redis_url)
    producer = Producer.from_url(redis_url, shards=4)
    stream = keys.stream(keys.shard_of("alpha", "general", 4))
    with running(settings):
        first = producer.post_message("alpha", "general", "user", "first")
        rds.xadd(stream, {"e": '{"type": "message.v1", "agent": "alpha"}'})
        rds.xadd(stream, {"e": "not json at all"})
        last = producer.post_message("alpha", "general", "user", "last")
        eventually(
            lambda: count_events(db) == 2 and deadletters.count(rds, 4) == 2,
            what="2 stored, 2 dead letters",
        )
    assert stored_ids(db, "alpha", "general") == [first, last]
    reasons = [f[b"reason"] for _, f in reversed(deadletters.newest(rds, 4, 10))]
    assert reasons == [b"invalid", b"malformed"]


def test_entries_left_pending_by_a_dead_consumer_are_stored_once(
    db: str, redis_url: str, rds: Any
) -> None:
    producer = Producer.from_url(redis_url, shards=4)
    ids = [producer.post_message("alpha", f"c{i % 3}", "user", f"m{i}") for i in range(30)]
    # A consumer that read everything and died before committing anything.
    dead = Streams(rds, "dead-consumer")
    for shard in range(4):
        dead.ensure_group(shard)
    dead.read_new(list(range(4)), 100, 10)
    settings = settings_for(db, redis_url, CONTEXTLOG_CONSUMER="survivor")
    with running(settings):
        eventually(lambda: count_events(db) == 30, what="30 events stored")
    for c in range(3):
        assert stored_ids(db, "alpha", f"c{c}") == ids[c::3]
    for shard in range(4):
        assert rds.xpending(keys.stream(shard), keys.INGEST_GROUP)["pending"] == 0


def test_a_dead_owners_shards_are_taken_over_within_the_lease(
    db: str, redis_url: str, rds: Any
) -> None:
    producer = Producer.from_url(redis_url, shards=4)
    a_settings = settings_for(db, redis_url, CONTEXTLOG_CONSUMER="a", CONTEXTLOG_LEASE_SECONDS="1")
    b_settings = settings_for(db, redis_url, CONTEXTLOG_CONSUMER="b", CONTEXTLOG_LEASE_SECONDS="1")
    a = bootstrap.build_ingest(a_settings, threading.Event())
    a.leases.rebalance()
    assert len(a.leases.owned) == 4  # a holds every shard, then dies without letting go
    a._close_db()  # its process is gone: connection closed, leases left to expire
    ids = [producer.post_message("alpha", f"c{i}", "user", "hi") for i in range(8)]
    with running(b_settings) as b:
        eventually(lambda: count_events(db) == 8, timeout=10, what="b to take over")
        assert sorted(b.leases.owned) == [0, 1, 2, 3]
    assert {i for c in range(8) for i in stored_ids(db, "alpha", f"c{c}")} == set(ids)
    assert [rds.get(keys.lease(s)) for s in range(4)] == [None] * 4  # b let go on stop


def test_two_ingest_processes_split_the_shards(db: str, redis_url: str) -> None:
    producer = Producer.from_url(redis_url, shards=4)
    with (
        running(
            settings_for(db, redis_url, CONTEXTLOG_CONSUMER="a", CONTEXTLOG_LEASE_SECONDS="1")
        ) as a,
        running(
            settings_for(db, redis_url, CONTEXTLOG_CONSUMER="b", CONTEXTLOG_LEASE_SECONDS="1")
        ) as b,
    ):
        eventually(
            lambda: len(a.leases.owned) == 2 and len(b.leases.owned) == 2,
            timeout=10,
            what="a fair split",
        )
        assert set(a.leases.owned).isdisjoint(b.leases.owned)
        ids = [producer.post_message("alpha", f"c{i}", "user", "hi") for i in range(40)]
        eventually(lambda: count_events(db) == 40, what="40 events stored")
    assert a.stored > 0 and b.stored > 0 and a.stored + b.stored == len(ids)


def test_ingest_rides_out_a_postgres_outage(db: str, redis_url: str, rds: Any) -> None:
    proxy = Proxy(postgres_upstream(db))
    settings = settings_for(via(db, proxy.port), redis_url)
    producer = Producer.from_url(redis_url, shards=4)
    try:
        with running(settings) as ingest:
            before = [producer.post_message("alpha", "general", "user", f"a{i}") for i in range(50)]
            eventually(lambda: count_events(db) == 50, what="first 50 stored")
            proxy.down()
            during = [producer.post_message("alpha", "general", "user", f"b{i}") for i in range(50)]
            eventually(lambda: "postgres" in ingest.health.down, what="outage noticed")
            # Hold the outage through many retries: re-reading the batch in hand must not
            # count as deliveries (or valid entries would end up dead-lettered as poison).
            eventually(lambda: ingest.retries >= 15, what="15 retries")
            assert count_events(db) == 50
            proxy.up()
            eventually(lambda: count_events(db) == 100, what="backlog stored after outage")
            eventually(lambda: not ingest.health.down, what="recovery noticed")
    finally:
        proxy.close()
    assert stored_ids(db, "alpha", "general") == before + during
    assert deadletters.count(rds, 4) == 0
    for shard in range(4):
        assert rds.xpending(keys.stream(shard), keys.INGEST_GROUP)["pending"] == 0


def test_ingest_rides_out_a_redis_outage(db: str, redis_url: str) -> None:
    proxy = Proxy(redis_upstream(redis_url))
    settings = settings_for(db, via(redis_url, proxy.port))
    producer = Producer.from_url(redis_url, shards=4)  # adapters still reach Redis
    try:
        with running(settings) as ingest:
            before = [producer.post_message("alpha", "general", "user", f"a{i}") for i in range(20)]
            eventually(lambda: count_events(db) == 20, what="first 20 stored")
            proxy.down()
            eventually(lambda: "redis" in ingest.health.down, what="outage noticed")
            during = [producer.post_message("alpha", "general", "user", f"b{i}") for i in range(20)]
            proxy.up()
            eventually(lambda: count_events(db) == 40, what="backlog stored after outage")
    finally:
        proxy.close()
    assert stored_ids(db, "alpha", "general") == before + during


def test_status_reports_lag_dead_letters_and_stored(db: str, redis_url: str, rds: Any) -> None:
    from contextlog.worker.app.clock import SystemClock
    from contextlog.worker.app.status import gather

    producer = Producer.from_url(redis_url, shards=4)
    settings = settings_for(db, redis_url)
    with running(settings):
        producer.post_message("alpha", "general", "user", "hi")
        rds.xadd(keys.stream(0), {"junk": "1"})
        eventually(
            lambda: count_events(db) == 1 and deadletters.count(rds, 4) == 1,
            what="ingest to catch up",
        )
    Streams(rds, "idle").ensure_group(1)
    rds.xadd(keys.stream(1), {"e": "{}"})  # waiting, nobody owns shard 1 now
    with psycopg.connect(db) as conn:
        status = gather(rds, conn, 4, SystemClock().now())
    assert status.events_stored == 1
    assert status.dead_letters == 1 and status.dead_letters_by_reason == {"malformed": 1}
    assert status.shards[1].lag in (1, None)  # Redis < 7 does not report lag
    assert not status.healthy
    assert status.problems == ["shard 1 has work waiting and no ingest owner"]


def test_status_says_ingest_is_stuck_when_it_holds_a_shard_and_commits_nothing(
    db: str, redis_url: str, rds: Any
) -> None:
    """An ingest that holds shard leases while its entries wait and it commits nothing (a
    hung Postgres, a full disk): `status` was healthy, since the leases were held."""
    from contextlog.worker.app.status import STUCK_S, gather

    producer = Producer.from_url(redis_url, shards=4)
    with running(settings_for(db, redis_url)):
        producer.post_message("alpha", "general", "user", "stored")
        eventually(lambda: count_events(db) == 1, what="one stored")
    shard = keys.shard_of("alpha", "general", 4)
    rds.set(keys.lease(shard), "hung-ingest", px=60_000)  # held, and nothing moves
    producer.post_message("alpha", "general", "user", "waits")
    with psycopg.connect(db) as conn:
        now = dt.datetime.now(dt.UTC)
        assert gather(rds, conn, 4, now).healthy  # just pushed: nothing is late yet
        later = gather(rds, conn, 4, now + dt.timedelta(seconds=STUCK_S + 5))
    assert not later.healthy
    assert later.problems == [
        f"ingest is stuck on shard {shard}: hung-ingest holds it and has committed nothing "
        f"for {later.shards[shard].last_commit_age_s:.0f} s while 1 entry waits (the "
        f"oldest for {later.shards[shard].oldest_waiting_age_s:.0f} s)"
    ]
