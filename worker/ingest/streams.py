"""Redis side of ingest: shard leases, consumer-group reads, acks, dead letters, trimming."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import redis
import structlog

from contextlog.producers import connection
from contextlog.schema import keys

# Redis cannot serve us right now, and will again: connection lost or timed out, or a
# Redis Cluster without a master for some slot while a replica is being promoted.
REDIS_AWAY: Final = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)

log = structlog.get_logger("contextlog.streams")

Fields = dict[bytes, bytes]
PAGE: Final = 1000
Entry = tuple[str, Fields]
# Dead letters kept per shard (approximately: MAXLEN ~): the oldest go first, counters
# stay exact.
DEAD_LETTER_CAP: Final = 100_000
# A dead letter keeps its original fields whole when they fit in this many bytes (so it
# can be replayed); an oversized entry keeps the first ORIG_PREFIX bytes of each field.
ORIG_WHOLE_BYTES: Final = 256 * 1024
ORIG_PREFIX: Final = 4096
# On a Redis Cluster, how long an idle read blocks on one shard (`_read_per_shard`).
CLUSTER_BLOCK_MS: Final = 50
RUNS_KEPT_MS: Final = 3_600_000  # ingest start and crash records kept for an hour

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
_SET: Final = "return redis.call('SET', KEYS[1], ARGV[1])"
_CREATE_GROUP: Final = "return redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')"
# A batch's dead letters, as `Streams.dead_letter`'s MULTI writes them, for a full Redis.
# ARGV: group, cap, then per letter its entry id, reason, field count and fields.
_DEAD_LETTER: Final = """
local i = 3
while i <= #ARGV do
  local n = tonumber(ARGV[i + 2]) * 2
  local fields = {}
  for j = 1, n do fields[j] = ARGV[i + 2 + j] end
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(fields))
  redis.call('HINCRBY', KEYS[2], 'dead:' .. ARGV[i + 1], 1)
  redis.call('XACK', KEYS[3], ARGV[1], ARGV[i])
  i = i + 3 + n
