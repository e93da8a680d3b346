"""Redis's memory: an evicting policy is refused, full and evicting Redis are reported."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from contextlog.schema.errors import ConfigError
from contextlog.worker.app import memory, status

MIB = 1 << 20


class FakeInfo:
    """A Redis client's INFO, as a seam: what the memory check reads and nothing else."""

    def __init__(
        self,
        used: int = MIB,
        limit: int = 0,
        policy: str = "noeviction",
        evicted: int = 0,
        port: int = 6379,
        refuse: bool = False,
    ) -> None:
        self.connection_pool = type("Pool", (), {})()
        self.connection_pool.connection_kwargs = {"host": "r", "port": port}
        self.mem = {"used_memory": used, "maxmemory": limit, "maxmemory_policy": policy}
        self.stats = {"evicted_keys": evicted}
        self.refuse = refuse

    def info(self, section: str) -> dict[str, Any]:
        if self.refuse:
            raise redis.ResponseError("NOPERM this user has no permissions to run 'info'")
        return self.mem if section == "memory" else self.stats


def test_an_evicting_redis_is_refused_unless_the_loss_is_accepted() -> None:
    lru = FakeInfo(limit=64 * MIB, policy="allkeys-lru")
    with pytest.raises(ConfigError) as info:
        memory.check_policy([("REDIS_URL", FakeInfo()), ("REDIS_URL", lru)], False)
    message = str(info.value)
    assert "REDIS_URL (r:6379) has maxmemory-policy allkeys-lru" in message
    assert "CONTEXTLOG_ACCEPT_EVICTION=1" in message and "noeviction" in message
    memory.check_policy([("REDIS_URL", lru)], True)  # accepted: a warning only
    memory.check_policy([("REDIS_URL", FakeInfo()), ("X", FakeInfo(refuse=True))], False)


def test_status_says_redis_is_full_evicting_or_nearly_full() -> None:
    nodes, problems = status.redis_memory(
        [
            ("REDIS_URL", FakeInfo(used=64 * MIB, limit=64 * MIB)),
            ("REDIS_URL", FakeInfo(used=64 * MIB, limit=64 * MIB)),  # the same node: once
            ("CONTEXTLOG_QUEUE_REDIS_URL", FakeInfo(policy="volatile-lru", evicted=7, port=2)),
        ]
    )
    assert [n.node for n in nodes] == ["r:6379", "r:2"]
    assert len(problems) == 3
    assert problems[0].startswith("REDIS_URL (r:6379) is full (64.0 MiB of maxmemory 64.0 MiB)")
    assert "maxmemory-policy volatile-lru" in problems[1]
    assert "has evicted 7 keys since it started" in problems[2]
    _, nearly = status.redis_memory([("REDIS_URL", FakeInfo(used=60 * MIB, limit=64 * MIB))])
    assert nearly == [
        "REDIS_URL (r:6379) is 94% full (60.0 MiB of maxmemory 64.0 MiB): it refuses new "
        "events once full"
    ]
    assert status.redis_memory([("REDIS_URL", FakeInfo())])[1] == []  # no limit, no problem
