"""Every `contextlog` subcommand against servers that are unreachable, silent (they take
the connection and never answer), hang up at once, or answer only errors, and `contextlog
chat` against a Messages API doing the same: one line naming the variable, exit 3 (or 2
for a server that refuses), never a traceback, and never longer than about 2 s of waiting.
Against a silent server each command runs as a user runs it, the console script in its own
process (side by side: each waits out its timeout); the quick failures run in this process."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from contextlog.worker.cli import main as cli
from tests.support.broken import MODES, BrokenServer, unreachable_url
from tests.support.exports import HELLO, export_file
from tests.support.running import running, settings_for

pytestmark = pytest.mark.integration

A, C = "alpha", "general"
CONTEXTLOG = str(Path(sys.executable).parent / "contextlog")
VARIABLE = {"postgres": "DATABASE_URL", "redis": "REDIS_URL"}
# Seconds a command may take against a broken server: its ~2 s timeout (cli.common), and
# a process's start-up (imports: ~1 s, more when the machine is busy); far below the 30 s
# a socket timeout of a long-running process's clients would take.
LIMIT_S = 8.0

# Each subcommand: its arguments ({tmp}: a scratch folder, {file}: an export file) and the
# servers it talks to.
COMMANDS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "migrate": (["migrate"], ("postgres",)),
    "ingest": (["ingest"], ("postgres", "redis")),
    "worker": (["worker", "--burst"], ("postgres", "redis")),
    "status": (["status"], ("postgres", "redis")),
    "send": (["send", "message", A, C, "hi"], ("redis",)),
    "dead-letters": (["dead-letters"], ("redis",)),
    "context": (["context", A, C], ("postgres",)),
    "sessions": (["sessions", A], ("postgres",)),
    "export": (
        ["export", "2025-01-02_x", "--agent", A, "--channel", C, "-o", "{tmp}/x.json"],
        ("postgres",),
    ),
    "import": (["import", "{file}", "--agent", A, "--channel", C], ("redis",)),
    "notifications": (["notifications"], ("redis",)),
    "rebuild": (["rebuild"], ("postgres",)),
    "retire": (["retire", "--idle-for", "1d", "--archive", "{tmp}"], ("postgres",)),
    "search": (["search", A, "rollback"], ("postgres",)),
    "erase": (["erase", A, "--sender", "ann", "--dry-run"], ("postgres", "redis")),
    "chat": (["chat", A], ("postgres", "redis")),
    "demo": (["demo"], ("postgres", "redis")),
    "api": (["api"], ("postgres", "redis")),
    "keys": (["keys", "list"], ("postgres",)),
    "webhooks": (["webhooks", "deliveries"], ("postgres",)),
}
# Not driven here, and why.
ELSEWHERE = {
    "dashboard": "serves pages; Redis is asked only when a page is opened, and rq-dashboard "
    "answers an outage with its own page (tests/e2e/test_dashboard.py starts it)",
    "acl": "prints the ACL rules of each role and reaches no server",
}


def subcommands() -> set[str]:
    """The subcommands `contextlog --help` lists."""
    found = [a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(found[0].choices)


def test_every_subcommand_is_driven_against_broken_servers() -> None:
    assert subcommands() == set(COMMANDS) | set(ELSEWHERE)


@dataclass
class Outcome:
    name: str
    code: int
    seconds: float
    stdout: str
    stderr: str

    def problems(self, variable: str, code: int) -> list[str]:
        """What is wrong with how the command failed."""
        said = [line for line in self.stderr.splitlines() if line and not line.startswith("{")]
        found = []
        if self.code != code:
            found.append(f"exit {self.code}, not {code}")
        if "Traceback" in self.stderr + self.stdout:
            found.append("a traceback")
        if len(said) != 1 or not said[0].startswith("contextlog: ") or variable not in said[0]:
            found.append(f"not one line naming {variable}: {said}")
        if self.seconds > LIMIT_S:
            found.append(f"took {self.seconds:.1f}s")
        return [f"{self.name}: {p}\n{self.stderr[-1500:]}" for p in found]


def in_process(
    name: str,
    argv: list[str],
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Outcome:
    """`contextlog ARGV` in this process (every command fails before it starts a thread)."""
    with monkeypatch.context() as patch:
        for variable, value in env.items():
            patch.setenv(variable, value)
        started = time.monotonic()
        code = cli.main(argv)
        seconds = time.monotonic() - started
    out, err = capsys.readouterr()
    return Outcome(name, code, seconds, out, err)


def run(name: str, argv: list[str], env: dict[str, str], stdin: str = "") -> Outcome:
    started = time.monotonic()
    done = subprocess.run(
        [CONTEXTLOG, *argv],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return Outcome(name, done.returncode, time.monotonic() - started, done.stdout, done.stderr)


def base_env(db: str, redis_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEXTLOG_", "ANTHROPIC_"))}
    return {
        **env,
        "DATABASE_URL": db,
        "REDIS_URL": redis_url,
        "CONTEXTLOG_SHARDS": "4",
        "CONTEXTLOG_LOG_FORMAT": "json",
    }


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["unreachable", *MODES])
@pytest.mark.parametrize("server", ["postgres", "redis"])
def test_each_subcommand_fails_in_one_line_when_a_server_is_broken(
    server: str,
    mode: str,
    db: str,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    variable = VARIABLE[server]
    file = str(export_file(tmp_path, HELLO))
    # A Redis answering only errors refuses the request (2); every other failure is a
    # server that cannot be reached (3).
    code = 2 if (server, mode) == ("redis", "errors") else 3
    jobs = [
        (name, [a.replace("{tmp}", str(tmp_path)).replace("{file}", file) for a in argv])
        for name, (argv, servers) in COMMANDS.items()
        if server in servers
    ]
    with BrokenServer(server, mode if mode != "unreachable" else "closes") as broken:
        url = unreachable_url(server) if mode == "unreachable" else broken.url
        env = {**base_env(db, redis_url), variable: url}
        if mode == "silent":
            with ThreadPoolExecutor(max_workers=4) as pool:
                outcomes = list(pool.map(lambda job: run(job[0], job[1], env), jobs))
        else:
            outcomes = [in_process(*job, env, monkeypatch, capsys) for job in jobs]
    problems = [p for o in outcomes for p in o.problems(variable, code)]
    assert problems == [], "\n\n".join(problems)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["unreachable", *MODES])
def test_chat_goes_on_when_the_api_is_broken(
    mode: str, db: str, redis_url: str, tmp_path: Path
) -> None:
    with BrokenServer("http", mode if mode != "unreachable" else "closes") as broken:
        env = {
            **base_env(db, redis_url),
            "ANTHROPIC_API_KEY": "sk-test",
            "ANTHROPIC_BASE_URL": unreachable_url("http") if mode == "unreachable" else broken.url,
            "CONTEXTLOG_SUMMARY_TIMEOUT": "1",
        }
        # Two lines where the API answers at once: the chat goes on after the first.
        lines = ["hello"] if mode == "silent" else ["hello", "hello again"]
        with running(settings_for(db, redis_url)):
            done = run("chat", ["chat", A], env, stdin="\n".join([*lines, "/quit\n"]))
    assert done.code == 0 and "Traceback" not in done.stderr + done.stdout, done.stderr
    failed = [line for line in done.stdout.splitlines() if "error: no reply: " in line]
    assert len(failed) == len(lines), done.stdout
    assert all("Anthropic API" in line for line in failed)
