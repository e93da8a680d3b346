"""What a command handler tells its adapter, and how it reads rows by name: shared by
the handlers of sessions (handlers.py), search, erase and retention."""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg
from psycopg.rows import TupleRow, class_row

from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.worker.effects.kinds import Effect, Notice

Cursor = psycopg.Cursor[TupleRow]
T = TypeVar("T")


def rows_as(cur: Cursor, shape: type[T]) -> psycopg.Cursor[T]:
    """A cursor in `cur`'s transaction whose rows are `shape`s, built by column name (a
    query whose columns stop matching the fields fails, rather than shifting them)."""
    return cur.connection.cursor(row_factory=class_row(shape))


def notice(
    e: ev.Event, kind: str, text: str | None, source: str | None = None, **fields: Any
) -> list[Effect]:
    """A notice about event `e` for its adapter (none if the event named no source)."""
    source = source or e.source
    if source is None:
        return []
    n = nt.Notice(
        notice_id=f"{e.event_id}:{kind}",
        kind=kind,
        agent=e.agent,
        channel=e.channel,
        thread=e.thread,
        occurred_at=e.occurred_at,
        text=text,
        event_id=str(e.event_id),
        **fields,
    )
    return [Notice(source, nt.encode(n).decode())]


def refused(e: ev.Event, reason: str) -> list[Effect]:
    """A command that changed nothing; the adapter learns why."""
    return notice(e, nt.COMMAND_REFUSED, reason)


def key(e: ev.Event) -> dict[str, Any]:
    """The conversation of an event, as query parameters."""
    return {"agent": e.agent, "channel": e.channel}
