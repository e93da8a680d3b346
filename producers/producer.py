"""Push events onto the sharded inbound streams, from a sync or an asyncio adapter."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final

import redis

from contextlog.producers import connection
from contextlog.producers.commands import Batch, Commands, Encoder, Prepared, utcnow
from contextlog.schema import attachments, codec, erasure, keys, signing
from contextlog.schema import events as ev
from contextlog.schema.errors import EventRejected, PushUncertain, Unavailable


def _one_shard(prepared: list[Prepared]) -> None:
    """Refuse an atomic send over several shards on a Redis Cluster: their streams are in
    different hash slots, which no MULTI can span. Splitting it quietly would break the
    all-or-none promise, so the caller decides (one `push_many` per conversation)."""
    streams = sorted({p.stream for p in prepared})
    if len(streams) > 1:
        raise ValueError(
            f"push_many(atomic=True) on a Redis Cluster needs events of one shard, these "
            f"go to {', '.join(streams)}: send each conversation's events in its own call"
        )


def _has_blobs(prepared: list[Prepared]) -> bool:
    """Whether any entry brings attachment bytes to store beside it."""
    return any(p.blobs for p in prepared)


def _with_blobs(prepared: list[Prepared]) -> bool:
    """Whether to send in one MULTI: entries with attachments on one shard (the usual
    message) get their bytes and the entry atomically. Keys of several shards cannot share
    a MULTI under Redis Cluster; there the order (bytes first) still holds per entry."""
    return _has_blobs(prepared) and len({p.stream for p in prepared}) == 1


# One stream's entries of a send, XADDed by one script call: redis-py builds, sends and
# parses each pipelined XADD in Python (~7 us an entry here, most of a batch's CPU); the
# script is one command and one integer reply for up to SCRIPT_CHUNK entries, and Redis
# spends ~1 us more an entry running it. EVAL, not EVALSHA: Redis keeps the compiled
# script by its hash, so nothing needs loading first (after a restart or a failover
# either), and its one key routes it to the stream's node on a Redis Cluster.
XADD_MANY: Final = """
for i = 2, #ARGV do redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[i]) end
return #ARGV - 1
"""
SCRIPT_MIN: Final = 4  # fewer entries of a stream go as plain XADDs
SCRIPT_CHUNK: Final = 1000  # entries a script call adds: Redis serves no one else meanwhile


def _queue(pipe: Any, prepared: list[Prepared], ttl_s: int) -> None:
    """Each entry's attachment bytes, then its XADD. Not NX: the key names its content,
    so an overwrite changes no byte, and it restarts the TTL for this entry's sake (an
    older entry's key might expire before ingest reaches this one). Without attachments,
    a stream's entries in call order, `SCRIPT_MIN` or more of them by `XADD_MANY`: only
    each stream's order matters (ingest reads each on its own)."""
    if _has_blobs(prepared) or any(p.signature for p in prepared):
        for p in prepared:
            for key, data in p.blobs:
                pipe.set(key, data, ex=ttl_s)
            pipe.xadd(p.stream, _fields(p))
        return
    streams: dict[str, list[bytes]] = {}
    for p in prepared:
        streams.setdefault(p.stream, []).append(p.payload)
    for stream, payloads in streams.items():
        if len(payloads) < SCRIPT_MIN:
            for payload in payloads:
                pipe.xadd(stream, {codec.ENTRY_FIELD: payload})
            continue
        for i in range(0, len(payloads), SCRIPT_CHUNK):
            # As a command: a cluster pipeline's `eval` is not EVAL.
            chunk = payloads[i : i + SCRIPT_CHUNK]
            pipe.execute_command("EVAL", XADD_MANY, 1, stream, codec.ENTRY_FIELD, *chunk)


def _fields(p: Prepared) -> dict[bytes, bytes]:
    """An entry's fields: the event, and a worker's signature of it."""
    if p.signature is None:
        return {codec.ENTRY_FIELD: p.payload}
    return {codec.ENTRY_FIELD: p.payload, signing.SIGNATURE_FIELD: p.signature}


# The connection broke or timed out: if it happened after sending, Redis may have acted.
_LOST: Final = (redis.ConnectionError, redis.TimeoutError)


def _sent(error: BaseException) -> bool:
    """Whether a lost connection may have carried the request: not if it never connected
    (redis-py says "Error 111 connecting to ...", "Timeout connecting to server")."""
    return "connecting to" not in str(error)


