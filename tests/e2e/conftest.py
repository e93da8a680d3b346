"""Fixtures of the end-to-end tests: a private Postgres cluster a module, and Stacks
(tests/support/stack.py) built on it, each on a fresh database and a new private Redis."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import services
from tests.support.servers import PostgresCluster, RedisServer, require_servers
from tests.support.stack import Stack

_databases = itertools.count()


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    """One private Postgres cluster for the module; tests that crash it restart it."""
    require_servers()
    with PostgresCluster.start_new() as pg:
        yield pg


@pytest.fixture
def make_stack(
    cluster: PostgresCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Stack]]:
    """Builds a Stack on a fresh database and a new private Redis; stops it afterwards."""
    built: list[Stack] = []
    prefix = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")

    def make(
        *,
        appendonly: bool = True,
        redis_options: tuple[str, ...] = (),
        tablespace: str | None = None,
    ) -> Stack:
        if not cluster.running():
            cluster.start()  # a test that crashed it failed before restarting it
        name = f"{prefix}_{next(_databases)}"
        db = services.create_database(cluster.url, name, tablespace)
        workdir = tmp_path / f"redis-{len(built)}"
        rds = RedisServer(appendonly=appendonly, workdir=workdir, extra=redis_options)
        rds.dir.mkdir()
        stack = Stack(tmp_path, cluster, rds.start(), db)
        built.append(stack)
        return stack

    yield make
    for stack in built:
        print(stack.tails())  # shown when the test failed
        stack.close()
        stack.redis.close()
