"""README.md's Python blocks run the way a reader runs them: each block as a script of its
own, or, when its first line says it continues the block above, after that block (as
pasted into the same file), with ingest running and the test's Postgres and Redis in
DATABASE_URL / REDIS_URL (as `make attach` or the lines `make run` prints give them). With
ANTHROPIC_API_KEY they talk to a local Messages API; without it, none ends in a traceback."""

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
CONTINUES = "# Continues the block above"
NO_KEY = "ANTHROPIC_API_KEY is not set"
GUARD = 'if "ANTHROPIC_API_KEY" in os.environ:'  # a block that asks Claude only with a key


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def scripts() -> list[str]:
    """Each block as a reader runs it: alone, or after the blocks it continues."""
    out: list[str] = []
    for block in python_blocks():
        out.append(out[-1] + "\n" + block if block.startswith(CONTINUES) else block)
    return out


def test_every_block_runs_alone_or_says_it_continues_the_one_before() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 4  # the bot, the producer, reading context, sessions
    assert not blocks[0].startswith(CONTINUES)
    for block in blocks:
        if not block.startswith(CONTINUES):
            assert "# Continues" not in block.lower(), block  # said where a reader sees it
        compile(block, "README.md", "exec")


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


def reader_env(db: str, redis_url: str, **extra: str) -> dict[str, str]:
    """The reader's shell: their servers, and none of this test run's own settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CONTEXTLOG_"))}
    path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "DATABASE_URL": db, "REDIS_URL": redis_url, "PATH": path, **extra}


def api_env(http_api: tuple[str, str]) -> dict[str, str]:
    """What the HTTP API's section tells a reader to set: its URL and their key."""
    return {"CONTEXTLOG_URL": http_api[0], "CONTEXTLOG_KEY": http_api[1]}


def run_scripts(env: dict[str, str], tmp_path: Path) -> list[str]:
    """Run each script as `python block_N.py`; returns what each printed."""
    printed = []
    for i, text in enumerate(scripts(), 1):
        path = tmp_path / f"block_{i}.py"
        path.write_text(text)
        done = subprocess.run(
            [sys.executable, str(path)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, (
            f"README.md, python block {i}:\n{done.stdout}{done.stderr}"
        )
        printed.append(done.stdout)
    return printed


def test_each_block_runs_as_a_script_with_an_api_key(
    db: str, redis_url: str, api: FakeAPIServer, http_api: tuple[str, str], tmp_path: Path
) -> None:
    env = reader_env(
        db,
        redis_url,
        ANTHROPIC_API_KEY="sk-test",
        ANTHROPIC_BASE_URL=api.url,
        **api_env(http_api),
    )
    with running(settings_for(db, redis_url)):
        printed = run_scripts(env, tmp_path)
    assert not any(NO_KEY in out for out in printed)
    assert api.requests_served >= 2  # reading the context back, the agent's turn


def test_each_block_runs_as_a_script_without_an_api_key(
    db: str, redis_url: str, api: FakeAPIServer, http_api: tuple[str, str], tmp_path: Path
) -> None:
    with running(settings_for(db, redis_url)):
        printed = run_scripts(reader_env(db, redis_url, **api_env(http_api)), tmp_path)
    guarded = [i for i, block in enumerate(python_blocks()) if GUARD in block]
    assert len(guarded) >= 2 and all(NO_KEY in printed[i] for i in guarded)
    assert api.requests_served == 0


def test_the_api_shell_snippets_run_as_written(
    db: str, redis_url: str, http_api: tuple[str, str]
) -> None:
    """The HTTP API section's shell snippets (keys, curl), in a reader's shell."""
    env = reader_env(db, redis_url, **api_env(http_api))
    blocks = api_shell_blocks()
    assert blocks
    with running(settings_for(db, redis_url)):
        for block in blocks:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, f"{block}\n{done.stderr}"
            assert "clk_" in done.stdout or '"messages"' in done.stdout, done.stdout


def test_the_bot_answers_a_redelivered_message_once(
    db: str, redis_url: str, api: FakeAPIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 15-line bot of the first block: a platform that re-delivers a message gets the
    same answer, and the conversation holds each message once."""
    for name, value in reader_env(
        db, redis_url, ANTHROPIC_API_KEY="sk-test", ANTHROPIC_BASE_URL=api.url
    ).items():
        monkeypatch.setenv(name, value)
    ns: dict[str, Any] = {"__name__": "readme"}
    with running(settings_for(db, redis_url)):
        exec(compile(python_blocks()[0], "README.md, python block 1", "exec"), ns)
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
        ns["r"].close()
        ns["p"].close()
    assert [m["role"] for m in ctx.messages] == ["user", "assistant", "user"]
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT payload->>'role' FROM events WHERE agent = 'mybot' AND channel = 'general'"
            " ORDER BY seq"
        ).fetchall()
    assert [r[0] for r in rows] == ["user", "assistant", "user"]
