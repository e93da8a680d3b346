"""Publishing notices to the adapters' outbound streams (`contextlog:out:{source}`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

import redis

from contextlog.producers.connection import SyncClient
from contextlog.schema import keys
from contextlog.schema.errors import Unavailable
from contextlog.schema.notices import ENTRY_FIELD, Notice, encode

# A stream nobody reads (an adapter that was retired) must not grow without bound.
DEFAULT_MAXLEN: Final = 100_000


class Notifier(Protocol):
    """Where the worker sends notices: each pair is (adapter source, notice)."""

    def publish(self, notices: Sequence[tuple[str, Notice]]) -> None: ...


class RedisNotifier:
    """XADDs notices to each source's outbox stream, capped near `maxlen` entries."""

    def __init__(self, client: SyncClient, maxlen: int = DEFAULT_MAXLEN) -> None:
        self.redis = client
        self.maxlen = maxlen

    def publish(self, notices: Sequence[tuple[str, Notice]]) -> None:
        """Send all notices in one round trip; all are encoded (and checked) first."""
        if not notices:
            return
        entries = [(keys.outbox(source), encode(notice)) for source, notice in notices]
        try:
            pipe = self.redis.pipeline(transaction=False)
            for stream, payload in entries:
                # Approximate trimming lets Redis drop whole nodes: O(1) instead of exact.
                pipe.xadd(stream, {ENTRY_FIELD: payload}, maxlen=self.maxlen, approximate=True)
            pipe.execute()
        except redis.RedisError as e:
            raise Unavailable(f"could not publish notifications to Redis: {e}") from e


class MemoryNotifier:
    """A fake for unit tests: records what was published, in order."""

    def __init__(self) -> None:
        self.published: list[tuple[str, Notice]] = []

    def publish(self, notices: Sequence[tuple[str, Notice]]) -> None:
        """Record the notices."""
        self.published.extend(notices)

    def of(self, source: str) -> list[Notice]:
        """The notices published for one adapter."""
        return [n for s, n in self.published if s == source]