end
return 1
"""
# A full Redis (`maxmemory` reached, `noeviction`) refuses commands that may need memory
# (SET, INCR, ZADD, XADD, XGROUP CREATE; a plain script as soon as it calls one) and
# serves the others: reads, XACK, XCLAIM, XTRIM, PEXPIRE, DEL. Ingest's drain needs only
# those, and draining (acknowledged entries trimmed) is what frees memory. What needs a
# few bytes (taking a lease, a crash marker, a dead letter) runs as a script flagged
# `allow-oom` (Redis 7.0+) once Redis said it is full; Redis 6 has no such flag, so there
# these wait for memory, and a shard nobody holds waits with them.
ALLOW_OOM: Final = "#!lua flags=allow-oom\n"


@dataclass(frozen=True)
class Rejected:
    """An entry that goes to the dead-letter stream, and why."""

    entry_id: str
    fields: Fields
    reason: str
    detail: str


def _decode_entries(raw: Iterable[Any], gone: list[str] | None = None) -> list[Entry]:
    """The entries of a reply; those deleted while pending (an erase's scrub deletes the
    subject's stored entries before they are acknowledged; Redis < 7 reports them as
    nil) are left out, their ids put in `gone` to be acknowledged (or they would stay
    pending, and hold the trim back, for ever)."""
    out: list[Entry] = []
    for entry_id, fields in raw:
        if not fields:  # nil, which redis-py gives as {} (an entry has a field at least)
            if gone is not None:
                gone.append(entry_id.decode() if isinstance(entry_id, bytes) else entry_id)
            continue
        out.append((entry_id.decode(), fields))
    return out


class Streams:
    """Shard streams of one Redis, seen by one ingest consumer."""

    def __init__(self, client: connection.SyncClient, consumer: str) -> None:
        # redis-py types replies as unions over every decode mode; this client returns
        # bytes (decode_responses is off), so replies are handled as such.
        self.redis: Any = client
        self.consumer = consumer
        self._start: str | None = None  # this run's start note (record_start)
        self.cluster = connection.is_cluster(client)
        self._turn = 0  # which shard a cluster read blocks on next (_read_per_shard)
        self._release = client.register_script(_RELEASE)

    # -- leases ---------------------------------------------------------------------
    def heartbeat(self, now_ms: int, ttl_ms: int) -> int:
        """Announce this consumer; returns how many live ingest consumers there are.
        A full Redis refuses the announcement (ZADD needs memory): the count is still
        read, and the leases we hold are still renewed (`renew`), so the drain goes on."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(keys.MEMBERS, {self.consumer: now_ms + ttl_ms})
        pipe.zremrangebyscore(keys.MEMBERS, "-inf", now_ms)
        pipe.zcard(keys.MEMBERS)
        announced, *_, count = pipe.execute(raise_on_error=False)
        for reply in (announced, count):
            if isinstance(reply, Exception) and not is_full(reply):
                raise reply
        return 1 if isinstance(count, Exception) else max(1, int(count))

    def leave(self) -> None:
        """Stop counting this consumer as live."""
        self.redis.zrem(keys.MEMBERS, self.consumer)

    def acquire(self, shard: int, ttl_ms: int, epoch_floor: int) -> int | None:
        """Take the shard's lease if free (or ours); returns the new epoch, or None."""
        shard_keys = [keys.lease(shard), keys.epoch(shard)]
        epoch = self._eval(_ACQUIRE, shard_keys, [self.consumer, ttl_ms, epoch_floor])
        return int(epoch) or None

    def _eval(self, script: str, script_keys: Sequence[str], args: Sequence[Any]) -> Any:
        return eval_even_full(self.redis, script, script_keys, args)

    def renew(self, shards: Sequence[int], ttl_ms: int) -> list[int]:
        """Extend our leases; returns the shards whose lease we no longer hold."""
        # A plain EVAL with the script's text: redis-py's cluster pipeline has no script
        # support (EVALSHA and `eval()` refused), and a replica a failover promoted has no
        # scripts loaded anyway. The script is a few dozen bytes.
        pipe = self.redis.pipeline(transaction=False)
        for shard in shards:
            pipe.execute_command("EVAL", _RENEW, 1, keys.lease(shard), self.consumer, ttl_ms)
        return [s for s, ok in zip(shards, pipe.execute(), strict=True) if not ok]

    def release(self, shard: int) -> None:
        """Give the shard's lease back (only if we still hold it)."""
        self._release(keys=[keys.lease(shard)], args=[self.consumer])

    # -- reading --------------------------------------------------------------------
    def ensure_group(self, shard: int) -> None:
        """Create the shard's stream and consumer group if missing."""
        try:
            try:
                stream = keys.stream(shard)
                self.redis.xgroup_create(stream, keys.INGEST_GROUP, id="0", mkstream=True)
            except redis.exceptions.OutOfMemoryError:
                # A full Redis refuses even to find the group there: look, and make it
                # (a stream nothing was written to yet) with the few bytes it needs.
                if not self._has_group(shard):
                    self._eval(_CREATE_GROUP, [stream], [keys.INGEST_GROUP])
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def _has_group(self, shard: int) -> bool:
        try:
            groups = self.redis.xinfo_groups(keys.stream(shard))
        except redis.ResponseError:  # no such stream
            return False
        return any(_s(g["name"]) == keys.INGEST_GROUP for g in groups)

    def read_new(self, shards: Sequence[int], count: int, block_ms: int) -> dict[int, list[Entry]]:
        """Never-delivered entries of our shards, in one blocking XREADGROUP."""
        return self.read_new_checked(shards, count, block_ms)[0]

    def read_new_checked(
        self, shards: Sequence[int], count: int, block_ms: int | None
    ) -> tuple[dict[int, list[Entry]], list[int]]:
        """`read_new`, then the shards where a consumer other than us holds unacknowledged
        entries, in one round trip; `block_ms=None` does not wait for entries.

        After a takeover, a stalled former owner can still be handed entries (a blocking
        read it sent before it stopped is served while it sleeps). They are older than
        anything we read after them, so they must be claimed and stored first. Redis runs a
        pipeline's commands in order, and those after a blocking read only once it
        returns, so the pending summaries are taken after our read.
        """
        if self.cluster:
            if block_ms is None:
                return self._read_shards(shards, count, None)
            return self._read_per_shard(shards, count, block_ms)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xreadgroup(
            keys.INGEST_GROUP,
            self.consumer,
            {keys.stream(s): ">" for s in shards},
            count=count,
            block=block_ms,
        )
        for shard in shards:
            pipe.xpending(keys.stream(shard), keys.INGEST_GROUP)
        reply, *summaries = pipe.execute()
        by_name = {keys.stream(s): s for s in shards}
        read = {by_name[_s(name)]: _decode_entries(items) for name, items in reply or []}
        return read, self._held_by_others(shards, summaries)

    def _read_per_shard(
        self, shards: Sequence[int], count: int, block_ms: int
    ) -> tuple[dict[int, list[Entry]], list[int]]:
        """`read_new_checked` on a Redis Cluster, where one XREADGROUP cannot span shards
        (their streams sit in different hash slots). One pipeline reads every shard
        without blocking, each read followed by its shard's pending summary (a node runs
        its part of the pipeline in order, and a shard's two commands go to the same
        node, so the order argument above holds per shard); the nodes are read in
        parallel. When nothing came, a blocking read waits on one shard, a different one
        each time, for at most CLUSTER_BLOCK_MS: new entries of the others wait that long
        at most, and an idle ingest does not spin.
        """
        read, held = self._read_shards(shards, count, None)
        if any(read.values()) or not shards:
            return read, held
        shard = shards[self._turn % len(shards)]
        self._turn += 1
        again, held_now = self._read_shards([shard], count, min(block_ms, CLUSTER_BLOCK_MS))
        return again, sorted(set(held) | set(held_now))

    def _read_shards(
        self, shards: Sequence[int], count: int, block_ms: int | None
    ) -> tuple[dict[int, list[Entry]], list[int]]:
        pipe = self.redis.pipeline(transaction=False)
        for shard in shards:
            stream = keys.stream(shard)
            pipe.xreadgroup(keys.INGEST_GROUP, self.consumer, {stream: ">"}, count, block_ms)
            pipe.xpending(stream, keys.INGEST_GROUP)
        replies = pipe.execute()
        read = {
            shard: _decode_entries(reply[0][1]) if reply else []
            for shard, reply in zip(shards, replies[0::2], strict=True)
        }
        return read, self._held_by_others(shards, replies[1::2])

    def _held_by_others(self, shards: Sequence[int], summaries: Sequence[Any]) -> list[int]:
        out = []
        for shard, summary in zip(shards, summaries, strict=True):
            names = {_s(c["name"]) for c in summary.get("consumers") or []}
            if names - {self.consumer}:
                out.append(shard)
        return out

    def read_own_pending(self, shard: int) -> list[Entry]:
        """Our unacknowledged entries, re-delivered: counts as a delivery (after a restart)."""
        entries: list[Entry] = []
        gone: list[str] = []
        after = "0"
        while True:
            reply = self.redis.xreadgroup(
                keys.INGEST_GROUP, self.consumer, {keys.stream(shard): after}, count=PAGE
            )
            raw = reply[0][1] if reply else []
            page = _decode_entries(raw, gone)
            entries += page
            if len(raw) < PAGE:
                self.ack(shard, gone)
                return entries
            after = _s(raw[-1][0])

    def reload_own_pending(self, shard: int) -> list[Entry]:
        """Our unacknowledged entries, re-read without counting a delivery (after an outage)."""
        ids = [_s(r["message_id"]) for r in self._pending(shard, self.consumer)]
        pipe = self.redis.pipeline(transaction=False)
        for entry_id in ids:
            pipe.xrange(keys.stream(shard), entry_id, entry_id, count=1)
        entries = [e for reply in pipe.execute() for e in _decode_entries(reply)]
        found = {entry_id for entry_id, _ in entries}
        self.ack(shard, [i for i in ids if i not in found])  # deleted while pending
        return entries

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
            gone: list[str] = []
            for i in range(0, len(ids), PAGE):
                reply = self.redis.xclaim(
                    stream, keys.INGEST_GROUP, self.consumer, 0, ids[i : i + PAGE]
                )
                claimed += _decode_entries(reply, gone)
            self.ack(shard, gone)
            # Redis 6 refuses it when full: the empty consumer is forgotten next time.
            try:
                self.redis.xgroup_delconsumer(stream, keys.INGEST_GROUP, name)
            except redis.ResponseError as e:
                if not is_full(e):
                    raise
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
    def mark_inflight(self, shard: int, first: str | None, last: str | None = None) -> None:
        """Record the entries (`first` to `last`) being processed right now; None clears."""
        if first is None:
            self.redis.delete(keys.inflight(shard))
            return
        value = first if last in (None, first) else f"{first} {last}"
        try:
            self._eval(_SET, [keys.inflight(shard)], [value])
        except redis.ResponseError as e:
            if not is_full(e):
                raise
            # Redis 6 when full: without the marker, an entry that kills ingest is found
            # by its delivery count alone (several share the blame until it is caught).
            log.warning("crash marker not written: Redis is full", shard=shard)

    def inflight(self, shard: int) -> tuple[str, str] | None:
        """The entries a previous owner was processing when it died, as (first, last)."""
        value = self.redis.get(keys.inflight(shard))
        if value is None:
            return None
        first, _, last = _s(value).partition(" ")
        return first, last or first

    # -- run records, for `contextlog status` -----------------------------------------------
    def record_start(self, now_ms: int) -> None:
        """Note that this consumer started; a clean stop takes the note back, so notes left
        by consumers that are no longer live are exits nobody saw: crashes."""
        self._start = f"start|{self.consumer}|{now_ms}"
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(keys.RUNS, {self._start: now_ms})
        pipe.zremrangebyscore(keys.RUNS, "-inf", now_ms - RUNS_KEPT_MS)
        pipe.execute()

    def record_stop(self) -> None:
        """Take back this run's start note: it ended cleanly."""
        if self._start is not None:
            self.redis.zrem(keys.RUNS, self._start)

    def record_down(self, dependency: str, since_ms: int, error: str) -> None:
        """Note that this consumer cannot use `dependency` (postgres, redis) since then."""
        self.redis.hset(keys.DOWN, self.consumer, f"{dependency}|{since_ms}|{error[:300]}")

    def record_up(self) -> None:
        """Take the note back: everything works again."""
        self.redis.hdel(keys.DOWN, self.consumer)

    def record_crash(self, now_ms: int, error: str) -> None:
        """Note a crash that ingest survived in-process (the entries in hand are retried)."""
        member = f"crash|{self.consumer}|{now_ms}|{error[:300]}"
        self.redis.zadd(keys.RUNS, {member: now_ms})

    # -- acknowledging ----------------------------------------------------------------
    def ack(self, shard: int, entry_ids: Sequence[str]) -> None:
        """Acknowledge entries whose events are committed."""
        if entry_ids:
            self.redis.xack(keys.stream(shard), keys.INGEST_GROUP, *entry_ids)

    def dead_letter(self, shard: int, rejected: Sequence[Rejected]) -> None:
        """Move entries to the shard's dead-letter stream with their reason, counted,
        atomically with their XACK: every key is in the shard's slot, so the MULTI holds
        on a Redis Cluster too, and a crash cannot leave a letter twice or uncounted."""
        pipe = self.redis.pipeline(transaction=True)
        for r in rejected:
            pipe.xadd(
                keys.dead_letters(shard),
                dead_letter_fields(shard, r),
                maxlen=DEAD_LETTER_CAP,
                approximate=True,
            )
            pipe.hincrby(keys.stats(shard), f"dead:{r.reason}", 1)
        pipe.xack(keys.stream(shard), keys.INGEST_GROUP, *[r.entry_id for r in rejected])
        try:
            pipe.execute()
        except redis.exceptions.OutOfMemoryError:  # refused whole (EXECABORT)
            self._eval(_DEAD_LETTER, _letter_keys(shard), _letter_args(shard, rejected))

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


