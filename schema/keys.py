"""Redis key names and the sharding rule shared by producers and workers.

Keys carry their shard or source in braces, literally (`contextlog:in:{3}`), so each
stays in one hash slot under Redis Cluster.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Final

from contextlog.schema.defaults import whole
from contextlog.schema.errors import ConfigError

DEFAULT_SHARDS: Final = 4
MAX_SHARDS: Final = 1024
SHARDS_VAR: Final = "CONTEXTLOG_SHARDS"

# Dead letters and their counts per reason live per shard (`dead_letters`, `stats`);
# these single keys are where versions before Redis Cluster support kept them: readers
# still count them.
LEGACY_DEAD_LETTERS: Final = "contextlog:dead"
LEGACY_STATS: Final = "contextlog:stats"
SHARDS_KEY: Final = "contextlog:shards"
MEMBERS: Final = "contextlog:ingest:members"
RUNS: Final = "contextlog:ingest:runs"  # start and crash notes of ingest consumers
# What each ingest consumer cannot reach right now (field: consumer), for `status`.
DOWN: Final = "contextlog:ingest:down"
INGEST_GROUP: Final = "ingest"


def stream(shard: int) -> str:
    """The inbound stream of one shard."""
    return f"contextlog:in:{{{shard}}}"


def dead_letters(shard: int) -> str:
    """The dead-letter stream of one shard: in its stream's slot, so an entry moves there
    and is acknowledged in one MULTI, on a Redis Cluster too."""
    return f"contextlog:dead:{{{shard}}}"


def stats(shard: int) -> str:
    """Counters of one shard (`dead:<reason>`), updated in the same MULTI."""
    return f"contextlog:stats:{{{shard}}}"


def lease(shard: int) -> str:
    """The key whose holder owns a shard's ingest."""
    return f"contextlog:lease:{{{shard}}}"


def epoch(shard: int) -> str:
    """A counter bumped on each new lease: the fencing token checked in Postgres."""
    return f"contextlog:epoch:{{{shard}}}"


def inflight(shard: int) -> str:
    """The entries (a range, `first last`) being processed after a redelivery; if ingest
    dies, they are the suspects."""
    return f"contextlog:inflight:{{{shard}}}"


def outbox(source: str) -> str:
    """The notification stream of one adapter."""
    return f"contextlog:out:{{{source}}}"


def idle_timer(conversation: str) -> str:
    """The hash of a conversation's idle timer (`conversation`: its digest, in braces: one
    slot; tasks/timers.py)."""
    return f"contextlog:idle:{{{conversation}}}"


def idle_bucket(second: int) -> str:
    """The hash of one second's bucket of idle deadlines: its job and its timers' keys."""
    return f"contextlog:idle-due:{{{second}}}"


def compaction_claim(conversation: str) -> str:
    """The key that says a compaction of the conversation (its job key) is queued or
    running."""
    return f"contextlog:compacting:{{{conversation}}}"


def worker_heartbeat(worker: str) -> str:
    """The hash where the worker named `worker` records its sweeper's heartbeat."""
    return f"contextlog:worker:{{{worker}}}:sweep"


def shard_of(agent: str, channel: str, shards: int) -> int:
    """Stable shard of a conversation: CRC-32 of its key, the same in every process."""
    key = agent.encode() + b"\x00" + channel.encode()
    return zlib.crc32(key) % shards


def shards_from_env(env: Mapping[str, str]) -> int:
    """The shard count from `CONTEXTLOG_SHARDS`, validated."""
    raw = env.get(SHARDS_VAR)
    if raw is None or raw == "":
        return DEFAULT_SHARDS
    return whole(SHARDS_VAR, raw, 1, MAX_SHARDS)


def check_shards(recorded: bytes | str | None, shards: int) -> None:
    """Refuse to work with a shard count other than the one ingest recorded (SHARDS_KEY):
    producers would write to streams no ingest reads, and `status` would show the wrong
    ones. Nothing recorded yet (no ingest ran) passes."""
    if recorded is not None and int(recorded) != shards:
        raise ConfigError(
            f"{SHARDS_VAR} is {shards} here but ingest runs with {int(recorded)}: "
            f"set {SHARDS_VAR}={int(recorded)} here too"
        )


def attachment(shard: int, sha256: str) -> str:
    """The bytes of one attachment waiting for ingest; in its entry's shard slot, so the
    producer writes it and the entry in one MULTI and ingest reads it with its shard."""
    return f"contextlog:attachment:{{{shard}}}:{sha256}"
