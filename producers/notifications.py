"""Receive an adapter's notifications (`contextlog:out:{source}`) through a consumer group.

Delivery is at least once: a notice is delivered again (to the same consumer name, after a
restart) until it is acknowledged, so handle each one idempotently, keyed by `notice_id`.

    notes = Notifications.from_url(redis_url, "discord", consumer="bot-1")
    for notice in notes:              # blocks; acks each notice once the loop body is done
        ...

or `read()` a batch and `ack()` it when handled. What a consumer left unacknowledged is
delivered again when a consumer of the same name reads: the default name is the host
name, so an adapter restarted on the same host gets it back. Give each of several
processes of one adapter its own stable `consumer=`.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncGenerator, Generator, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

import redis

from contextlog.producers import connection
from contextlog.schema import keys
from contextlog.schema.errors import EventRejected, Unavailable
from contextlog.schema.notices import ENTRY_FIELD, MALFORMED, Notice, decode

# stdlib logging: adapters need no structlog (the worker routes it through structlog).
log = logging.getLogger("contextlog.notifications")

DEFAULT_GROUP: Final = "adapter"
DEFAULT_COUNT: Final = 100
DEFAULT_BLOCK_MS: Final = 1000
_FIELDS: Final = (ENTRY_FIELD.encode(), ENTRY_FIELD)  # bytes replies, or decode_responses

Entry = tuple[str, Mapping[Any, Any]]  # (entry id, fields); no fields: trimmed while pending


def default_consumer() -> str:
    """The default consumer name, the host name: stable across restarts."""
    return socket.gethostname()


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entries(reply: Any) -> list[Entry]:
    """The entries of a one-stream XREADGROUP reply, in any shape redis-py 8 gives it:
    `[[stream, entries]]` (legacy, the default), `{stream: entries}` (legacy_responses=False)
    or `{stream: [entries]}` (protocol=3 with legacy responses)."""
    if not reply:
        return []
    groups = reply.values() if isinstance(reply, dict) else [item[1] for item in reply]
    out: list[Entry] = []
    for group in groups:
        for item in group or []:
            for entry_id, fields in item if isinstance(item, list) else [item]:
                if entry_id is not None:  # a nil entry carries no id to acknowledge
                    out.append((_str(entry_id), fields or {}))
    return out


def _entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id (`ms-seq`) as a sortable pair; anything else sorts first."""
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return -1, -1


def _missing_group(error: redis.ResponseError) -> bool:
    return "NOGROUP" in str(error)


@contextmanager
def _translated(doing: str) -> Iterator[None]:
    try:
        yield
    except redis.RedisError as e:
        raise Unavailable(f"could not {doing} notifications on Redis: {e}") from e


class _Core:
    """What the sync and asyncio consumers share: cursor, decoding, the ack bookkeeping."""

    def __init__(self, source: str, group: str, consumer: str | None) -> None:
        self.source = source
        self.stream = keys.outbox(source)
        self.group = group
        self.consumer = consumer or default_consumer()
        self._group_ready = False
        self._closed = False
        # Where the replay of our own pending entries continues; None once it is done.
        self._after: str | None = "0"
        # notice_id -> entry ids delivered and not yet acked (a notice published twice
        # has two entries, and acking the notice acks both).
        self._unacked: dict[str, set[str]] = {}

    def _advance(self, entries: list[Entry], count: int) -> None:
        """After a replayed page: go on after it, or read new entries once a page is short."""
        self._after = entries[-1][0] if len(entries) >= count else None

    def _rewind(self) -> None:
        """Replay our pending entries on the next read (after `listen` was left)."""
        self._after = "0"

    def _pairs(self, entries: list[Entry]) -> tuple[list[tuple[str, Notice]], list[str]]:
        """The notices among `entries` with their entry ids, and the ids of entries to
        drop (acked unread)."""
        pairs: list[tuple[str, Notice]] = []
        bad: list[str] = []
        for entry_id, fields in entries:
            notice = self._decode(entry_id, fields)
            if notice is None:
                bad.append(entry_id)
                continue
            self._unacked.setdefault(notice.notice_id, set()).add(entry_id)
            pairs.append((entry_id, notice))
        return pairs, bad

    def _through(self, pending: Any, entry_id: str) -> list[str]:
        """The ids of an XPENDING reply (this consumer's) at or before `entry_id`, which
        are forgotten from the bookkeeping."""
        ids = [_str(p["message_id"]) for p in pending]
        done = [i for i in ids if _entry_key(i) <= _entry_key(entry_id)]
        for entries in self._unacked.values():
            entries.difference_update(done)
        return done

    def _decode(self, entry_id: str, fields: Mapping[Any, Any]) -> Notice | None:
        # One bad entry must never stop an adapter: it is logged, acked and skipped.
        data = next((fields[f] for f in _FIELDS if f in fields), None)
        try:
            if data is None:
                raise EventRejected(MALFORMED, "trimmed before it was read, or no 'n' field")
            return decode(data.encode() if isinstance(data, str) else data)
        except EventRejected as e:
            fields = {"stream": self.stream, "entry_id": entry_id, "reason": e.reason}
            log.warning("skipping a bad notification (%s): %s", e.reason, e.detail, extra=fields)
            return None

    def _take(self, notices: Iterable[Notice]) -> list[str]:
        """The entry ids to acknowledge for `notices`, forgotten from the bookkeeping."""
        return [i for n in notices for i in sorted(self._unacked.pop(n.notice_id, ()))]


