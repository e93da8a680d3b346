"""Export a saved session as a JSON file, and import one into a conversation.

An import pushes the session's messages as `imported_message.v1` events (in the log,
never in a live window) and then `session_imported.v1`, which makes them a session;
all of them go in one pipeline onto the conversation's shard stream, in order.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from producers.history import SessionInfo, SessionMessage
from producers.ids import uuid7
from producers.producer import Producer
from schema import events as ev
from schema.errors import EventRejected, Refused

FORMAT: Final = "contextlog.session.v1"
MAX_FILE_BYTES: Final = 64 << 20
MAX_MESSAGES: Final = 100_000
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class ExportedMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message of an exported session."""

    role: ev.Role
    content: ev.Content
    occurred_at: Annotated[dt.datetime, Meta(tz=True)] | None = None
    thread: ev.Name | None = None


class ExportedSession(msgspec.Struct, frozen=True, kw_only=True):
    """The file `contextlog export` writes and `contextlog import` reads."""

    format: Literal["contextlog.session.v1"] = FORMAT
    session_id: ev.SessionRef
    timestamp: Annotated[dt.datetime, Meta(tz=True)]
    description: ev.Description | None = None
    summary: ev.Text | None = None
    message_count: Annotated[int, Meta(ge=1, le=MAX_MESSAGES)]
    token_estimate: Annotated[int, Meta(ge=0)] = 0
    window_start: Annotated[dt.datetime, Meta(tz=True)] | None = None
    window_end: Annotated[dt.datetime, Meta(tz=True)] | None = None
    agent: str | None = None  # where it came from; informational
    channel: str | None = None
    messages: Annotated[list[ExportedMessage], Meta(min_length=1, max_length=MAX_MESSAGES)]


def document(info: SessionInfo, messages: list[SessionMessage]) -> ExportedSession:
    """The export of a session and its messages."""
    return ExportedSession(
        session_id=info.session_id,
        timestamp=info.created_at,
        description=info.description,
        summary=info.summary,
        message_count=len(messages),
        token_estimate=info.token_estimate,
        window_start=info.window_start,
        window_end=info.window_end,
        agent=info.agent,
        channel=info.channel,
        messages=[
            msgspec.convert(
                {
                    "role": m.role,
                    "content": m.content,
                    "occurred_at": m.occurred_at,
                    "thread": m.thread or None,
                },
                ExportedMessage,
                from_attributes=False,
            )
            for m in messages
        ],
    )


def safe_filename(session_id: str) -> str:
    """A file name made of the id's safe characters only: no separators, no dots."""
    stem = _UNSAFE.sub("_", session_id).strip("_")[:100] or "session"
    return f"{stem}.json"


def target(folder: Path, session_id: str, output: Path | None = None) -> Path:
    """Where an export goes: `output` as given, or a file named after the id that is
    checked to stay inside `folder`."""
    if output is not None:
        return output
    path = (folder / safe_filename(session_id)).resolve()
    if path.parent != folder.resolve():
        raise Refused(f"refusing to write outside {folder}: {path}")  # pragma: no cover
    return path


def write(doc: ExportedSession, path: Path) -> Path:
    """Write the export as indented JSON."""
    path.write_bytes(msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n")
    return path


def read(path: Path) -> ExportedSession:
    """Read and validate an export file; anything wrong is `Refused` with the reason."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise Refused(f"{path} is {size} bytes, the limit is {MAX_FILE_BYTES}")
        data = path.read_bytes()
    except OSError as e:
        raise Refused(f"cannot read {path}: {e.strerror or e}") from None
    try:
        doc = msgspec.json.decode(data, type=ExportedSession)
    except msgspec.ValidationError as e:
        raise Refused(f"{path} is not a contextlog session export: {e}") from None
    except msgspec.DecodeError as e:
        raise Refused(f"{path} is not valid JSON: {e}") from None
    if doc.message_count != len(doc.messages):
        raise Refused(
            f"{path}: message_count is {doc.message_count} but it holds "
            f"{len(doc.messages)} messages"
        )
    return doc


def events(
    doc: ExportedSession,
    agent: str,
    channel: str,
    now: dt.datetime,
    source: str | None = None,
    import_id: uuid.UUID | None = None,
) -> list[ev.Event]:
    """The events that import `doc` into a conversation."""
    iid = import_id or uuid7()
    common: dict[str, Any] = {"agent": agent, "channel": channel, "source": source}
    out: list[ev.Event] = [
        ev.MessageImported(
            event_id=uuid7(),
            occurred_at=now,
            thread=m.thread,
            import_id=iid,
            role=m.role,
            content=m.content,
            original_at=m.occurred_at,
            **common,
        )
        for m in doc.messages
    ]
    out.append(
        ev.SessionImported(
            event_id=uuid7(),
            occurred_at=now,
            import_id=iid,
            session_id=doc.session_id,
            message_count=len(doc.messages),
            description=doc.description,
            summary=doc.summary,
            created_at=doc.timestamp,
            **common,
        )
    )
    return out


def push(producer: Producer, evts: list[ev.Event]) -> str:
    """Send an import's events in one pipeline; returns the last event's id. Every
    event is checked before anything is sent, so a bad file sends nothing."""
    try:
        ids = producer.push_many(evts)
    except EventRejected as e:
        raise Refused(f"the import was not sent: {e}") from None
    return ids[-1]
