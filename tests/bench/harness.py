"""What every benchmark shares: its environment, its result, and a watched subprocess."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import psutil  # type: ignore[import-untyped]  # no stubs in the dev dependencies
import redis

ROOT = Path(__file__).resolve().parents[2]
STOP_TIMEOUT = 30.0  # seconds a stopped process gets to finish its batch and exit


class BenchError(Exception):
    """Raised when a benchmark cannot produce a number; the message says what went wrong."""


@dataclass(frozen=True)
class BenchEnv:
    """Where a benchmark runs: a fresh database and a flushed Redis db, just for it."""

    database_url: str  # the fresh benchmark database (migrated)
    redis_url: str  # flushed before each benchmark
    events: int | None  # --events: overrides the benchmark's default workload size

    def process_env(self, **extra: str) -> dict[str, str]:
        """The environment of a contextlog process pointed at this benchmark's servers."""
        return {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            **extra,
        }


@dataclass(frozen=True)
class Result:
    """One benchmark's headline: our rate against the physical limit, plus its details."""

    name: str
    unit: str  # e.g. "events/s"
    ours: float
    limit: float
    limit_label: str  # what the limit is, e.g. "one COPY of the same rows"
    target: float  # the ratio ours/limit we aim at
    extra: str  # one short note for the table, e.g. peak RSS
    description: str
    notes: list[str] = field(default_factory=list)  # bullets for BENCHMARKS.md
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """ours / limit (0 when the limit is unknown)."""
        return self.ours / self.limit if self.limit > 0 else 0.0


Benchmark: TypeAlias = Callable[[BenchEnv], Result]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a local process has used (None if it cannot be read)."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(t.user + t.system)


def is_local(url: str) -> bool:
    """Whether a server URL points at this machine, so its process CPU can be read."""
    host = urlsplit(url).hostname
    return host in (None, "", "localhost", "127.0.0.1", "::1")


class CpuMeter:
    """CPU seconds spent during one timed phase, by the machine and by named local processes.

    On a shared box the machine-wide figure tells whether something else was competing:
    busy CPU not accounted for by the named processes belongs to other programs.
    """

    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._machine = self._busy()
        self._stolen = self._steal()
        self._pids: list[tuple[str, int, float]] = []
        self._extra: dict[str, Callable[[], float | None]] = {}
        self._extra_start: dict[str, float | None] = {}

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        # Steal is time the hypervisor gave to other guests: not ours, and not idle.
        return float(sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "steal", 0.0))

    @staticmethod
    def _steal() -> float:
        return float(getattr(psutil.cpu_times(), "steal", 0.0))

    def watch(self, name: str, pid: int, since_start: bool = False) -> None:
        """Count `pid`'s CPU under `name` from now on (or from its start, if it began now)."""
        used = cpu_seconds(pid)
        if used is not None:
            self._pids.append((name, pid, 0.0 if since_start else used))

    def watch_counter(self, name: str, read: Callable[[], float | None]) -> None:
        """Count a CPU-seconds counter read some other way (e.g. Redis INFO cpu)."""
        self._extra[name] = read
        self._extra_start[name] = read()

    def report(self) -> dict[str, float]:
        """CPU seconds per watched name, machine-wide busy seconds, cores and wall time."""
        out = {"wall_seconds": round(time.perf_counter() - self._wall, 3)}
        for name, pid, start in self._pids:
            used = cpu_seconds(pid)
            if used is not None:
                key = f"{name}_cpu_seconds"
                out[key] = round(out.get(key, 0.0) + used - start, 3)
        for name, read in self._extra.items():
            before, after = self._extra_start[name], read()
            if before is not None and after is not None:
                out[f"{name}_cpu_seconds"] = round(after - before, 3)
        out["machine_busy_cpu_seconds"] = round(self._busy() - self._machine, 3)
        out["machine_steal_cpu_seconds"] = round(self._steal() - self._stolen, 3)
        out["cores"] = float(psutil.cpu_count() or 1)
        return out


class Watched:
    """A subprocess whose start time and peak resident memory are tracked until it stops."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        self.name = name
        # Closed in __exit__: the file lives as long as the process it records.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            argv, env=dict(env), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self._stderr
        )
        self._ps = psutil.Process(self.proc.pid)
        self.peak_rss = 0  # bytes, the largest RSS sampled
        self.returncode: int | None = None

    def __enter__(self) -> Watched:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self._stderr.close()

    def elapsed(self) -> float:
        """Seconds since the process was started."""
        return time.perf_counter() - self.started

    def sample(self) -> None:
        """Record the current RSS; fails if the process has exited."""
        if self.proc.poll() is not None:
            raise BenchError(
                f"{self.name} exited early with status {self.proc.returncode}:\n"
                + self.stderr_tail()
            )
        # The process may exit between poll() and here; the next sample reports it.
        with contextlib.suppress(psutil.Error):
            self.peak_rss = max(self.peak_rss, self._ps.memory_info().rss)

    def high_water_mark(self) -> int:
        """Peak RSS in bytes: the kernel's VmHWM when readable, else the largest sample."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return self.peak_rss
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return max(self.peak_rss, int(line.split()[1]) * 1024)
        return self.peak_rss

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after `STOP_TIMEOUT`; returns the exit status."""
        if self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.returncode = self.proc.returncode
        return self.returncode

    def stderr_tail(self, lines: int = 20) -> str:
        """The last lines the process wrote to stderr."""
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])


def redis_cpu(url: str) -> Callable[[], float | None]:
    """A reader of the Redis server's own CPU seconds (INFO cpu), local or not."""

    def read() -> float | None:
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            info = client.info("cpu")
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        except (redis.RedisError, KeyError):
            return None
        finally:
            client.close()

    return read


def settle() -> None:
    """Collect, then freeze what the set-up left, before a timed loop. README tells a
    long-lived bot to call `gc.freeze()` once after start-up: without it a full collection
    rescans every object the process ever made (~0.2 s here, 300k objects), a pause that
    lands on whichever read triggers it, as a p99 of either side."""
    gc.collect()
    gc.freeze()


def python_module(module: str, *args: str) -> list[str]:
    """argv running `python -m module args` with this interpreter (the venv's)."""
    return [sys.executable, "-m", module, *args]