def _refused(error: redis.RedisError) -> Unavailable:
    """Redis refused the whole push: nothing of it was stored."""
    if isinstance(error, redis.exceptions.OutOfMemoryError):
        return Unavailable(
            f"Redis is full (at its maxmemory, it refuses new entries): nothing of this push "
            f"was stored; retry once ingest has drained the streams, or raise maxmemory "
            f"({error})"
        )
    return Unavailable(f"could not push to Redis (nothing of it was stored): {error}")


def _uncertain(prepared: list[Prepared], why: str) -> PushUncertain:
    return PushUncertain(
        f"Redis may have stored this push ({why}): retry with producer.resend(error), which "
        f"sends the same {len(prepared)} events again (stored once), not the calls again",
        [p.event_id for p in prepared],
        tuple(prepared),
    )


def _outcome(prepared: list[Prepared], replies: list[Any]) -> None:
    """Raise if Redis refused some or all of a pipeline (`execute(raise_on_error=False)`):
    all refused, nothing was stored; some, the others were."""
    errors = [r for r in replies if isinstance(r, redis.RedisError)]
    if not errors:
        return
    if len(errors) == len(replies):
        raise _refused(errors[0]) from errors[0]
    why = f"Redis took {len(replies) - len(errors)} of its {len(replies)} commands: {errors[0]}"
    raise _uncertain(prepared, why) from errors[0]


def _resent(error: PushUncertain) -> list[Prepared]:
    return [p for p in error.entries if isinstance(p, Prepared)]


class _Base:
    def __init__(
        self,
        *,
        shards: int | None = None,
        max_entry_bytes: int = codec.DEFAULT_MAX_ENTRY_BYTES,
        clock: Callable[[], dt.datetime] = utcnow,
        attachment_limits: attachments.Limits | None = None,
        signing_key: signing.Key | None = None,
    ) -> None:
        # The one place the producers package reads the environment: the design says the
        # shard count comes from CONTEXTLOG_SHARDS unless the caller passes it; the
        # attachment limits likewise. `signing_key`: the worker's (it may emit results).
        count = keys.shards_from_env(os.environ) if shards is None else shards
        limits = attachment_limits or attachments.Limits.from_env(os.environ)
        self.encoder = Encoder(count, max_entry_bytes, limits, signing_key)
        self.clock = clock
        self._shards_checked = False

    def _new_batch(self) -> Batch:
        return Batch(self.encoder, self.clock)

    def _erase_events(
        self,
        agent: str,
        channel: str | None,
        sender: str | None,
        session_id: str | None,
        source: str | None,
    ) -> list[ev.EraseRequested]:
        try:
            return erasure.request(
                agent,
                shards=self.encoder.shards,
                now=self.clock(),
                channel=channel,
                sender=sender,
                session_id=session_id,
                source=source,
            )
        except ValueError as e:
            raise EventRejected(codec.INVALID, f"erase: {e}") from None