def eval_even_full(
    client: Any, script: str, script_keys: Sequence[str], args: Sequence[Any]
) -> Any:
    """EVAL `script`; on a full Redis, again as `allow-oom` (see ALLOW_OOM). A plain EVAL
    with the text: scripts are a few dozen bytes, and a replica a failover promoted, or a
    Redis restarted, has none loaded."""
    try:
        return client.eval(script, len(script_keys), *script_keys, *args)
    except redis.ResponseError as full:
        if not is_full(full):
            raise
        try:
            return client.eval(ALLOW_OOM + script, len(script_keys), *script_keys, *args)
        except redis.ResponseError as e:
            if _no_script_flags(e):
                raise full from None  # Redis 6: wait for memory
            raise


_SET_ABSENT: Final = "return redis.call('SET', KEYS[1], ARGV[1], 'NX')"


def set_absent(client: Any, key: str, value: Any) -> None:
    """SET NX, also on a full Redis (7.0+): a start-up note of a few bytes."""
    eval_even_full(client, _SET_ABSENT, [key], [value])


def _letter_keys(shard: int) -> list[str]:
    return [keys.dead_letters(shard), keys.stats(shard), keys.stream(shard)]


def _letter_args(shard: int, rejected: Sequence[Rejected]) -> list[Any]:
    """`_DEAD_LETTER`'s arguments: what `dead_letter`'s MULTI sends."""
    args: list[Any] = [keys.INGEST_GROUP, DEAD_LETTER_CAP]
    for r in rejected:
        fields = dead_letter_fields(shard, r)
        args += [r.entry_id, r.reason, len(fields)]
        for name, value in fields.items():
            args += [name, value]
    return args


