"""What Redis says of its memory: an eviction policy that loses events, and being full.

Redis holds every event from the producer's XADD until ingest commits it, RQ's jobs and
the idle timers. With a `maxmemory-policy` other than `noeviction` (`allkeys-lru` is a
common default on managed Redis), a Redis at its `maxmemory` deletes keys to make room:
stream entries, leases, timers; a campaign lost 11,775 of 40,500 accepted events that way,
with no error anywhere. So ingest and the worker refuse to start on such a Redis unless
CONTEXTLOG_ACCEPT_EVICTION says the operator accepts the loss, and `status` reports it.
With `noeviction`, a full Redis refuses writes instead: producers get `Unavailable`, ingest
drains (which frees memory), and `status` says Redis is full.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis
import structlog

from contextlog.producers import connection
from contextlog.schema.errors import ConfigError
from contextlog.worker.app.config import ACCEPT_EVICTION_VAR

log = structlog.get_logger("contextlog.memory")

SAFE_POLICY: Final = "noeviction"
NEARLY_FULL: Final = 0.9  # a share of maxmemory past which `status` warns


@dataclass(frozen=True)
class Memory:
    """One Redis node's memory (INFO memory and stats)."""

    node: str  # host:port
    used: int  # bytes, as Redis counts them against maxmemory
    limit: int  # maxmemory; 0: no limit
    policy: str
    evicted: int  # keys evicted since the server started

    @property
    def full(self) -> bool:
        """Whether Redis refuses commands that need memory (it is at its maxmemory)."""
        return self.limit > 0 and self.used >= self.limit

    @property
    def share(self) -> float:
        """How full it is (0 without a limit)."""
        return self.used / self.limit if self.limit else 0.0


def read(client: Any) -> list[Memory]:
    """The memory of each node `client` writes to: the Redis, or each primary of a
    Redis Cluster."""
    if connection.is_cluster(client):
        return [_node(client, f"{n.host}:{n.port}", n) for n in client.get_primaries()]
    kwargs = client.connection_pool.connection_kwargs
    return [_node(client, f"{kwargs.get('host', 'unix')}:{kwargs.get('port', '')}", None)]


def _node(client: Any, name: str, target: Any) -> Memory:
    extra = {} if target is None else {"target_nodes": target}
    mem = client.info("memory", **extra)
    stats = client.info("stats", **extra)
    used = int(mem.get("used_memory", 0)) - int(mem.get("mem_not_counted_for_evict", 0))
    return Memory(
        node=name,
        used=used,
        limit=int(mem.get("maxmemory", 0)),
        policy=str(mem.get("maxmemory_policy", SAFE_POLICY)),
        evicted=int(stats.get("evicted_keys", 0)),
    )


def evicting(what: str, m: Memory) -> str:
    """The problem with a node whose policy evicts keys."""
    return (
        f"{what} ({m.node}) has maxmemory-policy {m.policy}: at its maxmemory it deletes "
        f"keys (stream entries, leases, timers), losing events without an error; set "
        f"maxmemory-policy noeviction"
    )


def check_policy(clients: Sequence[tuple[str, Any]], accept_eviction: bool) -> None:
    """Refuse to start on a Redis that may evict keys (`ConfigError`), unless the operator
    accepts the loss (CONTEXTLOG_ACCEPT_EVICTION): then a warning. `clients` are named by
    their variable (REDIS_URL, CONTEXTLOG_QUEUE_REDIS_URL). A Redis whose INFO this user
    may not read is started on, with a warning."""
    for what, client in clients:
        try:
            nodes = read(client)
        except redis.ResponseError as e:  # NOPERM: an ACL user without +info
            log.warning("cannot read the Redis eviction policy", redis=what, error=str(e))
            continue
        for m in nodes:
            if m.policy == SAFE_POLICY:
                continue
            if not accept_eviction:
                raise ConfigError(
                    f"{evicting(what, m)}, or set {ACCEPT_EVICTION_VAR}=1 to run anyway "
                    f"and accept that events may be lost"
                )
            log.warning("Redis may evict keys: events may be lost", redis=what, policy=m.policy)


def problems(what: str, nodes: Sequence[Memory]) -> list[str]:
    """What `status` says of a Redis: an evicting policy, keys evicted, full or nearly."""
    out = []
    for m in nodes:
        if m.policy != SAFE_POLICY:
            out.append(evicting(what, m))
        if m.evicted:
            out.append(
                f"{what} ({m.node}) has evicted {m.evicted} keys since it started: events, "
                f"leases or timers may be lost"
            )
        if m.full:
            out.append(
                f"{what} ({m.node}) is full ({_mib(m.used)} of maxmemory {_mib(m.limit)}): "
                f"it refuses new events (producers get Unavailable) until ingest drains it "
                f"or maxmemory is raised"
            )
        elif m.share >= NEARLY_FULL:
            out.append(
                f"{what} ({m.node}) is {m.share:.0%} full ({_mib(m.used)} of maxmemory "
                f"{_mib(m.limit)}): it refuses new events once full"
            )
    return out


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
