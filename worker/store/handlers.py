"""Commands applied to the sessions read model inside the ingest transaction.

Ingest splits a batch after each command event (`COMMANDS`), so a handler sees the
projections exactly as of its event, whether the batch is live or a rebuild replays
the log. A handler returns the effects to send after commit: notices for the adapter
and jobs; a refused command changes nothing and tells its adapter why.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg.rows import TupleRow, class_row

from contextlog.producers.history import SessionMessage
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.queries import query
from contextlog.worker.effects.kinds import Effect, Notice, Summarize
from contextlog.worker.store import sessions

Cursor = psycopg.Cursor[TupleRow]
T = TypeVar("T")


class FoundSession(NamedTuple):
    """A row of `find_session` and `last_session`."""

    agent: str
    channel: str
    session_id: str
    seqs: list[int]
    deleted_at: dt.datetime | None
    summary: str | None


def _rows_as(cur: Cursor, shape: type[T]) -> psycopg.Cursor[T]:
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


def _key(e: ev.Event) -> dict[str, Any]:
    return {"agent": e.agent, "channel": e.channel}


def on_clear(cur: Cursor, e: ev.ContextCleared, seq: int, d: ConversationDefaults) -> list[Effect]:
    """The marker moved in the fold; here the restored session and compactions go."""
    cur.execute(query("forget_restore"), _key(e))
    cur.execute(query("reset_threads"), _key(e))
    return []


def on_save(
    cur: Cursor, e: ev.SessionSaveRequested, seq: int, d: ConversationDefaults
) -> list[Effect]:
    """Snapshot the whole window (positions, not copies) as a new session."""
    params = {**_key(e), "seq": seq, "at": e.occurred_at, "default_window": d.rolling_window}
    rows = _rows_as(cur, SessionMessage).execute(query("save_window"), params).fetchall()
    if not rows:
        return refused(e, "nothing to save: the context window is empty")
    first = sessions.text_of(rows[0].content)
    return create_session(
        cur,
        e,
        seq,
        rows,
        description=e.description,
        base=None,
        first=first,
        auto=e.auto,
        extra={"provider": e.provider, "model": e.model},
    )


def create_session(
    cur: Cursor,
    e: ev.Event,
    seq: int,
    rows: list[SessionMessage],
    *,
    description: str | None,
    base: str | None,
    first: str,
    auto: bool,
    summary: str | None = None,
    summary_local: bool = False,
    created_at: dt.datetime | None = None,
    extra: dict[str, Any] | None = None,
) -> list[Effect]:
    """Insert a session over the messages `rows`, oldest first."""
    created = created_at or e.occurred_at
    wanted = base or sessions.session_id(created, description, first, ())
    ids = cur.execute(query("session_ids_from"), {**_key(e), "base": wanted})
    taken = {session_id for (session_id,) in ids}
    sid = sessions.unique(wanted, taken)
    cur.execute(
        query("insert_session"),
        {
            **_key(e),
            "session_id": sid,
            "seq": seq,
            "created_at": created,
            "description": description,
            "preview": sessions.preview(first),
            "message_count": len(rows),
            "token_estimate": sum(r.tokens for r in rows),
            "auto": auto,
            "source": e.source,
            "provider": None,
            "model": None,
            **(extra or {}),
            "seqs": [r.seq for r in rows],
            "window_start": rows[0].occurred_at,
            "window_end": rows[-1].occurred_at,
            "summary": summary,
            "summary_local": summary_local and summary is not None,
        },
    )
    if isinstance(e, ev.SessionImported):
        kind, text = nt.SESSION_IMPORTED, f"imported session {sid} ({len(rows)} messages)"
    else:
        kind, text = nt.SESSION_SAVED, f"saved session {sid} ({len(rows)} messages)"
        cur.execute(query("mark_saved"), {**_key(e), "seq": seq})
    effects = notice(e, kind, text, session_id=sid, auto=auto)
    if summary is None:
        effects.append(Summarize(e.agent, e.channel, sid))
    return effects


def _find(cur: Cursor, e: ev.Event, ref: str) -> FoundSession | str:
    """This conversation's live session `ref` (or the newest for "last"), or why not."""
    found = _rows_as(cur, FoundSession)
    if ref == sessions.LAST:
        row = found.execute(query("last_session"), _key(e)).fetchone()
        return row if row is not None else "there is no saved session to restore"
    row = found.execute(query("find_session"), {**_key(e), "session_id": ref}).fetchone()
    # Another conversation's session reads as unknown: a refusal must not tell a
    # user which ids other conversations use.
    if row is None or (row.agent, row.channel) != (e.agent, e.channel):
        return f"there is no session {ref!r}"
    if row.deleted_at is not None:
        return f"session {ref!r} was deleted"
    return row


