"""How an accepted entry becomes an `events` row: its COPY line, what the projections
need of it, and its stored token count."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from contextlog.producers.context import clean_start, estimate_tokens
from contextlog.schema import blocks
from contextlog.schema import events as ev
from contextlog.worker.store import projection
from contextlog.worker.store.batch import Accepted

_encode_json: Final = msgspec.json.Encoder().encode


def _copy_bytes(value: bytes) -> bytes:
    """Escape a value for COPY's text format (backslash, tab, newline, carriage return).
    Looked for with `find`: four `in` tests cost twice as much a payload."""
    if (
        value.find(b"\\") >= 0
        or value.find(b"\t") >= 0
        or value.find(b"\n") >= 0
        or value.find(b"\r") >= 0
    ):
        value = value.replace(b"\\", b"\\\\").replace(b"\t", b"\\t")
        value = value.replace(b"\n", b"\\n").replace(b"\r", b"\\r")
    return value


def _time(at: dt.datetime) -> str:
    """A time in COPY text: ISO 8601 as msgspec writes it ("Z" for UTC, which Postgres
    reads), a tenth of the cost of `isoformat`."""
    return _encode_json(at)[1:-1].decode()


def _copy_str(value: str) -> str:
    """`_copy_bytes` for a name. Names hold no control characters (`codec.decode`), so
    the usual name needs one look at it; an old or unchecked one is still escaped."""
    if "\\" in value or not value.isprintable():
        value = value.replace("\\", "\\\\").replace("\t", "\\t")
        value = value.replace("\n", "\\n").replace("\r", "\\r")
    return value


class CopyText:
    """A round's rows in COPY text format (`copy_events`): each numbered from its
    conversation's last seq before the round (`Applied.bases`) and stamped with the
    round's recorded time of its conversation (`Applied.times`), and a message given its
    thread's running token total (`through`, migration 009) from the threads' before the
    round (`Applied.totals`); `late` is false (nothing reads it since 014).

    A thread's names are escaped once a round, not once a row: formatting the rows was a
    fifth of ingest's Python time."""

    __slots__ = ("_next_seq", "_parts", "_threads", "_times")

    def __init__(
        self,
        bases: Mapping[tuple[str, str], int],
        before: Mapping[projection.ThreadKey, tuple[int, dt.datetime | None]],
        times: Mapping[tuple[str, str], dt.datetime],
    ) -> None:
        self._next_seq = {conv: base + 1 for conv, base in bases.items()}
        self._times = {conv: _time(at) for conv, at in times.items()}
        # thread -> [its names in COPY text, running total]; every thread of a round's
        # messages is in `advance_threads`' answer (a KeyError is a bug)
        self._threads: dict[projection.ThreadKey, list[Any]] = {
            key: [None, through] for key, (through, _latest) in before.items()
        }
        self._parts: list[bytes] = []

    def add(self, a: Accepted, row: projection.Row) -> int:
        """Append the entry's row (its event as `row_of` read it); returns its seq."""
        conv = (row.agent, row.channel)
        seq = self._next_seq[conv]
        self._next_seq[conv] = seq + 1
        if row.kind != projection.MESSAGE:  # a command: no running total
            names, totals = _names(row), "\\N\tf"
        else:
            thread = self._threads[(row.agent, row.channel, row.thread)]
            if thread[0] is None:
                thread[0] = _names(row)
            thread[1] += row.tokens
            names, totals = thread[0], f"{thread[1]}\tf"
        mark = _MARKS[row.mark]
        # The event id as 32 hex digits (`uuid` input takes them), cheaper than its
        # hyphenated form; the entry's bytes (already JSON) go as they came, escaped.
        head = (
            f"{a.event.event_id.hex}\t{names}{seq}\t{row.kind}\t"
            f"{_time(a.event.occurred_at)}\t{row.tokens}\t{totals}\t{mark}\t"
            f"{self._times[conv]}\t"
        )
        self._parts += (head.encode(), _copy_bytes(a.payload), b"\n")
        return seq

    def text(self) -> bytes:
        """The rows added so far, one write's worth (psycopg's per-row adaptation was a
        third of ingest's CPU time)."""
        return b"".join(self._parts)


def _names(row: projection.Row) -> str:
    """The row's agent, channel and thread columns in COPY text, each followed by a tab."""
    return f"{_copy_str(row.agent)}\t{_copy_str(row.channel)}\t{_copy_str(row.thread)}\t"


def insert_params(
    batch: Sequence[Accepted], rows: Sequence[projection.Row]
) -> dict[str, list[Any]]:
    """The rows `CopyText` would write, as columns, in the order given (the rows'
    statement, `contextlog_insert_events` of 012, numbers them in that order)."""
    return {
        "ids": [a.event.event_id for a in batch],
        "agents": [r.agent for r in rows],
        "channels": [r.channel for r in rows],
        "threads": [r.thread for r in rows],
        "kinds": [r.kind for r in rows],
        "times": [a.event.occurred_at for a in batch],
        "tokens": [r.tokens for r in rows],
        "payloads": [a.payload.decode() for a in batch],
        "marks": [r.mark or None for r in rows],
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


_MARKS: Final = {0: "\\N", projection.OPENS: "1", projection.COMPACTS: "2"}


def row_of(event: ev.AnyEvent, at: dt.datetime) -> projection.Row:
    """What the projections need of an event logged at `at` (ingest's clock)."""
    settings = None
    if isinstance(event, ev.Configured):
        settings = {k: v for k in projection.SETTINGS if (v := getattr(event, k)) is not None}
    return projection.Row(
        event.agent,
        event.channel,
        event.thread or "",
        ev.TAGS[type(event)],  # `kind_of`, without a call: this runs for every event
        at,
        settings,
        tokens_of(event),
        event.source,
        mark_of(event),
    )


def mark_of(event: ev.AnyEvent) -> int:
    """Where a boundary may fall (`projection.OPENS`, `COMPACTS`), or 0."""
    if not isinstance(event, ev.MessagePosted):
        return 0
    if event.role == "user":
        content = event.content
        plain = content if isinstance(content, str) else blocks.decode_raw(content)
        return projection.OPENS if clean_start("user", plain) else 0
    if event.role == "assistant" and not isinstance(event.content, str):
        raw = event.content
        if any(b'"compaction"' in bytes(b) for b in raw) and blocks.starts_anew(
            blocks.decode_raw(raw)
        ):
            return projection.COMPACTS
    return 0


def tokens_of(event: ev.AnyEvent) -> int:
    """The token estimate stored with a message (0 for commands): the same count as the
    context's (`estimate_tokens`), on the blocks as posted."""
    if not isinstance(event, ev.MESSAGES):
        return 0
    if isinstance(event.content, str):
        return estimate_tokens(event.content)
    return estimate_tokens(blocks.decode_raw(event.content))
