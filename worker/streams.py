"""Redis side of ingest: shard leases, consumer-group reads, acks, dead letters, trimming."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis

from schema import keys

Fields = dict[bytes, bytes]
PAGE: Final = 1000
Entry = tuple[str, Fields]

# Take or re-take a lease. A holder re-taking its own lease (a restarted process with a
# stable consumer name) is allowed. Each take bumps the shard's epoch, the fencing token
# Postgres checks; ARGV[3] is the last epoch Postgres saw, so a Redis that lost its data
# can never hand out an epoch that is already spent.
_ACQUIRE: Final = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local e = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if e <= floor then
  e = floor + 1
  redis.call('SET', KEYS[2], e)
end
return e
"""
_RENEW: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Rejected:
    """An entry that goes to the dead-letter stream, and why."""

    entry_id: str
    fields: Fields
    reason: str
    detail: str


def _decode_entries(raw: Iterable[Any]) -> list[Entry]:
    out: list[Entry] = []
    for entry_id, fields in raw:
        if fields is None:  # deleted while pending (Redis < 7 reports these as nil)
            continue
        out.append((entry_id.decode(), fields))
    return out


class Streams:
    """Shard streams of one Redis, seen by one ingest consumer."""

    def __init__(self, client: redis.Redis, consumer: str) -> None:
        # redis-py types replies as unions over every decode mode; this client returns
        # bytes (decode_responses is off), so replies are handled as such.
        self.redis: Any = client
        self.consumer = consumer
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    # -- leases ---------------------------------------------------------------------
    def heartbeat(self, now_ms: int, ttl_ms: int) -> int:
        """Announce this consumer; returns how many live ingest consumers there are."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(keys.MEMBERS, {self.consumer: now_ms + ttl_ms})
        pipe.zremrangebyscore(keys.MEMBERS, "-inf", now_ms)
        pipe.zcard(keys.MEMBERS)
        return int(pipe.execute()[2])

    def leave(self) -> None:
        """Stop counting this consumer as live."""
        self.redis.zrem(keys.MEMBERS, self.consumer)

    def acquire(self, shard: int, ttl_ms: int, epoch_floor: int) -> int | None:
        """Take the shard's lease if free (or ours); returns the new epoch, or None."""
        epoch = self._acquire(
            keys=[keys.lease(shard), keys.epoch(shard)], args=[self.consumer, ttl_ms, epoch_floor]
        )
        return int(epoch) or None

    def renew(self, shards: Sequence[int], ttl_ms: int) -> list[int]:
        """Extend our leases; returns the shards whose lease we no longer hold."""
        pipe = self.redis.pipeline(transaction=False)
        for shard in shards:
            self._renew(keys=[keys.lease(shard)], args=[self.consumer, ttl_ms], client=pipe)
        return [s for s, ok in zip(shards, pipe.execute(), strict=True) if not ok]

    def release(self, shard: int) -> None:
        """Give the shard's lease back (only if we still hold it)."""
        self._release(keys=[keys.lease(shard)], args=[self.consumer])

    # -- reading --------------------------------------------------------------------
    def ensure_group(self, shard: int) -> None:
        """Create the shard's stream and consumer group if missing."""
        try:
            self.redis.xgroup_create(keys.stream(shard), keys.INGEST_GROUP, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def read_new(self, shards: Sequence[int], count: int, block_ms: int) -> dict[int, list[Entry]]:
        """Never-delivered entries of our shards, in one blocking XREADGROUP."""
        streams = {keys.stream(s): ">" for s in shards}
        reply = self.redis.xreadgroup(
            keys.INGEST_GROUP, self.consumer, streams, count=count, block=block_ms
        )
        by_name = {keys.stream(s): s for s in shards}
        return {by_name[name.decode()]: _decode_entries(items) for name, items in reply or []}

    def read_own_pending(self, shard: int) -> list[Entry]:
        """Our unacknowledged entries, re-delivered: counts as a delivery (after a restart)."""
        entries: list[Entry] = []
        after = "0"
        while True:
            reply = self.redis.xreadgroup(
                keys.INGEST_GROUP, self.consumer, {keys.stream(shard): after}, count=PAGE
            )
            page = _decode_entries(reply[0][1]) if reply else []
            entries += page
            if len(page) < PAGE:
                return entries
            after = page[-1][0]

    def reload_own_pending(self, shard: int) -> list[Entry]:
        """Our unacknowledged entries, re-read without counting a delivery (after an outage)."""
        ids = [_s(r["message_id"]) for r in self._pending(shard, self.consumer)]
        pipe = self.redis.pipeline(transaction=False)
        for entry_id in ids:
            pipe.xrange(keys.stream(shard), entry_id, entry_id, count=1)
        return [e for reply in pipe.execute() for e in _decode_entries(reply)]

    def claim_from_others(self, shard: int) -> list[Entry]:
        """Take over every entry pending with other consumers; forget consumers left empty.

        Called only by the shard's lease holder, so those consumers are former owners.
        Each claim counts as a delivery, which is what catches an entry that kills ingest.
        """
        stream = keys.stream(shard)
        claimed: list[Entry] = []
        for consumer in self.redis.xinfo_consumers(stream, keys.INGEST_GROUP):
            name = _s(consumer["name"])
            if name == self.consumer:
                continue
            ids = [_s(r["message_id"]) for r in self._pending(shard, name)]
            for i in range(0, len(ids), PAGE):
                reply = self.redis.xclaim(
                    stream, keys.INGEST_GROUP, self.consumer, 0, ids[i : i + PAGE]
                )
                claimed += _decode_entries(reply)
            self.redis.xgroup_delconsumer(stream, keys.INGEST_GROUP, name)
        return claimed

    def _pending(self, shard: int, consumer: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        start = "-"
        while True:
            page = self.redis.xpending_range(
                keys.stream(shard),
                keys.INGEST_GROUP,
                min=start,
                max="+",
                count=PAGE,
                consumername=consumer,
            )
            rows += page
            if len(page) < PAGE:
                return rows
            start = "(" + _s(page[-1]["message_id"])

    def deliveries(self, shard: int, entry_ids: Sequence[str]) -> dict[str, int]:
        """How many times each of our pending entries was delivered."""
        if not entry_ids:
            return {}
        rows = self.redis.xpending_range(
            keys.stream(shard),
            keys.INGEST_GROUP,
            min=entry_ids[0],
            max=entry_ids[-1],
            count=len(entry_ids) + 1000,
            consumername=self.consumer,
        )
        return {_s(r["message_id"]): int(r["times_delivered"]) for r in rows}

    # -- crash suspects -----------------------------------------------------------------
    def mark_inflight(self, shard: int, entry_id: str | None) -> None:
        """Record (or, with None, clear) the one entry being stored right now."""
        if entry_id is None:
            self.redis.delete(keys.inflight(shard))
        else:
            self.redis.set(keys.inflight(shard), entry_id)

    def inflight(self, shard: int) -> str | None:
        """The entry a previous owner was storing alone when it died, if any."""
        value = self.redis.get(keys.inflight(shard))
        return None if value is None else _s(value)

    # -- acknowledging ----------------------------------------------------------------
    def ack(self, shard: int, entry_ids: Sequence[str]) -> None:
        """Acknowledge entries whose events are committed."""
        if entry_ids:
            self.redis.xack(keys.stream(shard), keys.INGEST_GROUP, *entry_ids)

    def dead_letter(self, shard: int, rejected: Sequence[Rejected]) -> None:
        """Move entries to `contextlog:dead` with their reason, atomically with their XACK."""
        pipe = self.redis.pipeline(transaction=True)
        for r in rejected:
            pipe.xadd(keys.DEAD_LETTERS, dead_letter_fields(shard, r))
            pipe.hincrby(keys.STATS, f"dead:{r.reason}", 1)
        pipe.xack(keys.stream(shard), keys.INGEST_GROUP, *[r.entry_id for r in rejected])
        pipe.execute()

    def trim(self, shard: int) -> int:
        """Drop acknowledged entries: everything below the oldest pending or undelivered one."""
        stream = keys.stream(shard)
        groups = self.redis.xinfo_groups(stream)
        group = next((g for g in groups if _s(g["name"]) == keys.INGEST_GROUP), None)
        if group is None:
            return 0
        floor = _s(group["last-delivered-id"])
        pending = self.redis.xpending(stream, keys.INGEST_GROUP)
        if pending["pending"]:
            floor = min(floor, _s(pending["min"]), key=id_key)
        if floor == "0-0":
            return 0
        # approximate=False: an approximate MINID trim may keep more, never less, but an
        # exact one makes the stream length a true measure of what is left to do.
        return int(self.redis.xtrim(stream, minid=floor, approximate=False))


def dead_letter_fields(shard: int, r: Rejected) -> dict[str | bytes, bytes | str | int]:
    """The fields of a dead letter: why, where from, and the original fields."""
    out: dict[str | bytes, bytes | str | int] = {
        "reason": r.reason,
        "detail": r.detail[:2000],
        "stream": keys.stream(shard),
        "entry_id": r.entry_id,
    }
    for name, value in r.fields.items():
        out[b"orig:" + name] = value
    return out


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def id_key(entry_id: str) -> tuple[int, int]:
    """Sort key of a stream entry id: (milliseconds, sequence)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def entry_time_ms(entry_id: str) -> int:
    """The Unix milliseconds a stream entry id was created at."""
    return id_key(entry_id)[0]