class Notifications(_Core):
    """Synchronous consumer of one adapter's notifications."""

    def __init__(
        self,
        client: connection.SyncClient,
        source: str,
        *,
        group: str = DEFAULT_GROUP,
        consumer: str | None = None,
    ) -> None:
        super().__init__(source, group, consumer)
        # redis-py types replies as unions over every decode mode; `_entries` handles each.
        self.redis: Any = client

    @classmethod
    def from_url(
        cls,
        redis_url: str,
        source: str,
        *,
        group: str = DEFAULT_GROUP,
        consumer: str | None = None,
    ) -> Notifications:
        """A consumer on the Redis (or Redis Cluster: `redis+cluster://`) at `redis_url`,
        its database number honoured."""
        # No answer timeout: a read blocks as long as its caller asks (`block_ms=0`: for
        # ever); keepalives still drop a connection whose peer is gone (`liveness`).
        client = connection.connect(redis_url, socket_timeout=None)
        return cls(client, source, group=group, consumer=consumer)

    def read(
        self, count: int = DEFAULT_COUNT, block_ms: int | None = DEFAULT_BLOCK_MS
    ) -> list[Notice]:
        """Up to `count` notices: first our own unacknowledged ones, then new ones, waiting
        up to `block_ms` for them (None: do not wait; 0: wait forever). May be empty."""
        return [notice for _, notice in self.read_entries(count, block_ms)]

    def ack(self, notices: Iterable[Notice]) -> int:
        """Acknowledge handled notices so they are not delivered again; returns entries acked."""
        ids = self._take(notices)
        if not ids:
            return 0
        with _translated("acknowledge"):
            return int(self.redis.xack(self.stream, self.group, *ids))

    def read_entries(
        self, count: int = DEFAULT_COUNT, block_ms: int | None = DEFAULT_BLOCK_MS
    ) -> list[tuple[str, Notice]]:
        """`read`, each notice with its stream entry id (ids grow in stream order: a
        resumable stream uses them as positions, see `ack_through`)."""
        with _translated("read"):
            if self._after is not None:
                entries = self._xread(self._after, count, None)
                self._advance(entries, count)
                if entries:
                    return self._keep_pairs(entries)
            return self._keep_pairs(self._xread(">", count, block_ms))

    def ack_through(self, entry_id: str, count: int = 10_000) -> int:
        """Acknowledge this consumer's pending entries up to and including `entry_id`
        (an SSE client's Last-Event-ID); returns entries acked."""
        with _translated("acknowledge"):
            if not self._group_ready:
                self._create_group()
            pending = self.redis.xpending_range(
                self.stream, self.group, "-", entry_id, count, consumername=self.consumer
            )
            done = self._through(pending, entry_id)
            return int(self.redis.xack(self.stream, self.group, *done)) if done else 0

    def listen(self, *, block_ms: int = DEFAULT_BLOCK_MS) -> Generator[Notice, None, None]:
        """Notices one at a time, forever (until `close`); each is acked when the caller
        asks for the next one, so a notice whose handling raised is delivered again."""
        try:
            while not self._closed:
                for notice in self.read(block_ms=block_ms):
                    yield notice
                    self.ack([notice])
        except Unavailable:
            if not self._closed:  # closed from another thread while blocked: just stop
                raise
        finally:
            self._rewind()

    def __iter__(self) -> Generator[Notice, None, None]:
        return self.listen()

    def close(self) -> None:
        """Stop `listen` and close the Redis connections."""
        self._closed = True
        self.redis.close()

    def _keep_pairs(self, entries: list[Entry]) -> list[tuple[str, Notice]]:
        pairs, bad = self._pairs(entries)
        if bad:
            self.redis.xack(self.stream, self.group, *bad)
        return pairs

    def _xread(self, after: str, count: int, block_ms: int | None) -> list[Entry]:
        if not self._group_ready:
            self._create_group()
        args = (self.group, self.consumer, {self.stream: after})
        try:
            return _entries(self.redis.xreadgroup(*args, count=count, block=block_ms))
        except redis.ResponseError as e:
            if not _missing_group(e):
                raise
        # The stream or the group was deleted under us (FLUSHDB, DEL): start it again.
        log.warning("notification group missing, recreating", extra={"stream": self.stream})
        self._create_group()
        return _entries(self.redis.xreadgroup(*args, count=count, block=block_ms))

    def _create_group(self) -> None:
        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        self._group_ready = True


