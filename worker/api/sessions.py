"""Handlers of saved sessions: list, show, save, restore, delete, purge, export, import.

Export and import reuse `contextlog export`/`import`'s code (`store.archive`), which is
blocking: it runs in a worker thread, so the event loop is never held.
"""

from __future__ import annotations

import msgspec
from starlette.concurrency import run_in_threadpool

from contextlog.producers.history import SessionInfo
from contextlog.worker.api import models as m
from contextlog.worker.api.app import Call
from contextlog.worker.api.conversations import send_one
from contextlog.worker.api.problems import ApiError
from contextlog.worker.store import archive


async def list_sessions(call: Call) -> m.SessionPageOut:
    """An agent's saved sessions (of one channel with `channel`), newest first."""
    q: m.PageQuery = call.query
    page = await call.services.reader.sessions(
        call.agent, q.channel, page=q.page, per_page=q.per_page
    )
    return m.SessionPageOut(
        sessions=page.sessions,
        page=page.page,
        per_page=page.per_page,
        total=page.total,
        pages=page.pages,
    )


async def show_session(call: Call) -> SessionInfo:
    """One saved session of this conversation (409 `refused` if there is none)."""
    return await call.services.reader.session(
        call.path["session_id"], agent=call.agent, channel=call.channel
    )


def _named(call: Call) -> m.RestoreIn:
    """The command's body with the path's session id."""
    return m.RestoreIn(session_id=call.path["session_id"], **msgspec.structs.asdict(call.body))


async def save(call: Call) -> m.Accepted:
    """`/context save [description]`: the `session_saved` notice names the new session."""
    return await send_one(call, "save", call.body)


async def restore(call: Call) -> m.Accepted:
    """`/context restore <id|last>`: the `restore_done` (or `command_refused`) notice
    says how it went."""
    return await send_one(call, "restore", _named(call))


async def delete_session(call: Call) -> m.Accepted:
    """Delete (hide) one saved session."""
    return await send_one(call, "delete_session", _named(call))


async def purge(call: Call) -> m.Accepted:
    """Delete all but the newest `keep` sessions."""
    return await send_one(call, "purge_sessions", call.body)


async def export(call: Call) -> archive.ExportedSession:
    """A saved session with its messages, as `contextlog export` writes it."""

    def load() -> archive.ExportedSession:
        reader = call.services.sync_reader
        session_id = call.path["session_id"]
        return archive.document(*archive.load(reader, session_id, call.agent, call.channel))

    return await run_in_threadpool(load)


async def import_session(call: Call) -> m.Accepted:
    """Create a session from an export (`contextlog import`); `session_imported` (or
    `command_refused`) is told to `source`."""
    doc: archive.ExportedSession = call.body
    if doc.message_count != len(doc.messages):
        raise ApiError(
            422,
            "invalid-request",
            f"message_count is {doc.message_count} but the export holds "
            f"{len(doc.messages)} messages",
            reason="invalid",
        )
    now = call.services.clock.now()
    events = archive.events(doc, call.agent, call.channel, now, call.query.source)
    event_id = await run_in_threadpool(archive.push, call.services.sync_producer, events)
    return m.Accepted(event_id=event_id)