def on_restore(
    cur: Cursor, e: ev.SessionRestoreRequested, seq: int, d: ConversationDefaults
) -> list[Effect]:
    """Clear, then bring the session's messages back as recent."""
    found = _find(cur, e, e.session_id)
    if isinstance(found, str):
        return refused(e, found)
    sid, seqs = found.session_id, list(found.seqs)
    params = {**_key(e), "seq": seq, "at": e.occurred_at, "seqs": seqs, "session_id": sid}
    cur.execute(query("restore_conversation"), params)
    cur.execute(query("reset_threads"), params)
    cur.execute(query("restored_threads"), params)
    text = f"restored session {sid} ({len(seqs)} messages)"
    return notice(e, nt.RESTORE_DONE, text, session_id=sid)


def on_delete(
    cur: Cursor, e: ev.SessionDeleteRequested, seq: int, d: ConversationDefaults
) -> list[Effect]:
    """Hide one session of this conversation."""
    found = _find(cur, e, e.session_id)
    if isinstance(found, str):
        return refused(e, found)
    sid = found.session_id
    cur.execute(query("delete_session"), {**_key(e), "at": e.occurred_at, "session_id": sid})
    return notice(e, nt.SESSION_DELETED, f"deleted session {sid}", session_id=sid)


def on_purge(
    cur: Cursor, e: ev.SessionsPurgeRequested, seq: int, d: ConversationDefaults
) -> list[Effect]:
    """Hide all but the newest `keep` sessions."""
    params = {**_key(e), "at": e.occurred_at, "keep": e.keep}
    gone = cur.execute(query("purge_sessions"), params).fetchall()
    text = f"deleted {len(gone)} sessions, kept the newest {e.keep}"
    return notice(e, nt.SESSIONS_PURGED, text)


def on_summary(
    cur: Cursor, e: ev.SummaryGenerated, seq: int, d: ConversationDefaults
) -> list[Effect]:
    """Fill in a session's summary and tell the adapter that saved it."""
    params = {
        **_key(e),
        "session_id": e.session_id,
        "summary": e.summary,
        "local": e.local,
        "failed": e.failed,
    }
    row = cur.execute(query("set_summary"), params).fetchone()
    if row is None:
        return []  # a session that is gone or already summarised
    source, auto = row
    return notice(
        e,
        nt.SUMMARY_READY,
        e.summary,
        source=source,
        session_id=e.session_id,
        auto=bool(auto),
        local=e.local,
        failed=e.failed,
    )


def on_compaction(
    cur: Cursor, e: ev.ContextCompacted, seq: int, d: ConversationDefaults
) -> list[Effect]:
    """Replace the thread's messages through `through_seq` by the summary in context."""
    params = {
        **_key(e),
        "thread": e.thread or "",
        "through": e.through_seq,
        "summary": e.summary,
        "seq": seq,
        "base_seq": e.base_seq,
        "seen": e.seen_seq,
        "remaining": e.remaining_tokens,
    }
    done = cur.execute(query("compact_thread"), params).fetchone()
    if done is None or e.through_seq == 0:
        return []
    _thread, source = done
    text = f"compacted the conversation up to message {e.through_seq}"
    # A job wrote the event, so it names no adapter: tell the conversation's.
    return notice(e, nt.CONTEXT_COMPACTED, text, source=source, local=e.local)


def on_import(
    cur: Cursor, e: ev.SessionImported, seq: int, d: ConversationDefaults
) -> list[Effect]:
    """Make a session of the messages the import pushed just before."""
    params = {**_key(e), "seq": seq, "import_id": str(e.import_id), "count": e.message_count}
    found = _rows_as(cur, SessionMessage).execute(query("imported_messages"), params).fetchall()
    if len(found) != e.message_count:
        return refused(e, f"import incomplete: {len(found)} of {e.message_count} messages arrived")
    rows = found[::-1]  # oldest first, as save_window's
    base = e.session_id if sessions.SESSION_ID.match(e.session_id) else None
    return create_session(
        cur,
        e,
        seq,
        rows,
        description=e.description,
        base=base,
        first=sessions.text_of(rows[0].content),
        auto=e.auto,
        summary=e.summary,
        summary_local=e.summary_local,
        created_at=e.created_at,
    )


Handler = Callable[[Cursor, Any, int, ConversationDefaults], list[Effect]]
HANDLERS: dict[type, Handler] = {
    ev.ContextCleared: on_clear,
    ev.SessionSaveRequested: on_save,
    ev.SessionRestoreRequested: on_restore,
    ev.SessionDeleteRequested: on_delete,
    ev.SessionsPurgeRequested: on_purge,
    ev.SummaryGenerated: on_summary,
    ev.ContextCompacted: on_compaction,
    ev.SessionImported: on_import,
}
# The kinds after which ingest splits a batch (they read the projections as of themselves).
COMMANDS = frozenset(ev.TAGS[cls] for cls in HANDLERS)


def handle(
    cur: Cursor, event: ev.AnyEvent, seq: int, defaults: ConversationDefaults
) -> list[Effect]:
    """Apply a command event at log position `seq`; returns its effects."""
    handler = HANDLERS.get(type(event))
    return handler(cur, event, seq, defaults) if handler else []
