"""README.md's Python snippets run as written, in order, against a live stack: ingest in a
thread, the test's Postgres and Redis in DATABASE_URL / REDIS_URL (as `make attach` or the
lines `make run` prints give them), and a local Messages API in ANTHROPIC_BASE_URL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from contextlog.producers.ids import derived_id
from tests.support.api import api_process, make_key
from tests.support.fake_anthropic import FakeAPIServer
from tests.support.running import running, settings_for

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def api_shell_blocks() -> list[str]:
    """The shell snippets of the HTTP API's section (keys, curl)."""
    blocks = re.findall(r"^```sh\n(.*?)^```", README.read_text(), re.S | re.M)
    return [b for b in blocks if "CONTEXTLOG_URL" in b or "contextlog keys" in b]


@pytest.fixture
def http_api(db: str, redis_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A `contextlog api` process on the test's servers: its URL and a key."""
    with api_process(db, redis_url, tmp_path / "api.log") as (url, _):
        yield url, make_key(db, ["mybot"], "post,read,sessions")


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer(latency=0.0).start()
    yield server
    server.stop()


def test_the_readme_snippets_run_as_written(
    db: str,
    redis_url: str,
    api: FakeAPIServer,
    http_api: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocks = python_blocks()
    assert len(blocks) >= 4  # the bot, the producer, reading context, sessions
    for name, value in {
        "DATABASE_URL": db,
        "REDIS_URL": redis_url,
        "CONTEXTLOG_SHARDS": "4",
        "ANTHROPIC_API_KEY": "sk-test",
        "ANTHROPIC_BASE_URL": api.url,
        "CONTEXTLOG_URL": http_api[0],
        "CONTEXTLOG_KEY": http_api[1],
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }.items():
        monkeypatch.setenv(name, value)
    ns: dict[str, Any] = {"__name__": "readme"}
    with running(settings_for(db, redis_url)):
        for i, block in enumerate(blocks, 1):
            exec(compile(block, f"README.md, python block {i}", "exec"), ns)
        for block in api_shell_blocks():
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, f"{block}\n{done.stderr}"
            assert "clk_" in done.stdout or '"messages"' in done.stdout, done.stdout
        # The 15-line bot: a platform that re-delivers a message gets the same answer,
        # and the conversation holds each message once.
        first = ns["on_message"]("general", "ada", "Hi, what did we decide?", "m-1")
        reply_id = str(derived_id("mybot", "m-1:reply"))
        ns["r"].context("mybot", "general", wait_for=reply_id)  # the reply has landed
        served = api.requests_served
        again = ns["on_message"]("general", "ada", "Hi, what did we decide?", "m-1")
        assert again == first and api.requests_served == served  # no second API call
        ns["p"].post_message(  # a reply racing a re-delivery is stored once as well
            "mybot", "general", "assistant", first, source="mybot", external_id="m-1:reply"
        )
        ctx = ns["r"].context(
            "mybot",
            "general",
            wait_for=ns["p"].post_message(
                "mybot", "general", "user", "next", source="mybot", external_id="m-2"
            ),
        )
    assert [m["role"] for m in ctx.messages] == ["user", "assistant", "user"]
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT payload->>'role' FROM events WHERE agent = 'mybot' AND channel = 'general'"
            " ORDER BY seq"
        ).fetchall()
    assert [r[0] for r in rows] == ["user", "assistant", "user"]
