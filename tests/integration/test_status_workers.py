"""`contextlog status` on what Redis 6.2 reports (no consumer-group lag), and on worker
sweeper heartbeats (fakeredis)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import fakeredis

from contextlog.schema import keys
from contextlog.worker.app import status
from contextlog.worker.tasks.sweeper import heartbeat_key

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_a_shard_with_entries_and_no_owner_is_unhealthy_on_redis_6_2(redis62: Any) -> None:
    assert redis62.info()["redis_version"].startswith("6.2")
    stream = keys.stream(0)
    redis62.xgroup_create(stream, keys.INGEST_GROUP, id="0", mkstream=True)
    for _ in range(3):
        redis62.xadd(stream, {"e": b"{}"})
    row = status._shard(redis62, 0, None, 0, int(NOW.timestamp() * 1000))
    assert row.lag == 3
    assert status.shard_problems([row]) == ["shard 0 has work waiting and no ingest owner"]
    redis62.xreadgroup(keys.INGEST_GROUP, "c1", {stream: ">"}, count=2)
    redis62.xack(stream, keys.INGEST_GROUP, *[e[0] for e in redis62.xrange(stream)][:2])
    assert status._shard(redis62, 0, None, 0, 0).lag == 1


def _worker(r: Any, name: str, **beat: float) -> None:
    r.sadd("rq:workers", f"rq:worker:{name}")
    r.hset(f"rq:worker:{name}", mapping={"hostname": "elsewhere", "pid": "1"})
    if beat:
        r.hset(heartbeat_key(name), mapping=beat)


def test_workers_whose_sweeper_is_dead_silent_or_stalled_are_reported() -> None:
    r = fakeredis.FakeRedis()
    at = NOW.timestamp()
    _worker(r, "ok", beat=at - 5, swept=at - 100, every=300)
    _worker(r, "silent", beat=at - 600, swept=at - 600, every=300)
    _worker(r, "stalled", beat=at - 5, swept=at - 3000, every=300)
    _worker(r, "died", beat=at - 5, died=at - 5, every=300)
    r.sadd("rq:workers", "rq:worker:expired")
    alive, problems = status.workers_alive(r, NOW)
    assert alive == 3  # ok, stalled, died: their processes still beat
    assert problems == [
        "worker died: its sweeper thread died: ?",
        "worker expired is gone: its registration expired without a clean exit",
        "worker silent is gone: not heard from for 600 s (its sweeper beats every 15 s)",
        "worker stalled: its sweeper has not completed a cycle for 3000 s (every 300 s)",
    ]


def test_ingest_crash_looping_is_unhealthy_even_while_the_crasher_holds_the_leases() -> None:
    from contextlog.worker.ingest.streams import Streams

    r = fakeredis.FakeRedis()
    now_ms = int(NOW.timestamp() * 1000)
    looping = Streams(r, "ingest-1")
    assert status.ingest_problems(r, now_ms) == []
    looping.record_start(now_ms - 90_000)  # started, then killed: never stopped cleanly
    looping.record_crash(now_ms - 60_000, "OverflowError: date value out of range")
    looping.record_start(now_ms - 30_000)  # restarted by its supervisor, still running
    r.zadd(keys.MEMBERS, {"ingest-1": now_ms + 15_000})  # live, holding its leases
    assert status.ingest_problems(r, now_ms) == []  # two failures: not yet a loop
    looping.record_crash(now_ms - 1_000, "OverflowError: date value out of range")
    [problem] = status.ingest_problems(r, now_ms)
    assert problem.startswith("ingest is crash-looping: 3 crashes in the last 10 min")
    assert "ingest-1: OverflowError" in problem
    # Ten minutes later, with no new crash, it is healthy again.
    assert status.ingest_problems(r, now_ms + 600_000) == []


def test_clean_restarts_are_not_crashes() -> None:
    from contextlog.worker.ingest.streams import Streams

    r = fakeredis.FakeRedis()
    now_ms = int(NOW.timestamp() * 1000)
    for i in range(5):  # five deploys in a row, each stopped with SIGTERM
        run = Streams(r, f"ingest-{i}")
        run.record_start(now_ms - 10_000 + i)
        run.record_stop()
    assert status.ingest_problems(r, now_ms) == []
