"""Commands applied to the sessions read model inside the ingest transaction.

Ingest splits a batch after each command event (`COMMANDS`), so a handler sees the
projections exactly as of its event, whether the batch is live or a rebuild replays
the log. A handler returns the effects to send after commit: notices for the adapter
and jobs; a refused command changes nothing and tells its adapter why.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import structlog

from contextlog.producers.context import CUT_AT, StoredMessage, estimate_tokens
from contextlog.producers.history import SessionMessage
from contextlog.schema import blocks
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.queries import query
from contextlog.worker.effects.kinds import Effect, Summarize
from contextlog.worker.store import erase, policy, search, sessions
from contextlog.worker.store.replies import Cursor, notice, refused
from contextlog.worker.store.replies import key as _key
from contextlog.worker.store.replies import rows_as as _rows_as

log = structlog.get_logger("contextlog.handlers")


class Created(NamedTuple):
    """A row of `session_created`: when ingest logged the save (or the import), and when
    an imported session was saved where it came from."""

    created_at: dt.datetime
    imported_from: dt.datetime | None


class FoundSession(NamedTuple):
    """A row of `find_session` and `last_session`."""

    agent: str
    channel: str
    session_id: str
    seqs: list[int]
    deleted_at: dt.datetime | None
    summary: str | None


def on_clear(
    cur: Cursor, e: ev.ContextCleared, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """The marker moved in the fold; here the restored session goes and every thread
    starts an empty segment (a boundary), told of an idle-timeout save just before."""
    cur.execute(query("forget_restore"), _key(e))
    saved = cur.execute(query("auto_saved_before"), {**_key(e), "seq": seq}).fetchone()
    note = None
    if saved is not None:
        note = (
            f"The conversation before this point was saved as session {saved[0]} after a "
            "pause, and can be restored."
        )
    clear_segments(cur, e, seq, at, "clear", note)
    return []


def clear_segments(
    cur: Cursor,
    e: ev.Event,
    seq: int,
    at: dt.datetime,
    kind: str,
    note: str | None,
    note_session: str | None = None,
    session: str | None = None,
) -> None:
    """Every thread of the conversation starts an empty segment after `seq` (`session`:
    the restored session its note is about)."""
    params = {
        **_key(e),
        "seq": seq,
        "at": at,
        "kind": kind,
        "note": note,
        "note_session": note_session,
        "session": session,
    }
    cur.execute(query("clear_segments"), params)


def on_save(
    cur: Cursor, e: ev.SessionSaveRequested, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """Snapshot the whole window (positions, not copies) as a new session."""
    params = {**_key(e), "seq": seq, "at": at, "default_window": d.rolling_window}
    rows = _rows_as(cur, SessionMessage).execute(query("save_window"), params).fetchall()
    if not rows:
        return refused(e, "nothing to save: the context window is empty")
    first = blocks.text_of(rows[0].content)
    return create_session(
        cur,
        e,
        seq,
        at,
        rows,
        description=e.description,
        base=_kept_id(e),
        first=first,
        auto=e.auto,
        extra={"provider": e.provider, "model": e.model},
    )


def create_session(
    cur: Cursor,
    e: ev.Event,
    seq: int,
    at: dt.datetime,
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
    created = at  # the list's order: when ingest logged the save or the import
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
            "imported_from": created_at,
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


def _kept_id(e: ev.Event) -> str | None:
    """The id a session had when an erase redacted what it was made from (its first
    message, its description): a replay of the redacted log gives it that id again."""
    return e.erased.session_id if e.erased is not None else None


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
    cur: Cursor, e: ev.SessionRestoreRequested, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """Clear, then bring the session's messages back as recent: each thread's segment
    begins with its messages (the newest exchanges that fit the budget), their thinking
    removed (its prefix is gone), under a header that names the session."""
    found = _find(cur, e, e.session_id)
    if isinstance(found, str):
        return refused(e, found)
    sid, seqs = found.session_id, list(found.seqs)
    params = {**_key(e), "seq": seq, "at": at, "seqs": seqs, "session_id": sid}
    cur.execute(query("restore_conversation"), params)
    created = _rows_as(cur, Created).execute(query("session_created"), params).fetchone()
    saved, imported = (created.created_at, created.imported_from) if created else (None, None)
    note = sessions.restore_note(sid, imported or saved, found.summary, imported is not None)
    clear_segments(cur, e, seq, at, "restore", note, None if found.summary else sid, sid)
    budget = cur.execute(query("conversation_budget"), {**_key(e), "default": d.token_budget})
    (limit,) = budget.fetchone() or (d.token_budget,)
    by_thread = _restored_by_thread(cur, params)
    for thread, kept in by_thread.items():
        kept = sessions.fit_restored(kept, int(CUT_AT * limit) - estimate_tokens(note))
        others = sorted(t for t in by_thread if t != thread) or None
        cur.execute(
            query("restore_segment"),
            {
                **params,
                "thread": thread,
                "seqs": [m.seq for m in kept],
                "tokens": sum(m.tokens for m in kept),
                "note": note,
                "note_session": None if found.summary else sid,
                "threads": others,
            },
        )
    text = f"restored session {sid} ({len(seqs)} messages)"
    return notice(e, nt.RESTORE_DONE, text, session_id=sid)


def _restored_by_thread(cur: Cursor, params: dict[str, Any]) -> dict[str, list[StoredMessage]]:
    """A session's messages, each thread's oldest first."""
    out: dict[str, list[StoredMessage]] = {}
    for seq, thread, tokens, role, content in cur.execute(query("restored_messages"), params):
        out.setdefault(thread, []).append(StoredMessage(seq, role, content, tokens))
    return out


def on_delete(
    cur: Cursor, e: ev.SessionDeleteRequested, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """Hide one session of this conversation."""
    found = _find(cur, e, e.session_id)
    if isinstance(found, str):
        return refused(e, found)
    sid = found.session_id
    cur.execute(query("delete_session"), {**_key(e), "at": at, "session_id": sid})
    return notice(e, nt.SESSION_DELETED, f"deleted session {sid}", session_id=sid)


def on_purge(
    cur: Cursor, e: ev.SessionsPurgeRequested, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """Hide all but the newest `keep` sessions."""
    params = {**_key(e), "at": at, "keep": e.keep}
    gone = cur.execute(query("purge_sessions"), params).fetchall()
    text = f"deleted {len(gone)} sessions, kept the newest {e.keep}"
    return notice(e, nt.SESSIONS_PURGED, text)


def on_summary(
    cur: Cursor, e: ev.SummaryGenerated, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """Fill in a session's summary and tell the adapter that saved it; a resumed
    session's threads get it as a note where it landed."""
    params = {
        **_key(e),
        "session_id": e.session_id,
        "summary": e.summary,
        "local": e.local,
        "failed": e.failed,
        "round": e.round,
    }
    row = cur.execute(query("set_summary"), params).fetchone()
    if row is None:
        if cur.execute(query("stale_summary"), params).fetchone() is not None:
            # Written before an erase touched the session's messages: it may tell them.
            cur.execute(query("blank_summary"), {**_key(e), "seq": seq})
        return []  # a session that is gone or already summarised
    if not e.failed:
        text = f"The summary of the resumed session {e.session_id}: {e.summary}"
        cur.execute(query("note_summary"), {**params, "seq": seq, "text": text})
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
    cur: Cursor, e: ev.ContextCompacted, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """A compaction of a thread's segment through `through_seq`, if that segment is still
    the one the job read: the API's block replaces those messages now (what came after
    follows it unchanged, thinking included); our own summary lands at the thread's next
    opening message (a boundary, never inside a tool-use cycle)."""
    key = {**_key(e), "thread": e.thread or ""}
    found = cur.execute(query("segment_of"), key).fetchone()
    if found is None or e.through_seq == 0 or not _current(cur, e, found[0]):
        # Never used, and it may tell messages erased since the job read them.
        cur.execute(query("blank_summary"), {**_key(e), "seq": seq})
        return []
    if e.through_seq >= seq or e.seen_seq >= seq:
        # A position the log had not reached when the result came: never applied (a
        # result is signed by a worker, but its references are checked all the same).
        log.warning(
            "compaction refused: it names log positions past its own",
            agent=e.agent,
            channel=e.channel,
            through_seq=e.through_seq,
            at_seq=seq,
        )
        return []
    if ev.given(e.block):
        block = bytes(e.block).decode()
        params = {
            **key,
            "through": e.through_seq,
            "block": block,
            "block_tokens": estimate_tokens([msgspec.json.decode(block)]),
            "seq": seq,
        }
        cur.execute(query("compact_segment"), params)
        cur.execute(query("recount_segment"), key)
    else:
        pending = {**key, "summary": e.summary, "through": e.through_seq}
        cur.execute(query("pend_summary"), pending)
    source = cur.execute(query("conversation_source"), key).fetchone()
    text = f"compacted the conversation up to message {e.through_seq}"
    # A job wrote the event, so it names no adapter: tell the conversation's.
    return notice(
        e, nt.CONTEXT_COMPACTED, text, source=source[0] if source else None, local=e.local
    )


