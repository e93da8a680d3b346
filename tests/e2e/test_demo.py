"""`contextlog demo` (what `make demo` runs) works end to end against real servers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_demo_runs_to_completion(db: str, redis_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": db, "REDIS_URL": redis_url}
    done = subprocess.run(
        [sys.executable, "-m", "contextlog.worker.cli.main", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "get_weather" in out and '"tool_use_id": "toolu_01"' in out
    assert "reason=invalid" in out
    assert "after /context clear: 0 messages" in out
    assert "exit code 0" in out
    assert done.stderr == ""  # no log line between the numbered steps
