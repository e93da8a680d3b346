"""`contextlog worker` killed with SIGKILL while idle saves run: exactly one save each.

Three hundred conversations go quiet at the same moment with a 2-second timeout; the
worker is killed (SIGKILL, its scheduler child left orphaned as after a crash) twice at
seeded random moments while it works through their checks, and restarted. A job that
dies is found by the worker's sweep and re-armed; the save and clear of one idle period
carry ids derived from its last message, so every conversation ends with exactly one
auto-saved session and an empty context. (The kill inside a job's few milliseconds of
saving is pinned exactly by tests/integration/test_idle.py.)
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from pathlib import Path

import psycopg
import pytest
import redis

from contextlog.producers import ContextReader, Producer
from tests.support.processes import Process, offline_env
from tests.support.running import eventually, running, settings_for

pytestmark = pytest.mark.e2e

A = "idle-e2e"
CONVERSATIONS = 300  # ~2 s of checks and saves: the kills land while jobs run
TIMEOUT_S = 2


def _seed() -> int:
    raw = os.environ.get("CONTEXTLOG_E2E_SEED")
    return int(raw) if raw else random.SystemRandom().randrange(1 << 32)


def auto_sessions(db: str) -> dict[str, int]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT channel, count(*) FROM sessions WHERE agent = %s AND auto GROUP BY channel",
            (A,),
        ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


@pytest.mark.timeout(240)  # its own waits (150 s + 30 s) must run out before pytest's
def test_sigkill_during_idle_saves_leaves_exactly_one_save_each(
    db: str, redis_url: str, tmp_path: Path
) -> None:
    seed = _seed()
    rng = random.Random(seed)
    kills = sorted(rng.uniform(TIMEOUT_S + 0.3, TIMEOUT_S + 1.5) for _ in range(2))
    print(f"seed={seed} (set CONTEXTLOG_E2E_SEED to replay) kills at {kills}")
    env = offline_env(db, redis_url, CONTEXTLOG_SWEEP_SECONDS="1")
    producer = Producer(redis.Redis.from_url(redis_url), shards=4)
    reader = ContextReader.from_url(db)
    worker = Process("worker", env, tmp_path / "worker.log")
    try:
        with running(settings_for(db, redis_url)):
            worker.start()
            with producer.batch() as b:
                for i in range(CONVERSATIONS):
                    b.configure(A, f"c{i}", idle_timeout=TIMEOUT_S, source="e2e")
            last = ""
            with producer.batch() as b:
                for i in range(CONVERSATIONS):
                    last = b.post_message(A, f"c{i}", "user", f"task {i}", source="e2e")
            sent = time.monotonic()
            reader.context(A, f"c{CONVERSATIONS - 1}", wait_for=last, timeout=10)
            for at in kills:
                time.sleep(max(0.0, sent + at - time.monotonic()))
                worker.kill()
                worker.start()
            rds = redis.Redis.from_url(redis_url)
            eventually(
                lambda: len(auto_sessions(db)) == CONVERSATIONS,
                timeout=150,  # 300 saves + 300 summaries on one worker; slow under a loaded CI
                what=f"{CONVERSATIONS} auto-saves (seed {seed}); "
                f"{len(auto_sessions(db))} saved\n{worker.tail()}",
            )
            # Every timer disarmed: nothing can save a second time.
            eventually(
                lambda: not list(rds.scan_iter("contextlog:idle:*")),
                timeout=30,
                what=f"the timers to be disarmed (seed {seed})",
            )
            rds.close()
        counts = auto_sessions(db)
        assert counts == {f"c{i}": 1 for i in range(CONVERSATIONS)}, f"seed {seed}"
        for i in range(CONVERSATIONS):
            assert reader.context(A, f"c{i}").messages == []
        with psycopg.connect(db) as conn:
            row = conn.execute(
                "SELECT count(*) FROM events WHERE agent = %s AND kind = 'save.v1'", (A,)
            ).fetchone()
        assert row == (CONVERSATIONS,)  # a re-run job's events were stored once
        print(f"worker incarnations: {worker.starts}; at {dt.datetime.now(dt.UTC):%H:%M:%S}")
    finally:
        worker.stop()
        producer.close()
        reader.close()
