"""Pure helpers of worker.devenv: no server is started here."""

from __future__ import annotations

import signal
import stat
from pathlib import Path

import pytest

from worker import devenv


def test_parse_args_takes_everything_after_double_dash_as_the_command() -> None:
    options = devenv.parse_args(["--keep", "--", "pytest", "-x", "--keep"])
    assert options == devenv.Options(command=["pytest", "-x", "--keep"], keep=True)


def test_parse_args_without_double_dash() -> None:
    assert devenv.parse_args(["true"]) == devenv.Options(command=["true"], keep=False)


@pytest.mark.parametrize("argv", [[], ["--"], ["--keep", "--"]])
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
    url = devenv.redis_url(Path("/srv/app/.contextlog/redis.sock"))
    assert url == "unix:///srv/app/.contextlog/redis.sock?db=0"


def test_redis_url_wants_an_absolute_path() -> None:
    with pytest.raises(ValueError, match="absolute"):
        devenv.redis_url(Path(".contextlog/redis.sock"))


def test_redis_server_listens_on_the_socket_only_and_persists_nothing() -> None:
    args = devenv.redis_server_args(Path("/s"))
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert options["--port"] == "0"
    assert options["--unixsocket"] == "/s/redis.sock"
    assert options["--pidfile"] == "/s/redis.pid"
    assert options["--save"] == ""
    assert options["--appendonly"] == "no"
    assert options["--daemonize"] == "yes"


def test_socket_path_fits() -> None:
    assert devenv.socket_path_fits(Path("/srv/app/.contextlog/redis.sock"))
    assert not devenv.socket_path_fits(Path("/" + "d" * 120 + "/redis.sock"))


def test_unreachable_dirs_lists_ancestors_without_o_rx() -> None:
    modes = {"/": 0o755, "/root": 0o700, "/root/app": 0o755, "/root/app/.contextlog": 0o711}
    closed = devenv.unreachable_dirs(
        Path("/root/app/.contextlog/pgdata"), lambda p: stat.S_IFDIR | modes[str(p)]
    )
    assert closed == [Path("/root/app/.contextlog"), Path("/root")]


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


def test_summary_when_nothing_is_embedded() -> None:
    line = devenv.summary({}, ["DATABASE_URL", "REDIS_URL"], {})
    assert line.startswith("devenv: nothing embedded")


def test_summary_names_embedded_servers_and_never_user_urls() -> None:
    line = devenv.summary({"postgres": ".contextlog/pgdata"}, ["REDIS_URL"], {})
    assert line == (
        "devenv: embedded postgres in .contextlog/pgdata; REDIS_URL from the environment;"
        " stopped afterwards"
    )


def test_summary_gives_urls_of_kept_servers() -> None:
    kept = {"REDIS_URL": "unix:///a/.contextlog/redis.sock?db=0"}
    line = devenv.summary({"redis": ".contextlog/redis.sock"}, ["DATABASE_URL"], kept)
    assert line.endswith("left running (--keep): REDIS_URL=unix:///a/.contextlog/redis.sock?db=0")
    assert "\n" not in line
