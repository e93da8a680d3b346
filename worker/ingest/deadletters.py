"""Reading the dead letters: one stream per shard (`contextlog:dead:{N}`), plus the single
stream of versions before Redis Cluster support, seen as one list, newest first."""

from __future__ import annotations

from typing import Any, NamedTuple

from contextlog.schema import keys
from contextlog.worker.ingest.streams import Fields, id_key


class Letter(NamedTuple):
    """One dead letter."""

    entry_id: str  # in its dead-letter stream
    fields: Fields


def streams(shards: int) -> list[str]:
    """Every stream that can hold dead letters."""
    return [keys.dead_letters(s) for s in range(shards)] + [keys.LEGACY_DEAD_LETTERS]


def count(client: Any, shards: int) -> int:
    """How many dead letters are kept, over all shards (one round trip)."""
    pipe = client.pipeline(transaction=False)
    for name in streams(shards):
        pipe.xlen(name)
    return sum(int(n) for n in pipe.execute())


def newest(client: Any, shards: int, limit: int) -> list[Letter]:
    """The `limit` newest dead letters over all shards, newest first."""
    pipe = client.pipeline(transaction=False)
    for name in streams(shards):
        pipe.xrevrange(name, count=limit)
    letters = [Letter(_s(i), f) for reply in pipe.execute() for i, f in reply]
    return sorted(letters, key=lambda letter: id_key(letter.entry_id), reverse=True)[:limit]


def by_reason(client: Any, shards: int) -> dict[str, int]:
    """Every rejection ever counted, by reason (the counters outlive trimmed letters)."""
    pipe = client.pipeline(transaction=False)
    for name in [keys.stats(s) for s in range(shards)] + [keys.LEGACY_STATS]:
        pipe.hgetall(name)
    out: dict[str, int] = {}
    for counters in pipe.execute():
        for k, v in counters.items():
            if _s(k).startswith("dead:"):
                reason = _s(k).removeprefix("dead:")
                out[reason] = out.get(reason, 0) + int(v)
    return out


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
