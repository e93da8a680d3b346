"""RQ's scheduler lives in one worker; when that worker dies, due timers still fire
within 2 minutes because `contextlog worker` runs RQ's maintenance (where a standby
takes the expired scheduler lock) every 30 s instead of every 10 min. Takes ~1.5 min."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg
import pytest
import redis

from contextlog.producers import ContextReader, Producer
from tests.support.processes import Process, offline_env
from tests.support.running import eventually, running, settings_for

pytestmark = pytest.mark.e2e

LOCK = "rq:scheduler-lock:idle"
FAILOVER_LIMIT_S = 120.0


def test_timers_fire_within_two_minutes_of_the_schedulers_worker_dying(
    db: str, redis_url: str, tmp_path: Path
) -> None:
    env = offline_env(db, redis_url)
    rds = redis.Redis.from_url(redis_url)
    first = Process("worker", env, tmp_path / "first.log").start()
    standby = Process("worker", env, tmp_path / "standby.log")
    producer = Producer(rds, shards=4)
    reader = ContextReader.from_url(db)
    try:
        eventually(lambda: rds.exists(LOCK) == 1, what=f"a scheduler\n{first.tail()}")
        holder = rds.get(LOCK)
        standby.start()
        eventually(
            lambda: b"Listening on" in (tmp_path / "standby.log").read_bytes(), what="standby"
        )
        assert first.proc is not None
        os.killpg(first.proc.pid, 9)  # the worker and its scheduler, as a machine crash would
        first.proc.wait(timeout=10)
        with running(settings_for(db, redis_url)):
            producer.configure("alpha", "c", idle_timeout=2, source="bot")
            last = producer.post_message("alpha", "c", "user", "hello", source="bot")
            reader.context("alpha", "c", wait_for=last, timeout=10)
            due = time.monotonic() + 2

            def saved() -> bool:
                with psycopg.connect(db) as conn:
                    row = conn.execute("SELECT count(*) FROM sessions WHERE auto").fetchone()
                return row == (1,)

            eventually(saved, timeout=FAILOVER_LIMIT_S + 10, what=f"the timer\n{standby.tail()}")
            late = time.monotonic() - due
        assert rds.get(LOCK) not in (None, holder)  # the standby's scheduler took over
        assert late < FAILOVER_LIMIT_S, f"fired {late:.0f}s after its deadline"
        print(f"timer fired {late:.1f}s after its deadline, the scheduler's worker dead")
    finally:
        first.stop()
        standby.stop()
        reader.close()
        rds.close()