class Producer(_Base, Commands[str]):
    """Synchronous producer: every call is one XADD and returns the event id."""

    def __init__(self, client: connection.SyncClient, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.redis = client

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Producer:
        """A producer on the Redis at `url` (the database number in the URL is honoured),
        or on the Redis Cluster of a `redis+cluster://` URL."""
        return cls(connection.connect(url), **kwargs)

    def _send(self, event: ev.Event) -> str:
        return self.send_prepared([self.encoder.prepare(event)])[0]

    def push_many(self, events: Iterable[ev.Event], *, atomic: bool = False) -> list[str]:
        """Send many events in one pipeline; returns their ids in order. `atomic`: all or
        none are added (MULTI; the events must share one shard, as one conversation's do:
        a Redis Cluster refuses a MULTI over several, and so does this method there)."""
        return self.send_prepared([self.encoder.prepare(e) for e in events], atomic=atomic)

    @contextmanager
    def batch(self) -> Iterator[Batch]:
        """Collect calls and send them in one pipeline when the block ends without error."""
        b = self._new_batch()
        yield b
        self.send_prepared(b.prepared)

    def send_prepared(self, prepared: list[Prepared], *, atomic: bool = False) -> list[str]:
        """XADD already-checked entries in one round trip. `Unavailable` when nothing was
        stored (Redis down, or full); `PushUncertain` when some may have been (retry with
        `resend`). An answer lost after sending is retried once, with the same entries."""
        if atomic and connection.is_cluster(self.redis):
            _one_shard(prepared)
        try:
            if not self._shards_checked:
                keys.check_shards(self.redis.get(keys.SHARDS_KEY), self.encoder.shards)
                self._shards_checked = True
            try:
                replies = self._execute(prepared, atomic)
            except _LOST as lost:
                if not _sent(lost):
                    raise
                replies = self._again(prepared, atomic, lost)
        except redis.RedisError as e:
            raise _refused(e) from e
        _outcome(prepared, replies)
        return [p.event_id for p in prepared]

    def resend(self, error: PushUncertain) -> list[str]:
        """Send again the entries of a push that may have been stored (same event ids)."""
        return self.send_prepared(_resent(error))

    def _execute(self, prepared: list[Prepared], atomic: bool) -> list[Any]:
        pipe = self.redis.pipeline(transaction=atomic or _with_blobs(prepared))
        _queue(pipe, prepared, self.encoder.limits.ttl_s)
        return pipe.execute(raise_on_error=False)

    def _again(self, prepared: list[Prepared], atomic: bool, lost: Exception) -> list[Any]:
        """Redis may have acted on the push and its answer was lost: send the same entries
        once more (the same event ids, which ingest stores once)."""
        try:
            return self._execute(prepared, atomic)
        except redis.RedisError as e:
            raise _uncertain(prepared, f"its answer was lost: {lost}; and again: {e}") from e

    def erase(
        self,
        agent: str,
        *,
        channel: str | None = None,
        sender: str | None = None,
        session_id: str | None = None,
        source: str | None = None,
    ) -> list[str]:
        """Erase a conversation (`channel`), one session's messages (`channel` and
        `session_id`) or everything of a sender across the agent's conversations
        (`sender`) from the log, its projections, search and Redis: `erase.v1` events
        naming the subject by hash only (one per shard for a sender), applied by ingest in
        order. Returns their ids; `source` hears `erase_done` for each. An operator's
        call (the README's "Erase" says what it reaches and what it cannot)."""
        events = self._erase_events(agent, channel, sender, session_id, source)
        return self.push_many(events)

    def close(self) -> None:
        """Close the Redis connections."""
        self.redis.close()


class AsyncProducer(_Base, Commands[Any]):
    """asyncio producer (discord.py, slack-bolt): `await p.post_message(...)`."""

    def __init__(self, client: connection.AsyncClient, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.redis = client

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AsyncProducer:
        """An async producer on the Redis (or `redis+cluster://` Redis Cluster) at `url`."""
        return cls(connection.connect_async(url), **kwargs)

    async def _send(self, event: ev.Event) -> str:
        return (await self.send_prepared([self.encoder.prepare(event)]))[0]

    async def push_many(self, events: Iterable[ev.Event], *, atomic: bool = False) -> list[str]:
        """`Producer.push_many`, for asyncio."""
        return await self.send_prepared([self.encoder.prepare(e) for e in events], atomic=atomic)

    @asynccontextmanager
    async def batch(self) -> AsyncIterator[Batch]:
        """Collect calls and send them in one pipeline when the block ends without error."""
        b = self._new_batch()
        yield b
        await self.send_prepared(b.prepared)

    async def send_prepared(self, prepared: list[Prepared], *, atomic: bool = False) -> list[str]:
        """`Producer.send_prepared`, for asyncio."""
        if atomic and connection.is_cluster(self.redis):
            _one_shard(prepared)
        try:
            if not self._shards_checked:
                keys.check_shards(await self.redis.get(keys.SHARDS_KEY), self.encoder.shards)
                self._shards_checked = True
            try:
                replies = await self._execute(prepared, atomic)
            except _LOST as lost:
                if not _sent(lost):
                    raise
                replies = await self._again(prepared, atomic, lost)
        except redis.RedisError as e:
            raise _refused(e) from e
        _outcome(prepared, replies)
        return [p.event_id for p in prepared]

    async def resend(self, error: PushUncertain) -> list[str]:
        """`Producer.resend`, for asyncio."""
        return await self.send_prepared(_resent(error))

    async def _execute(self, prepared: list[Prepared], atomic: bool) -> list[Any]:
        pipe = self.redis.pipeline(transaction=atomic or _with_blobs(prepared))
        _queue(pipe, prepared, self.encoder.limits.ttl_s)
        return await pipe.execute(raise_on_error=False)

    async def _again(self, prepared: list[Prepared], atomic: bool, lost: Exception) -> list[Any]:
        """`Producer._again`, for asyncio."""
        try:
            return await self._execute(prepared, atomic)
        except redis.RedisError as e:
            raise _uncertain(prepared, f"its answer was lost: {lost}; and again: {e}") from e

    async def erase(
        self,
        agent: str,
        *,
        channel: str | None = None,
        sender: str | None = None,
        session_id: str | None = None,
        source: str | None = None,
    ) -> list[str]:
        """`Producer.erase`, for asyncio."""
        events = self._erase_events(agent, channel, sender, session_id, source)
        return await self.push_many(events)

    async def aclose(self) -> None:
        """Close the Redis connections."""
        await self.redis.aclose()