def _current(cur: Cursor, e: ev.ContextCompacted, boundaries: int) -> bool:
    """Whether the segment the job read is still the thread's: no boundary since (events
    written before boundaries were counted: no clear or restore since)."""
    if e.boundaries is not None:
        return e.boundaries == boundaries
    row = cur.execute(query("cleared_seq"), _key(e)).fetchone()
    return row is not None and int(row[0]) == e.base_seq


def on_frame(
    cur: Cursor, e: ev.FrameSet, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """Keep the bot's frame; a changed system prompt or tool list is a boundary."""
    frame = {
        "model": e.model,
        "system": _raw_json(e.system),
        "tools": None if e.tools is None else [_raw_json(t) for t in e.tools],
        "thinking": _raw_json(e.thinking) if ev.given(e.thinking) else None,
    }
    params = {**_key(e), "seq": seq, "frame": msgspec.json.encode(frame).decode()}
    row = cur.execute(query("set_frame"), params).fetchone()
    if row is not None and row[0]:
        cur.execute(query("frame_boundary"), params)
    return []


def _raw_json(value: Any) -> Any:
    """A value of an event as plain JSON (raw blocks decoded)."""
    if isinstance(value, msgspec.Raw):
        return msgspec.json.decode(value)
    if isinstance(value, list):
        return [_raw_json(v) for v in value]
    return value


def on_import(
    cur: Cursor, e: ev.SessionImported, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """Make a session of the messages the import pushed just before."""
    params = {**_key(e), "seq": seq, "import_id": str(e.import_id), "count": e.message_count}
    found = _rows_as(cur, SessionMessage).execute(query("imported_messages"), params).fetchall()
    if len(found) != e.message_count:
        return refused(e, f"import incomplete: {len(found)} of {e.message_count} messages arrived")
    rows = found[::-1]  # oldest first, as save_window's
    base = _kept_id(e) or (e.session_id if sessions.SESSION_ID.match(e.session_id) else None)
    return create_session(
        cur,
        e,
        seq,
        at,
        rows,
        description=e.description,
        base=base,
        first=blocks.text_of(rows[0].content),
        auto=e.auto,
        summary=e.summary,
        summary_local=e.summary_local,
        created_at=e.created_at,
    )


Handler = Callable[[Cursor, Any, int, dt.datetime, ConversationDefaults], list[Effect]]
HANDLERS: dict[type, Handler] = {
    ev.ContextCleared: on_clear,
    ev.SessionSaveRequested: on_save,
    ev.SessionRestoreRequested: on_restore,
    ev.SessionDeleteRequested: on_delete,
    ev.SessionsPurgeRequested: on_purge,
    ev.SummaryGenerated: on_summary,
    ev.ContextCompacted: on_compaction,
    ev.SessionImported: on_import,
    ev.FrameSet: on_frame,
    ev.SearchRequested: search.on_search,
    ev.RetentionSet: policy.on_retention_set,
    ev.SessionsExpired: policy.on_sessions_expired,
    ev.EraseRequested: erase.on_erase,
}
# The kinds after which ingest splits a batch (they read the projections as of themselves).
COMMANDS = frozenset(ev.TAGS[cls] for cls in HANDLERS)
# Commands that only answer (change no projection): a rebuild does not run them again.
ANSWERS = frozenset({ev.TAGS[ev.SearchRequested]})
# Commands that reach other conversations than their own: each is a round alone
# (`projection.rounds`), so live ingest and a replay apply it to the same log.
BARRIERS = frozenset({ev.TAGS[ev.EraseRequested]})


def handle(
    cur: Cursor, event: ev.AnyEvent, seq: int, at: dt.datetime, defaults: ConversationDefaults
) -> list[Effect]:
    """Apply a command event at log position `seq`, recorded at `at`; returns its effects."""
    handler = HANDLERS.get(type(event))
    return handler(cur, event, seq, at, defaults) if handler else []
