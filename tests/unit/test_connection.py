"""Redis or Redis Cluster, from the URL's scheme; nothing connects on construction."""

from __future__ import annotations

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from contextlog.producers import connection
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
