"""Redis clients from URLs: one Redis, or a Redis Cluster named by its URL scheme.

A cluster is asked for by the scheme, `redis+cluster://host:port` (`rediss+cluster://`
with TLS): any node of the cluster will do, the client learns the others from it.
Explicit rather than detected (CLUSTER INFO at start-up): building a client connects to
nothing, and a deployment says in its configuration what it runs on. A cluster has
database 0 only, so a cluster URL naming another database is refused.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from contextlog.producers import liveness
from contextlog.schema.errors import ConfigError, Unavailable

CLUSTER_SCHEMES: Final = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# How long a command of an adapter's client may wait for its answer (a push of a large
# batch included): past it the client gives up on a Redis that stopped answering.
SOCKET_TIMEOUT_S: Final = 10.0

# Either kind of client: the commands contextlog sends work on both (one key, or keys
# of one hash slot, per command and per MULTI).
SyncClient = redis.Redis | RedisCluster
AsyncClient = aioredis.Redis | AsyncRedisCluster


# A password in a URL's query or in a libpq `key=value` string (`password=...`).
_PASSWORD_PARAM: Final = re.compile(r"(password=)[^&\s]*", re.IGNORECASE)
REDACTED: Final = "***"


def redact(url: str) -> str:
    """`url` without its password, for any message that shows it: `user:***@host`, and
    `password=***` in a query or a libpq string. Works on what does not parse as a URL
    too (a bad port, a stray `@`, no scheme): what is shown is only ever less."""
    text = _PASSWORD_PARAM.sub(rf"\1{REDACTED}", url)
    head, at, host = text.rpartition("@")
    if not at:
        return text
    scheme = head.find("://")
    start = scheme + 3 if scheme >= 0 else head.rfind("/") + 1
    user, colon, _password = head[start:].partition(":")
    if not colon:
        return text  # a user name only (a password alone is written `:secret@`)
    return f"{head[:start]}{user}:{REDACTED}@{host}"


def is_cluster_url(url: str) -> bool:
    """Whether `url` names a Redis Cluster (`redis+cluster://`, `rediss+cluster://`)."""
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def is_cluster(client: object) -> bool:
    """Whether `client` talks to a Redis Cluster (sync or asyncio, or one's pipeline)."""
    return isinstance(client, RedisCluster | AsyncRedisCluster)


def cluster_node_url(url: str, name: str = "REDIS_URL") -> str:
    """The plain `redis://` URL of the node a cluster URL names; database 0 only."""
    parts = urlsplit(url)
    scheme = CLUSTER_SCHEMES.get(parts.scheme)
    if scheme is None:
        raise ConfigError(f"{name} is not a redis+cluster:// URL: {redact(url)!r}")
    dbs = [*parse_qs(parts.query).get("db", []), parts.path.strip("/") or "0"]
    if any(db != "0" for db in dbs):
        raise ConfigError(
            f"{name} names database {dbs[0] if dbs[0] != '0' else dbs[-1]!r}, but a Redis "
            f"Cluster has database 0 only: {redact(url)!r}"
        )
    return parts._replace(scheme=scheme).geturl()


def connect(url: str, **kwargs: Any) -> SyncClient:
    """A client for `url`: a `RedisCluster` for a cluster URL, a `Redis` otherwise.
    Keyword arguments go to the client, over the defaults of `options` (keepalives,
    timeouts). A `Redis` connects on first use; a `RedisCluster` asks a node for the slot
    map at once (redis-py's sync client has no lazy start), so an unreachable cluster is
    `Unavailable` here."""
    kwargs = options(url, **kwargs)
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **kwargs)
    try:
        return RedisCluster.from_url(cluster_node_url(url), **kwargs)
    except (RedisClusterException, redis.RedisError) as e:
        raise Unavailable(f"cannot reach the Redis Cluster at {_where(url)}: {e}") from e


def options(url: str, **kwargs: Any) -> dict[str, Any]:
    """Options of a client for `url`: TCP keepalives (not on a unix socket, which has
    none), a connect timeout and a SOCKET_TIMEOUT_S answer timeout (`liveness`), each
    overridden by `kwargs` (`socket_timeout=None` for a client that blocks as long as its
    caller asks)."""
    defaults = liveness.redis_options(SOCKET_TIMEOUT_S)
    if urlsplit(url).scheme == "unix":
        defaults = {k: v for k, v in defaults.items() if not k.startswith("socket_keepalive")}
    return {**defaults, **kwargs}


def _where(url: str) -> str:
    """host:port of a URL, without its credentials."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}"


def connect_async(url: str, **kwargs: Any) -> AsyncClient:
    """`connect` for asyncio adapters (the asyncio cluster client starts on first use)."""
    kwargs = options(url, **kwargs)
    if is_cluster_url(url):
        return AsyncRedisCluster.from_url(cluster_node_url(url), **kwargs)
    return aioredis.Redis.from_url(url, **kwargs)