def is_full(error: BaseException) -> bool:
    """Whether Redis refused a command for want of memory (Redis 6 reports a script's
    refusal as a script error carrying the OOM reply)."""
    return isinstance(error, redis.exceptions.OutOfMemoryError) or (
        isinstance(error, redis.ResponseError) and "OOM command not allowed" in str(error)
    )


def _no_script_flags(error: redis.ResponseError) -> bool:
    """Whether Redis refused a script for its `#!lua` line: a Redis older than 7.0."""
    text = str(error)
    return "shebang" in text or "compiling script" in text


def dead_letter_fields(shard: int, r: Rejected) -> dict[str | bytes, bytes | str | int]:
    """The fields of a dead letter: why, where from, and the original fields."""
    out: dict[str | bytes, bytes | str | int] = {
        "reason": r.reason,
        "detail": r.detail[:2000],
        "stream": keys.stream(shard),
        "entry_id": r.entry_id,
    }
    whole = sum(len(k) + len(v) for k, v in r.fields.items()) <= ORIG_WHOLE_BYTES
    for name, value in r.fields.items():
        if whole or len(value) <= ORIG_PREFIX:
            out[b"orig:" + name] = value
        else:
            out[b"orig:" + name] = value[:ORIG_PREFIX]
            out[b"orig_bytes:" + name] = len(value)
    return out


