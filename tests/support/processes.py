"""`contextlog` processes for tests: started as the Procfile would, killed or stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# The developer's shell must not point a test's process at the real API.
_NOT_INHERITED = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")


def offline_env(database_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    """The environment of a `contextlog` process in a test: this test's servers, four
    shards, and no API key or base URL (summaries by the local summarizer, never the
    network, unless `extra` names a local API)."""
    return {
        **{k: v for k, v in os.environ.items() if k not in _NOT_INHERITED},
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "CONTEXTLOG_SHARDS": "4",
        **extra,
    }


class Process:
    """One `contextlog <command>` in its own process group (RQ's scheduler is a child)."""

    def __init__(self, command: str, env: dict[str, str], log_path: Path) -> None:
        self.command = command
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.groups: list[int] = []  # every incarnation's process group
        self.argv_extra: list[str] = []  # options after the command

    def start(self) -> Process:
        """Start a new incarnation; output goes to the log file."""
        assert self.proc is None or self.proc.poll() is not None
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"--- {self.command} #{self.starts} started ---\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "contextlog.worker.cli.main",
                    self.command,
                    *self.argv_extra,
                ],
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.groups.append(self.proc.pid)
        return self

    def kill(self) -> None:
        """SIGKILL the process itself (its scheduler child, if any, lives on, orphaned)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM the current incarnation (RQ finishes its job), then SIGKILL every
        process group this object started, orphaned schedulers included."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=15)
        for group in self.groups:
            with suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.wait(timeout=5)

    def tail(self, lines: int = 40) -> str:
        """The end of the log, for failure messages."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@contextmanager
def started(command: str, env: dict[str, str], log_path: Path) -> Iterator[Process]:
    """A running `contextlog <command>`, stopped at the end."""
    p = Process(command, env, log_path).start()
    try:
        yield p
    finally:
        p.stop()
