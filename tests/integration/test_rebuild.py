"""Rebuilding the projections from the log gives exactly what live ingest built."""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from typing import Any

import psycopg
import pytest

from contextlog.producers import Producer
from contextlog.worker.cli import main as cli
from contextlog.worker.store.rebuild import rebuild
from tests.support.running import count_events, eventually, running, settings_for

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def snapshot(url: str) -> tuple[list[Any], list[Any], list[Any]]:
    with psycopg.connect(url) as conn:
        convs = conn.execute("SELECT * FROM conversations ORDER BY agent, channel").fetchall()
        threads = conn.execute("SELECT * FROM threads ORDER BY agent, channel, thread").fetchall()
        sessions = conn.execute(
            "SELECT * FROM sessions ORDER BY agent, channel, session_id"
        ).fetchall()
    return convs, threads, sessions


def push_random_log(producer: Producer, n: int, seed: int) -> None:
    rng = random.Random(seed)
    sent = 0
    while sent < n:
        with producer.batch() as b:
            for _ in range(500):
                agent, channel = f"agent{rng.randrange(4)}", f"ch{rng.randrange(50)}"
                at = T0 + dt.timedelta(seconds=rng.randrange(30 * 86400))
                roll = rng.random()
                if roll < 0.02:
                    b.clear(agent, channel, occurred_at=at)
                elif roll < 0.024:
                    b.save(agent, channel, rng.choice([None, "work", "Work!"]), occurred_at=at)
                elif roll < 0.026:
                    b.restore(agent, channel, rng.choice(["last", "nope"]), occurred_at=at)
                elif roll < 0.027:
                    b.purge_sessions(agent, channel, rng.randrange(3), occurred_at=at)
                elif roll < 0.03:
                    b.configure(
                        agent,
                        channel,
                        occurred_at=at,
                        rolling_window=rng.choice([None, 3600, 7200]),
                        token_budget=rng.choice([None, 500, 9000]),
                    )
                else:
                    b.post_message(
                        agent,
                        channel,
                        rng.choice(["user", "assistant"]),
                        "x" * rng.randrange(1, 300),
                        occurred_at=at,
                        thread=rng.choice([None, None, "t1", "t2"]),
                    )
        sent += 500


def test_rebuild_equals_live_for_100000_random_events(db: str, redis_url: str) -> None:
    producer = Producer.from_url(redis_url, shards=4)
    with running(settings_for(db, redis_url, CONTEXTLOG_BLOCK_MS="20")):
        push_random_log(producer, 100_000, seed=7)
        eventually(lambda: count_events(db) == 100_000, timeout=120, what="100,000 events")
    live = snapshot(db)
    assert len(live[0]) == 200 and len(live[1]) > 200
    assert any(row[3] > 0 for row in live[0])  # some conversations were cleared
    assert len(live[2]) > 100 and any(s[19] is not None for s in live[2])  # saved, purged
    with psycopg.connect(db) as conn:
        restored = conn.execute("SELECT count(*) FROM conversations WHERE restored_at IS NOT NULL")
        assert restored.fetchone() != (0,)  # and restored
        started = time.monotonic()
        assert rebuild(conn, chunk=7_000) == 100_000  # chunks cut across conversations
        print(f"rebuild took {time.monotonic() - started:.1f}s")
    assert snapshot(db) == live


def test_cli_context_and_rebuild(
    db: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", db)
    monkeypatch.setenv("REDIS_URL", redis_url)
    producer = Producer.from_url(redis_url, shards=4)
    with running(settings_for(db, redis_url)):
        producer.post_message("alpha", "general", "user", "what is 2+2?")
        producer.post_message(
            "alpha",
            "general",
            "assistant",
            [{"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {"expr": "2+2"}}],
        )
        producer.post_message(
            "alpha",
            "general",
            "user",
            [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}],
        )
        producer.post_message("alpha", "general", "assistant", "4")
        eventually(lambda: count_events(db) == 4, what="4 events")
    capsys.readouterr()
    assert cli.main(["context", "alpha", "general", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user", "assistant"]
    assert out["messages"][1]["content"][0]["input"] == {"expr": "2+2"}
    assert out["truncated"] is False
    assert cli.main(["context", "alpha", "general"]) == 0
    assert "tool_use toolu_1 calc" in capsys.readouterr().out
    assert cli.main(["rebuild"]) == 0
    assert "from 4 events" in capsys.readouterr().out
