"""Redis or Redis Cluster, from the URL's scheme; nothing connects on construction."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from contextlog.producers import ContextReader, Notifications, connection, liveness
from contextlog.schema.errors import ConfigError, Unavailable


def test_a_cluster_is_named_by_its_scheme() -> None:
    assert connection.is_cluster_url("redis+cluster://h:7000")
    assert connection.is_cluster_url("rediss+cluster://h:7000/0")
    assert not connection.is_cluster_url("redis://h:6379/3")
    assert connection.cluster_node_url("rediss+cluster://u:p@h:7000") == "rediss://u:p@h:7000"


def test_clients_by_kind() -> None:
    plain = connection.connect("redis://127.0.0.1:1/3")
    assert isinstance(plain, redis.Redis) and not connection.is_cluster(plain)
    assert plain.connection_pool.connection_kwargs["db"] == 3
    # redis-py's sync cluster client fetches the slot map at once: unreachable is said so.
    with pytest.raises(Unavailable, match=r"cannot reach the Redis Cluster at 127\.0\.0\.1:1"):
        connection.connect("redis+cluster://u:secret@127.0.0.1:1", socket_connect_timeout=0.2)
    assert isinstance(connection.connect_async("redis+cluster://127.0.0.1:1"), AsyncRedisCluster)


@pytest.mark.parametrize("url", ["redis+cluster://h:7000/2", "redis+cluster://h:7000?db=1"])
def test_a_cluster_has_database_0_only(url: str) -> None:
    with pytest.raises(ConfigError, match="database 0 only"):
        connection.cluster_node_url(url)


def test_cluster_types_are_recognised() -> None:
    assert RedisCluster in connection.SyncClient.__args__


def test_every_client_has_keepalives_and_timeouts() -> None:
    clients: list[Any] = [
        connection.connect("redis://h:6379/3"),
        connection.connect_async("redis://h"),
    ]
    for client in clients:
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_keepalive"] is True
        assert kwargs["socket_keepalive_options"][socket.TCP_KEEPIDLE] == liveness.KEEPALIVE_IDLE_S
        assert kwargs["socket_keepalive_options"][socket.TCP_USER_TIMEOUT] == 11_000
        assert kwargs["socket_connect_timeout"] == liveness.CONNECT_TIMEOUT_S
        assert kwargs["socket_timeout"] == connection.SOCKET_TIMEOUT_S
    # A client that blocks as long as its caller asks keeps the keepalives.
    blocking = Notifications.from_url("redis://h:6379/3", "discord").redis
    assert blocking.connection_pool.connection_kwargs["socket_timeout"] is None
    assert blocking.connection_pool.connection_kwargs["socket_keepalive"] is True
    assert liveness.DEAD_PEER_S == 11


def test_postgres_connections_have_keepalives_unless_the_url_says_otherwise() -> None:
    options = liveness.postgres_options("postgresql://u@h/db")
    assert options["keepalives_idle"] == liveness.KEEPALIVE_IDLE_S
    assert options["tcp_user_timeout"] == 11_000 and options["connect_timeout"] == 5
    given = liveness.postgres_options("postgresql://u@h/db?keepalives_idle=60&connect_timeout=2")
    assert "keepalives_idle" not in given and "connect_timeout" not in given
    reader = ContextReader.from_url("postgresql://u@h/db", replica_url="postgresql://u@r/db")
    assert reader.replica is not None
    kwargs: list[Any] = [reader.pool.kwargs, reader.replica.pool.kwargs]
    assert all(k["keepalives"] == 1 and k["autocommit"] is True for k in kwargs)


def test_the_watchdog_cuts_a_call_still_running_at_its_deadline() -> None:
    watchdog = liveness.Watchdog()
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    with a, b, c, d:
        with watchdog.guard(c.fileno(), time.monotonic() + 3600) as kept:
            pass  # left before its deadline: never cut
        with watchdog.guard(a.fileno(), time.monotonic() - 1) as guard:
            assert a.recv(1) == b""  # a blocked read returns once the socket is shut
        assert guard.cut and not kept.cut and watchdog.cuts == 1
        d.sendall(b"x")
        assert c.recv(1) == b"x"  # the socket left in time still works


def test_a_unix_socket_client_gets_its_timeouts_and_no_tcp_options() -> None:
    client: Any = connection.connect("unix:///tmp/contextlog-none.sock?db=3")
    made = client.connection_pool.make_connection()  # builds, does not connect
    assert made.socket_timeout == connection.SOCKET_TIMEOUT_S
    assert "socket_keepalive" not in client.connection_pool.connection_kwargs
