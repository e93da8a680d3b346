"""Pure helpers of worker.devenv and worker.devenv_servers: no server is started here."""

from __future__ import annotations

import shlex
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import redis

from contextlog.worker.dev import devenv, servers


def test_parse_args_takes_everything_after_double_dash_as_the_command() -> None:
    options = devenv.parse_args(["--keep", "--", "pytest", "-x", "--keep"])
    assert options == devenv.Options(command=["pytest", "-x", "--keep"], keep=True)


def test_parse_args_without_double_dash() -> None:
    assert devenv.parse_args(["true"]) == devenv.Options(command=["true"], keep=False)


def test_parse_args_attach() -> None:
    options = devenv.parse_args(["--attach", "--", "contextlog", "status"])
    assert options == devenv.Options(command=["contextlog", "status"], mode="attach")


@pytest.mark.parametrize(("flag", "mode"), [("--env", "env"), ("--stop", "stop")])
def test_parse_args_modes_without_a_command(flag: str, mode: str) -> None:
    assert devenv.parse_args([flag]) == devenv.Options(command=[], mode=mode)


@pytest.mark.parametrize(
    "argv",
    [[], ["--"], ["--keep", "--"], ["--attach"], ["--env", "--", "x"], ["--keep", "--attach", "x"]],
)
def test_parse_args_needs_a_command(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        devenv.parse_args(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("env", "missing"),
    [
        ({}, ["DATABASE_URL", "REDIS_URL"]),
        ({"DATABASE_URL": "postgresql://db", "REDIS_URL": "redis://r/1"}, []),
        ({"REDIS_URL": "redis://r/1"}, ["DATABASE_URL"]),
        ({"DATABASE_URL": "postgresql://db", "REDIS_URL": ""}, ["REDIS_URL"]),
        ({"CI": "true"}, ["DATABASE_URL", "REDIS_URL"]),
    ],
)
def test_missing_variables_are_unset_or_empty(env: dict[str, str], missing: list[str]) -> None:
    assert devenv.missing_variables(env) == missing


def test_redis_url_of_a_socket() -> None:
    url = servers.redis_url(Path("/srv/app/.contextlog/redis.sock"))
    assert url == "unix:///srv/app/.contextlog/redis.sock?db=0"


def test_urls_quote_what_a_path_may_contain_and_clients_read_it_back() -> None:
    path = Path("/home/ann/my app/.contextlog")
    assert (
        servers.redis_url(path / "redis.sock")
        == "unix:///home/ann/my%20app/.contextlog/redis.sock?db=0"
    )
    client = redis.Redis.from_url(servers.redis_url(path / "redis.sock"))  # no connection yet
    assert client.connection_pool.connection_kwargs["path"] == str(path / "redis.sock")
    url = servers.postgres_url(path / "pgdata")
    assert url == "postgresql://postgres@/postgres?host=/home/ann/my%20app/.contextlog/pgdata"
    info = psycopg.conninfo.conninfo_to_dict(url)
    assert (info["host"], info["user"], info["dbname"]) == (
        str(path / "pgdata"),
        "postgres",
        "postgres",
    )


@pytest.mark.parametrize("make", [servers.redis_url, servers.postgres_url])
def test_urls_want_an_absolute_path(make: Callable[[Path], str]) -> None:
    with pytest.raises(ValueError, match="absolute"):
        make(Path(".contextlog/redis.sock"))


def test_redis_server_listens_on_the_socket_only_and_persists_nothing() -> None:
    args = servers.redis_server_args(Path("/s"), Path("/tmp/contextlog-1/redis.sock"))
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert options["--port"] == "0"
    assert options["--unixsocket"] == "/tmp/contextlog-1/redis.sock"
    assert options["--unixsocketperm"] == "700"
    assert options["--pidfile"] == "/s/redis.pid"
    assert options["--save"] == ""
    assert options["--appendonly"] == "no"
    assert options["--daemonize"] == "yes"


def test_postgres_listens_on_a_private_socket_only_even_in_a_path_with_spaces() -> None:
    args = servers.pg_ctl_start_args(Path("/a b/pgdata"), Path("/tmp/it's here"))
    server = shlex.split(args[args.index("-o") + 1])  # pg_ctl runs it through /bin/sh
    assert server == ["-h", "", "-k", "/tmp/it's here", "-c", "unix_socket_permissions=0700"]
    assert args[-1] == "start"
    assert "-w" in args


def test_initdb_trusts_the_socket_of_a_throwaway_database() -> None:
    args = servers.initdb_args(Path("/a/pgdata"))
    assert args[:2] == ["-D", "/a/pgdata"]
    assert {"-U", "postgres", "--auth=trust", "--no-sync"} <= set(args)


def test_socket_path_fits() -> None:
    assert servers.socket_path_fits(Path("/srv/app/.contextlog/redis.sock"))
    assert not servers.socket_path_fits(Path("/" + "d" * 120 + "/redis.sock"))


def test_layout_keeps_sockets_in_a_short_checkout() -> None:
    lay = servers.layout(Path("/srv/app/.contextlog"), 1000)
    assert not lay.short
    assert lay.pg_socket_dir == Path("/srv/app/.contextlog/pgdata")
    assert lay.redis_socket == Path("/srv/app/.contextlog/redis.sock")


def test_layout_moves_sockets_of_a_long_checkout_to_a_short_private_dir() -> None:
    state_dir = Path("/home/ann/" + "p" * 80 + "/.contextlog")
    lay = servers.layout(state_dir, 1000)
    assert lay.short
    assert lay.pgdata == state_dir / "pgdata"  # the data stays in the checkout
    assert lay.socket_dir.parent == Path("/tmp")
    assert lay.socket_dir.name.startswith("contextlog-")
    assert lay.pg_socket_dir == lay.socket_dir
    assert lay.redis_socket == lay.socket_dir / "redis.sock"
    assert servers.socket_path_fits(lay.pg_socket_dir / ".s.PGSQL.5432.lock")
    assert servers.layout(state_dir, 1000) == lay  # a second terminal finds the same place
    assert servers.layout(state_dir, 1001).socket_dir != lay.socket_dir  # per user
    other = servers.layout(Path("/home/ann/" + "q" * 80 + "/.contextlog"), 1000)
    assert other.socket_dir != lay.socket_dir  # per checkout


def test_layout_at_the_limit() -> None:
    # .contextlog/pgdata/.s.PGSQL.5432.lock is the longest path a server binds or creates.
    fits = Path("/" + "d" * (servers.SUN_PATH_MAX - len("//pgdata/.s.PGSQL.5432.lock")))
    assert not servers.layout(fits, 0).short
    assert servers.layout(fits.with_name(fits.name + "d"), 0).short


def test_parse_postmaster_pid() -> None:
    text = "4242\n/a/pgdata\n1712346200\n5432\n/tmp/contextlog-ab\n\n  1 2\nready   \n"
    assert servers.parse_postmaster_pid(text) == servers.Postmaster(
        4242, Path("/tmp/contextlog-ab")
    )
    assert servers.parse_postmaster_pid("4242\n/a/pgdata\n") is None  # still being written
    assert servers.parse_postmaster_pid("") is None


def test_unreachable_dirs_lists_ancestors_without_o_rx() -> None:
    modes = {"/": 0o755, "/root": 0o700, "/root/app": 0o755, "/root/app/.contextlog": 0o711}
    closed = servers.unreachable_dirs(
        Path("/root/app/.contextlog/pgdata"), lambda p: stat.S_IFDIR | modes[str(p)]
    )
    assert closed == [Path("/root/app/.contextlog"), Path("/root")]


def test_root_notice_names_the_user_why_and_how_to_undo() -> None:
    text = servers.root_notice("embedded_postgres")
    assert "'embedded_postgres'" in text
    assert "refuses to run as root" in text
    assert "userdel embedded_postgres" in text
    assert "DATABASE_URL" in text


def test_useradd_makes_a_system_user_without_login() -> None:
    command = servers.useradd_command("embedded_postgres", "/usr/sbin/nologin")
    assert command[0] == "useradd"
    assert command[-1] == "embedded_postgres"
    assert {"--system", "--no-create-home"} <= set(command)
    assert command[command.index("--shell") + 1] == "/usr/sbin/nologin"


def test_servers_never_carry_the_run_marker() -> None:
    env = {"PATH": "/bin", servers.RUN_MARKER: "abc"}
    assert servers.server_env(env) == {"PATH": "/bin"}


def test_exports_are_shell_lines_a_user_can_paste() -> None:
    urls = {
        "DATABASE_URL": "postgresql://postgres@/postgres?host=/tmp/contextlog-ab",
        "REDIS_URL": "unix:///tmp/contextlog-ab/redis.sock?db=0",
    }
    lines = devenv.exports(urls).splitlines()
    assert (
        lines[0] == "export DATABASE_URL='postgresql://postgres@/postgres?host=/tmp/contextlog-ab'"
    )
    for line, (name, url) in zip(lines, urls.items(), strict=True):
        assert shlex.split(line) == ["export", f"{name}={url}"]  # `?` is quoted from globbing


@pytest.mark.parametrize(
    ("signum", "tty", "forward"),
    [
        (signal.SIGINT, True, False),  # ^C already reached the child through the terminal
        (signal.SIGINT, False, True),  # kill -INT: only we got it
        (signal.SIGTERM, True, True),
        (signal.SIGHUP, False, True),
    ],
)
def test_should_forward(signum: int, tty: bool, forward: bool) -> None:
    assert devenv.should_forward(signum, child_gets_tty_signals=tty) is forward


@pytest.mark.parametrize(("returncode", "status"), [(0, 0), (5, 5), (-15, 143), (-2, 130)])
def test_exit_status(returncode: int, status: int) -> None:
    assert devenv.exit_status(returncode) == status


def test_announcement_when_nothing_is_embedded() -> None:
    line = devenv.announcement({}, ["DATABASE_URL", "REDIS_URL"], keep=False)
    assert line.startswith("devenv: nothing embedded")
    assert "\n" not in line


def test_announcement_gives_the_urls_and_how_to_attach_but_never_user_urls() -> None:
    urls = {"DATABASE_URL": "postgresql://postgres@/postgres?host=/a/.contextlog/pgdata"}
    text = devenv.announcement(urls, ["REDIS_URL"], keep=False)
    assert "devenv: embedded postgres for this checkout, stopped when this command ends:" in text
    assert (
        "  export DATABASE_URL='postgresql://postgres@/postgres?host=/a/.contextlog/pgdata'" in text
    )
    assert "REDIS_URL from the environment" in text
    assert "REDIS_URL=" not in text
    assert "make attach CMD='contextlog status'" in text
    assert "contextlog.worker.dev.devenv --env" in text


def test_announcement_of_kept_servers() -> None:
    urls = {"REDIS_URL": "unix:///a/.contextlog/redis.sock?db=0"}
    assert "left running (--keep)" in devenv.announcement(urls, [], keep=True)


def test_busy_message_says_how_to_attach() -> None:
    text = devenv.busy_message(Path(".contextlog"), "4242")
    assert "another devenv run (pid 4242, e.g. `make run`) is using .contextlog/" in text
    assert "--attach -- CMD" in text
    assert "make attach" in text


def test_busy_message_of_a_stop_says_to_end_the_run_first() -> None:
    """`make clean` while `make run` is up: attaching is not what was wanted."""
    text = devenv.busy_message(Path(".contextlog"), "4242", stopping=True)
    assert "end it first (Ctrl-C in its terminal), then try again" in text
    assert "attach" not in text