class AsyncNotifications(_Core):
    """asyncio consumer of one adapter's notifications: `async for notice in notes:`."""

    def __init__(
        self,
        client: connection.AsyncClient,
        source: str,
        *,
        group: str = DEFAULT_GROUP,
        consumer: str | None = None,
    ) -> None:
        super().__init__(source, group, consumer)
        self.redis: Any = client

    @classmethod
    def from_url(
        cls,
        redis_url: str,
        source: str,
        *,
        group: str = DEFAULT_GROUP,
        consumer: str | None = None,
    ) -> AsyncNotifications:
        """A consumer on the Redis (or Redis Cluster: `redis+cluster://`) at `redis_url`,
        its database number honoured."""
        client = connection.connect_async(redis_url, socket_timeout=None)  # see Notifications
        return cls(client, source, group=group, consumer=consumer)

    async def read(
        self, count: int = DEFAULT_COUNT, block_ms: int | None = DEFAULT_BLOCK_MS
    ) -> list[Notice]:
        """Up to `count` notices: first our own unacknowledged ones, then new ones, waiting
        up to `block_ms` for them (None: do not wait; 0: wait forever). May be empty."""
        return [notice for _, notice in await self.read_entries(count, block_ms)]

    async def ack(self, notices: Iterable[Notice]) -> int:
        """Acknowledge handled notices so they are not delivered again; returns entries acked."""
        ids = self._take(notices)
        if not ids:
            return 0
        with _translated("acknowledge"):
            return int(await self.redis.xack(self.stream, self.group, *ids))

    async def read_entries(
        self, count: int = DEFAULT_COUNT, block_ms: int | None = DEFAULT_BLOCK_MS
    ) -> list[tuple[str, Notice]]:
        """`Notifications.read_entries`, for asyncio."""
        with _translated("read"):
            if self._after is not None:
                entries = await self._xread(self._after, count, None)
                self._advance(entries, count)
                if entries:
                    return await self._keep_pairs(entries)
            return await self._keep_pairs(await self._xread(">", count, block_ms))

    async def ack_through(self, entry_id: str, count: int = 10_000) -> int:
        """`Notifications.ack_through`, for asyncio."""
        with _translated("acknowledge"):
            if not self._group_ready:
                await self._create_group()
            pending = await self.redis.xpending_range(
                self.stream, self.group, "-", entry_id, count, consumername=self.consumer
            )
            done = self._through(pending, entry_id)
            return int(await self.redis.xack(self.stream, self.group, *done)) if done else 0

    async def listen(self, *, block_ms: int = DEFAULT_BLOCK_MS) -> AsyncGenerator[Notice, None]:
        """Notices one at a time, until `aclose` or cancellation; each is acked when the
        caller asks for the next one, so a notice whose handling raised comes again."""
        try:
            while not self._closed:
                for notice in await self.read(block_ms=block_ms):
                    yield notice
                    await self.ack([notice])
        except Unavailable:
            if not self._closed:  # closed by another task while blocked: just stop
                raise
        finally:
            self._rewind()

    def __aiter__(self) -> AsyncGenerator[Notice, None]:
        return self.listen()

    async def aclose(self) -> None:
        """Stop `listen` and close the Redis connections."""
        self._closed = True
        await self.redis.aclose()

    async def _keep_pairs(self, entries: list[Entry]) -> list[tuple[str, Notice]]:
        pairs, bad = self._pairs(entries)
        if bad:
            await self.redis.xack(self.stream, self.group, *bad)
        return pairs

    async def _xread(self, after: str, count: int, block_ms: int | None) -> list[Entry]:
        if not self._group_ready:
            await self._create_group()
        args = (self.group, self.consumer, {self.stream: after})
        try:
            return _entries(await self.redis.xreadgroup(*args, count=count, block=block_ms))
        except redis.ResponseError as e:
            if not _missing_group(e):
                raise
        log.warning("notification group missing, recreating", extra={"stream": self.stream})
        await self._create_group()
        return _entries(await self.redis.xreadgroup(*args, count=count, block=block_ms))

    async def _create_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        self._group_ready = True
