"""What ingest hands the event log: an accepted entry, and the log's interface (the
Postgres log in store/eventlog.py, the in-memory one of the unit tests). Its own module,
so that the stages that prepare a batch (ingest/attachments.py, store/rows.py) and the
log that stores it import it without importing each other."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final, NamedTuple, Protocol

from contextlog.schema import events as ev

_NO_BLOBS: Final[Mapping[str, bytes]] = MappingProxyType({})


class Accepted(NamedTuple):
    """A decoded entry waiting to be appended: its stream id, event and original JSON.

    A named tuple, not a frozen dataclass: one is made per entry, and a frozen dataclass
    costs twice as much to make (its __init__ sets each field through object.__setattr__).
    """

    entry_id: str
    event: ev.AnyEvent
    payload: bytes
    # Attachment bytes (by sha256) to store with the event: set by `attachments.resolve`.
    blobs: Mapping[str, bytes] = _NO_BLOBS


class EventLog(Protocol):
    """Where ingest appends: Postgres in production, memory in unit tests."""

    def append(self, shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        """Store a batch atomically and idempotently; returns how many events were new.

        Raises `Fenced` when a newer lease epoch already wrote this shard, `Conflict`
        when another writer stored some of the events meanwhile, `StorageRefused` when
        the data is refused, `Unavailable` when the store cannot be reached.
        """
        ...

    def epochs(self) -> dict[int, int]:
        """The last committed lease epoch of each shard."""
        ...

    def flush_effects(self, older_than: float = 30.0, limit: int = 500) -> int:
        """Send the effects of committed batches that were not sent; returns how many."""
        ...

    def stored_attachments(self, hashes: Sequence[str]) -> set[str]:
        """Which of these attachment hashes (sha256, hex) are stored."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...
