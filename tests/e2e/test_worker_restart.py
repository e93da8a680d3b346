"""`contextlog worker` with a stable CONTEXTLOG_CONSUMER, SIGKILLed and restarted at once
(issue 10 item 6): its scheduler child does not outlive it, the restart takes over the
dead worker's registration instead of failing for minutes, and status says it was gone."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest
import redis

from tests.support.processes import ROOT, Process, offline_env
from tests.support.running import eventually

pytestmark = pytest.mark.e2e

LOCK = "rq:scheduler-lock:idle"
NAME = "contextlog-stable-1"


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _status(env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "contextlog.worker.cli.main", "status", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    report: dict[str, object] = json.loads(out.stdout)
    return report


def test_a_sigkilled_worker_restarts_at_once_and_leaves_no_scheduler_behind(
    db: str, redis_url: str, tmp_path: Path
) -> None:
    env = offline_env(db, redis_url, CONTEXTLOG_CONSUMER="stable-1")
    rds = redis.Redis.from_url(redis_url)
    log = tmp_path / "worker.log"
    worker = Process("worker", env, log).start()
    try:
        eventually(lambda: rds.exists(LOCK) == 1, what=f"a scheduler\n{worker.tail()}")
        assert worker.proc is not None
        first = worker.proc.pid
        eventually(lambda: len(psutil.Process(first).children()) == 1, what="the scheduler")
        [scheduler] = psutil.Process(first).children()
        worker.kill()  # the worker alone: its scheduler child is orphaned
        eventually(lambda: _gone(scheduler.pid), timeout=10, what="the scheduler to exit")
        assert rds.exists(LOCK) == 0  # released: another worker's scheduler can take it now

        report = _status(env)
        assert not report["healthy"]
        assert any(NAME in str(p) and "gone" in str(p) for p in report["problems"])  # type: ignore[attr-defined]

        started = time.monotonic()
        worker.start()  # the same name, right away
        eventually(
            lambda: rds.hget(f"rq:worker:{NAME}", "pid") == str(worker.proc.pid).encode(),  # type: ignore[union-attr]
            timeout=30,
            what=f"the restarted worker's registration\n{worker.tail()}",
        )
        assert worker.proc is not None and worker.proc.poll() is None
        assert time.monotonic() - started < 20
        assert "There exists an active worker" not in log.read_text()
        assert "taking over a dead worker's registration" in log.read_text()
    finally:
        worker.stop()
        rds.close()
