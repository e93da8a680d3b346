"""Run an ingest loop in a thread for integration tests, and wait for conditions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from contextlog.worker.app import bootstrap
from contextlog.worker.app.config import Settings
from contextlog.worker.ingest.loop import Ingest


def settings_for(database_url: str, redis_url: str, **extra: str) -> Settings:
    """Settings as a deployment would set them, with fast leases for tests."""
    env = {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "CONTEXTLOG_SHARDS": "4",
        "CONTEXTLOG_LEASE_SECONDS": "3",
        "CONTEXTLOG_BLOCK_MS": "50",
        "CONTEXTLOG_BACKOFF_MAX": "0.2",
        "CONTEXTLOG_LOG_FORMAT": "console",
    }
    return Settings.from_env({**env, **extra})


def eventually(check: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll `check` until it holds; a condition to wait for, not a timer."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@contextmanager
def running(settings: Settings) -> Iterator[Ingest]:
    """An ingest loop in a background thread, stopped (as on SIGTERM) at the end."""
    ingest = bootstrap.build_ingest(settings, threading.Event())
    thread = threading.Thread(target=ingest.run, daemon=True)
    thread.start()
    try:
        yield ingest
    finally:
        ingest.stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive(), "ingest did not stop"


def count_events(database_url: str, agent: str | None = None) -> int:
    """Events stored (for one agent, if given)."""
    with psycopg.connect(database_url) as conn:
        if agent is None:
            row = conn.execute("SELECT count(*) FROM events").fetchone()
        else:
            row = conn.execute("SELECT count(*) FROM events WHERE agent = %s", (agent,)).fetchone()
    assert row is not None
    return int(row[0])


def stored_ids(database_url: str, agent: str, channel: str) -> list[str]:
    """Event ids of one conversation in stored (seq) order."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT event_id FROM events WHERE agent = %s AND channel = %s ORDER BY seq",
            (agent, channel),
        ).fetchall()
    return [str(r[0]) for r in rows]
