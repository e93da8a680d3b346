"""How an accepted entry becomes an `events` row: its COPY line, what the projections
need of it, and its stored token count."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from contextlog.producers.context import estimate_tokens
from contextlog.schema import blocks
from contextlog.schema import events as ev
from contextlog.worker import projection

if TYPE_CHECKING:
    from contextlog.worker.eventlog import Accepted


def _copy_bytes(value: bytes) -> bytes:
    """Escape a value for COPY's text format (backslash, tab, newline, carriage return)."""
    if b"\\" in value or b"\t" in value or b"\n" in value or b"\r" in value:
        value = value.replace(b"\\", b"\\\\").replace(b"\t", b"\\t")
        value = value.replace(b"\n", b"\\n").replace(b"\r", b"\\r")
    return value


def _copy_str(value: str) -> str:
    """`_copy_bytes` for a name. Names hold no control characters (`codec.decode`), so
    the usual name needs one look at it; an old or unchecked one is still escaped."""
    if "\\" in value or not value.isprintable():
        value = value.replace("\\", "\\\\").replace("\t", "\\t")
        value = value.replace("\n", "\\n").replace("\r", "\\r")
    return value


class Totals:
    """Each thread's running token total and latest message time as a batch's rows are
    written, from the threads' before it (`Applied.totals`): a message's `through` and
    `late` (migration 009)."""

    __slots__ = ("_threads",)

    def __init__(
        self, before: Mapping[projection.ThreadKey, tuple[int, dt.datetime | None]]
    ) -> None:
        self._threads = dict(before)

    def fields(self, row: projection.Row) -> str:
        """The row's `through` and `late` in COPY text (a command: NULL and false)."""
        if row.kind != projection.MESSAGE:
            return "\\N\tf"
        key = (row.agent, row.channel, row.thread)
        # Every thread of the batch is in `advance_threads`' answer: a KeyError is a bug.
        through, latest = self._threads[key]
        through += row.tokens
        if latest is not None and row.occurred_at < latest:
            self._threads[key] = (through, latest)
            return f"{through}\tt"
        self._threads[key] = (through, row.occurred_at)
        return f"{through}\tf"


def copy_line(a: Accepted, row: projection.Row, seq: int, totals: Totals) -> bytes:
    """One `copy_events` row in COPY text format: the entry's event as `row_of` read it.

    Formatted as one string, encoded once, with the entry's bytes (already JSON)
    appended: an encode and an escape call per field were a fifth of ingest's CPU time.
    The event id goes as 32 hex digits (`uuid` input takes them), cheaper than its
    hyphenated form.
    """
    head = (
        f"{a.event.event_id.hex}\t{_copy_str(row.agent)}\t{_copy_str(row.channel)}\t"
        f"{_copy_str(row.thread)}\t{seq}\t{row.kind}\t{row.occurred_at.isoformat()}\t"
        f"{row.tokens}\t{totals.fields(row)}\t"
    )
    return b"".join((head.encode(), _copy_bytes(a.payload), b"\n"))


def insert_params(
    batch: Sequence[Accepted], rows: Sequence[projection.Row]
) -> dict[str, list[Any]]:
    """The `insert_events` parameters: the rows `copy_line` would write, as columns, in
    the order given (the query numbers them in that order)."""
    return {
        "ids": [a.event.event_id for a in batch],
        "agents": [r.agent for r in rows],
        "channels": [r.channel for r in rows],
        "threads": [r.thread for r in rows],
        "kinds": [r.kind for r in rows],
        "times": [a.event.occurred_at for a in batch],
        "tokens": [r.tokens for r in rows],
        "payloads": [a.payload.decode() for a in batch],
    }


def guard_key(event: ev.AnyEvent) -> tuple[uuid.UUID, str, str]:
    """What makes an event the same event: its id within its conversation (the key of
    the `events_event_id_key` guard, which must hold the partition key, 007)."""
    return (event.event_id, event.agent, event.channel)


def unique(batch: Sequence[Accepted]) -> list[Accepted]:
    """The batch without events repeated within it, first occurrence kept, in order."""
    seen: set[tuple[uuid.UUID, str, str]] = set()
    out = []
    for a in batch:
        if (key := guard_key(a.event)) not in seen:
            seen.add(key)
            out.append(a)
    return out


def row_of(event: ev.AnyEvent) -> projection.Row:
    """What the projections need of an event."""
    settings = None
    if isinstance(event, ev.Configured):
        settings = {k: v for k in projection.SETTINGS if (v := getattr(event, k)) is not None}
    return projection.Row(
        event.agent,
        event.channel,
        event.thread or "",
        ev.TAGS[type(event)],  # `kind_of`, without a call: this runs for every event
        event.occurred_at,
        settings,
        tokens_of(event),
        event.source,
    )



def tokens_of(event: ev.AnyEvent) -> int:
    """The token estimate stored with a message (0 for commands): the same count as the
    context's (`estimate_tokens`), on the blocks as posted."""
    if not isinstance(event, ev.MESSAGES):
        return 0
    if isinstance(event.content, str):
        return estimate_tokens(event.content)
    return estimate_tokens(blocks.decode_raw(event.content))
