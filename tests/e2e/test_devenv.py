"""`make run`'s stack on servers embedded by contextlog.worker.dev.devenv, in a checkout whose
path is too long for a unix socket: a second terminal attaches to it, and a hangup or a
SIGKILL of devenv leaves no process behind, so the next run starts cleanly (the dashboard's
port is free again)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from contextlog.worker.dev.servers import RUN_MARKER, SUN_PATH_MAX
from tests.support.processes import ROOT
from tests.support.servers import free_port

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent  # the venv's bin: honcho, contextlog


def wait_until(check: Callable[[], bool], what: str, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout} s waiting for {what}")
        time.sleep(0.1)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def checkout() -> Iterator[Path]:
    """A checkout (just a Procfile) at a path longer than a unix socket path may be."""
    base = Path(tempfile.mkdtemp(prefix="contextlog-devenv-"))  # in /tmp: no 0700 parent
    deep = base / ("a-checkout-path-longer-than-a-unix-socket-" + "x" * 50) / "contextlog"
    deep.mkdir(parents=True)
    for d in (base, deep.parent, deep):
        d.chmod(0o755)  # as root, the embedded Postgres runs as another user
    assert len(os.fsencode(deep / ".contextlog" / "redis.sock")) > SUN_PATH_MAX
    shutil.copy(ROOT / "Procfile", deep / "Procfile")
    yield deep
    devenv("--stop", cwd=deep)  # only if a test failed half way
    if not os.environ.get("KEEP_DEVENV_TEST"):
        shutil.rmtree(base)


def environment(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.pop(RUN_MARKER, None)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["CONTEXTLOG_DASHBOARD_PORT"] = str(port)
    env["CONTEXTLOG_API_PORT"] = str(free_port())  # the Procfile's api, beside other runs
    return env


def devenv(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextlog.worker.dev.devenv", *args],
        cwd=cwd, env=env or environment(0), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def start_run(checkout: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`make run` in a terminal of its own: devenv and honcho in one process group."""
    with (checkout / "run.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "contextlog.worker.dev.devenv", "--", "honcho", "start"],
            cwd=checkout, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True,
        )  # fmt: skip


def stack_of(run: subprocess.Popen[bytes], checkout: Path) -> list[psutil.Process]:
    """Every process of the run: devenv's descendants (watchdog, honcho, its children in
    their own sessions) and the two servers with their children."""
    procs = [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]
    postmaster = int((checkout / ".contextlog/pgdata/postmaster.pid").read_text().split()[0])
    redis_pid = int((checkout / ".contextlog/redis.pid").read_text())
    for pid in (postmaster, redis_pid):
        procs += [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return procs


def gone(procs: list[psutil.Process]) -> bool:
    """Tell whether none of procs runs any more (a zombie nobody reaped counts as gone)."""
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def attach_status(checkout: Path, env: dict[str, str]) -> dict[str, object]:
    """`contextlog status --json` from a second terminal, once ingest owns the shards."""
    result: dict[str, object] = {}

    def healthy() -> bool:
        done = devenv("--attach", "--", "contextlog", "status", "--json", cwd=checkout, env=env)
        if done.returncode == 0:
            result.update(json.loads(done.stdout))
        return done.returncode == 0 and int(str(result.get("ingest_consumers", 0))) > 0

    wait_until(healthy, "contextlog status through --attach")
    return result


Stack = tuple[list[psutil.Process], Path]


def up(run: subprocess.Popen[bytes], checkout: Path, env: dict[str, str]) -> Stack:
    """Wait for the whole stack, check a second terminal reaches it; return its processes
    and the short directory of its sockets."""
    port = int(env["CONTEXTLOG_DASHBOARD_PORT"])
    log = checkout / "run.log"
    wait_until(lambda: listening(port) or run.poll() is not None, "the dashboard")
    assert run.poll() is None, log.read_text()
    status = attach_status(checkout, env)
    assert status["healthy"] is True
    exported = devenv("--env", cwd=checkout, env=env).stdout
    assert "export DATABASE_URL='postgresql://postgres@/postgres?host=/tmp/contextlog-" in exported
    assert "export REDIS_URL='unix:///tmp/contextlog-" in exported
    assert exported.splitlines()[0] in log.read_text()  # the run printed what --env prints
    short_dir = Path(exported.split("unix://")[1].split("/redis.sock")[0])
    assert short_dir.stat().st_mode & 0o777 == 0o700
    return stack_of(run, checkout), short_dir


def test_a_hangup_of_the_terminal_stops_the_whole_stack(checkout: Path) -> None:
    env = environment(free_port())
    run = start_run(checkout, env)
    procs, short_dir = up(run, checkout, env)
    os.killpg(run.pid, signal.SIGHUP)  # the terminal closes: its foreground group is hung up
    run.wait(timeout=60)
    assert gone(procs), [p for p in procs if not gone([p])]
    assert not short_dir.exists()
    again = start_run(checkout, env)  # the dashboard's port and the state dir are free
    procs, _ = up(again, checkout, env)
    again.send_signal(signal.SIGTERM)
    again.wait(timeout=60)
    assert gone(procs), [p for p in procs if not gone([p])]


def test_sigkill_of_devenv_leaves_nothing_running(checkout: Path) -> None:
    env = environment(free_port())
    run = start_run(checkout, env)
    procs, short_dir = up(run, checkout, env)
    run.kill()
    run.wait(timeout=10)
    wait_until(lambda: gone(procs), "the watchdog to stop the stack", timeout=45)
    wait_until(lambda: not short_dir.exists(), "the watchdog to remove the socket directory")
    again = devenv("--", "contextlog", "status", cwd=checkout, env=env)
    assert again.returncode == 0, again.stderr
    assert "left running" not in again.stderr
    attached = devenv("--attach", "--", "true", cwd=checkout, env=env)
    assert attached.returncode == 1
    assert "no embedded postgres or redis is running" in attached.stderr