class Down(NamedTuple):
    """A live ingest consumer that cannot use one of its servers."""

    consumer: str
    dependency: str
    since_ms: int
    error: str


def outages(client: redis.Redis, live: Iterable[str]) -> list[Down]:
    """What the live consumers among `live` said they cannot reach (`record_down`)."""
    notes: Any = client.hgetall(keys.DOWN)
    alive = set(live)
    out = []
    for consumer, note in sorted((_s(c), _s(n)) for c, n in notes.items()):
        dependency, since, error = [*note.split("|", 2), "", ""][:3]
        if consumer in alive and since.isdigit():
            out.append(Down(consumer, dependency, int(since), error))
    return out


class Failure(NamedTuple):
    """An ingest run that crashed: in-process (with its error) or an exit nobody saw."""

    consumer: str
    at_ms: int
    error: str


def recent_failures(client: redis.Redis, live: Iterable[str], since_ms: int) -> list[Failure]:
    """Crashes of ingest consumers since `since_ms`: in-process crash notes, and start
    notes not taken back by a clean stop, except each live consumer's latest start."""
    rows: Any = client.zrangebyscore(keys.RUNS, since_ms, "+inf")
    starts: dict[str, list[int]] = {}
    out: list[Failure] = []
    for raw in rows:
        kind, consumer, at_text, *rest = _s(raw).split("|", 3)
        if kind == "crash":
            out.append(Failure(consumer, int(at_text), rest[0] if rest else ""))
        else:
            starts.setdefault(consumer, []).append(int(at_text))
    alive = set(live)
    for consumer, times in starts.items():
        times.sort()
        for at in times[:-1] if consumer in alive else times:
            out.append(Failure(consumer, at, "exited without a clean stop"))
    return sorted(out, key=lambda f: f.at_ms)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def id_key(entry_id: str) -> tuple[int, int]:
    """Sort key of a stream entry id: (milliseconds, sequence)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def entry_time_ms(entry_id: str) -> int:
    """The Unix milliseconds a stream entry id was created at."""
    return id_key(entry_id)[0]
