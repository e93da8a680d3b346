"""Idle-timeout auto-save with real Redis, a real `contextlog worker` (RQ and its
scheduler) and a 2-second timeout; ingest runs in a thread."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from rq import Queue

from producers import ContextReader, Producer
from producers.notifications import Notifications
from schema import notices as nt
from schema.notices import Notice
from tests.support.processes import Process, started
from tests.support.running import eventually, running, settings_for
from worker.idle import timer_key

A = "alpha"


@pytest.fixture
def env(db: str, redis_url: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"},
        "DATABASE_URL": db,
        "REDIS_URL": redis_url,
        "CONTEXTLOG_SHARDS": "4",
        "CONTEXTLOG_SWEEP_SECONDS": "1",
        "CONTEXTLOG_LOG_FORMAT": "console",
    }


@pytest.fixture
def worker(env: dict[str, str], tmp_path: Path, db: str, redis_url: str) -> Iterator[Process]:
    with running(settings_for(db, redis_url)), started("worker", env, tmp_path / "w.log") as w:
        yield w


def sessions(db: str, channel: str) -> list[tuple[str, bool, int, str | None]]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT session_id, auto, message_count, summary FROM sessions"
            " WHERE agent = %s AND channel = %s ORDER BY seq",
            (A, channel),
        ).fetchall()
    return [(str(r[0]), bool(r[1]), int(r[2]), r[3]) for r in rows]


def collect(notes: Notifications, seen: list[Notice]) -> list[Notice]:
    got = notes.read(block_ms=100)
    notes.ack(got)
    seen.extend(got)
    return seen


def test_a_quiet_conversation_is_saved_once_summarised_notified_and_cleared(
    worker: Process, db: str, redis_url: str
) -> None:
    producer = Producer(redis.Redis.from_url(redis_url), shards=4)
    reader = ContextReader.from_url(db)
    notes = Notifications(redis.Redis.from_url(redis_url), "bot", consumer="t")
    seen: list[Notice] = []
    try:
        producer.configure(A, "quiet", idle_timeout=2, source="bot")
        producer.configure(A, "never", idle_timeout=0, source="bot")
        producer.post_message(A, "never", "user", "no timer here", source="bot")
        # Two messages 1.5 s apart: the second, before the first's deadline, resets it.
        earlier = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1.5)
        producer.post_message(
            A, "quiet", "user", "Remind me to renew the cert.", source="bot", occurred_at=earlier
        )
        last = producer.post_message(
            A, "quiet", "assistant", "Noted: renew it by Friday.", source="bot"
        )
        reader.context(A, "quiet", wait_for=last, timeout=10)
        sent_at = time.time()

        def summary_arrived() -> bool:
            return any(n.kind == nt.SUMMARY_READY for n in collect(notes, seen))

        eventually(summary_arrived, timeout=30, what=f"an auto-save summary\n{worker.tail()}")
        saved = next(n for n in seen if n.kind == nt.SESSION_SAVED)
        ready = next(n for n in seen if n.kind == nt.SUMMARY_READY)
        assert saved.auto and ready.auto and ready.local  # no API key: the local summarizer
        assert "Remind me to renew the cert." in (ready.text or "")
        assert saved.occurred_at.timestamp() >= sent_at + 2 - 0.5  # 2 s after the last message
        [(sid, auto, count, summary)] = sessions(db, "quiet")
        assert auto and count == 2 and summary == ready.text and sid == saved.session_id
        assert reader.context(A, "quiet").messages == []  # cleared after the save

        # The timer is gone and nothing is scheduled: no second save can come.
        rds = redis.Redis.from_url(redis_url)
        idle_queue = Queue("idle", connection=rds)
        eventually(
            lambda: (
                rds.exists(timer_key(A, "quiet")) == 0
                and idle_queue.scheduled_job_registry.count == 0
            ),
            what="the timer to be disarmed",
        )
        rds.close()
        assert len(sessions(db, "quiet")) == 1
        assert sessions(db, "never") == []
        assert reader.context(A, "never").messages != []
    finally:
        producer.close()
        reader.close()
        notes.close()
