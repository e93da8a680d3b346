"""Export a saved session as a JSON file, and import one into a conversation.

An import pushes the session's messages as `imported_message.v1` events (in the log,
never in a live window) and then `session_imported.v1`, which makes them a session;
all of them go in one MULTI onto the conversation's shard stream, in order. Each event
is first checked exactly as ingest will check it (encode, then `codec.decode`), so a
file ingest would refuse any part of sends nothing.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from contextlog.producers.attachments import attach_messages
from contextlog.producers.history import FOUND, MESSAGES, SessionInfo, SessionMessage, pick
from contextlog.producers.ids import uuid7
from contextlog.producers.producer import Producer
from contextlog.producers.reader import ContextReader
from contextlog.schema import events as ev
from contextlog.schema.errors import EventRejected, Refused
from contextlog.schema.queries import query

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
    summary_local: bool = False  # written by the local summarizer, not a model
    message_count: Annotated[int, Meta(ge=1, le=MAX_MESSAGES)]
    token_estimate: Annotated[int, Meta(ge=0)] = 0
    window_start: Annotated[dt.datetime, Meta(tz=True)] | None = None
    window_end: Annotated[dt.datetime, Meta(tz=True)] | None = None
    agent: str | None = None  # where it came from; informational
    channel: str | None = None
    messages: Annotated[list[ExportedMessage], Meta(min_length=1, max_length=MAX_MESSAGES)]


def load(
    reader: ContextReader, session_id: str, agent: str, channel: str
) -> tuple[SessionInfo, list[SessionMessage]]:
    """A live session of one conversation and its messages, oldest first. A session of
    another conversation is refused exactly as one that does not exist: a caller must
    not learn which ids other conversations use."""
    params = {"session_id": session_id, "agent": agent, "channel": channel}
    with reader.connection() as conn:
        rows = conn.cursor(row_factory=FOUND).execute(query("get_session"), params).fetchall()
        info, seqs = pick(rows, session_id, agent, channel)
        found = (
            conn.cursor(row_factory=MESSAGES)
            .execute(query("session_messages"), {"agent": agent, "channel": channel, "seqs": seqs})
            .fetchall()
        )
        # The export carries its attachments' bytes, as base64 in the blocks, as posted.
        return info, attach_messages(conn, found)


def _exported(m: SessionMessage) -> ExportedMessage:
    # Through JSON, not `msgspec.convert`: a tool's input is `Raw` JSON in the contract,
    # and convert cannot make Raw from the dict Postgres returns.
    fields = {"role": m.role, "content": m.content, "occurred_at": m.occurred_at}
    if m.thread:
        fields["thread"] = m.thread
    return _message_decoder.decode(msgspec.json.encode(fields))


def document(info: SessionInfo, messages: list[SessionMessage]) -> ExportedSession:
    """The export of a session and its messages. A failed summary is left out (its
    placeholder is no summary), so the import asks for one again."""
    summary = None if info.summary_failed else info.summary
    return ExportedSession(
        session_id=info.session_id,
        timestamp=info.created_at,
        description=info.description,
        summary=summary,
        summary_local=info.summary_local and summary is not None,
        message_count=len(messages),
        token_estimate=info.token_estimate,
        window_start=info.window_start,
        window_end=info.window_end,
        agent=info.agent,
        channel=info.channel,
        messages=[_exported(m) for m in messages],
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


def write(doc: ExportedSession, path: Path, *, overwrite: bool = False) -> Path:
    """Write the export as indented JSON; an existing file is kept unless `overwrite`
    (checked as the file is created, so nothing can appear in between)."""
    data = msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n"
    try:
        with path.open("wb" if overwrite else "xb") as f:
            f.write(data)
    except FileExistsError:
        raise Refused(f"{path} exists: give --force to overwrite it, or -o another file") from None
    except OSError as e:
        raise Refused(f"cannot write {path}: {e.strerror or e}") from None
    return path


def _read_capped(path: Path) -> bytes:
    """At most MAX_FILE_BYTES + 1 bytes of `path`, whatever it is: `stat` says nothing
    of a pipe or a device, so the read itself is bounded."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise Refused(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise Refused(f"{path} is larger than the limit of {MAX_FILE_BYTES} bytes")
    return data


def read(path: Path) -> ExportedSession:
    """Read and validate an export file; anything wrong is `Refused` with the reason."""
    data = _read_capped(path)
    try:
        doc = _session_decoder.decode(data)
    except msgspec.ValidationError as e:
        raise Refused(f"{path} is not a contextlog session export: {e}") from None
    except msgspec.DecodeError as e:
        raise Refused(f"{path} is not valid JSON: {e}") from None
    except UnicodeDecodeError as e:  # msgspec's error for invalid UTF-8 inside a string
        raise Refused(f"{path} is not valid UTF-8 JSON: {e}") from None
    except RecursionError:
        raise Refused(f"{path} nests JSON too deeply to be a session export") from None
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
            summary_local=doc.summary_local and doc.summary is not None,
            created_at=doc.timestamp,
            **common,
        )
    )
    return out


def push(producer: Producer, evts: list[ev.Event]) -> str:
    """Send an import's events in one MULTI; returns the last event's id. Every event is
    checked as ingest checks it (`Encoder.prepare`: encode, size cap, `codec.decode`)
    before anything is sent, so a bad file sends nothing."""
    prepared = []
    for i, e in enumerate(evts, 1):
        what = f"message {i} of {len(evts) - 1}" if i < len(evts) else "the session"
        try:
            prepared.append(producer.encoder.prepare(e))
        except EventRejected as err:
            raise Refused(f"the import was not sent: {what}: {err}") from None
    return producer.send_prepared(prepared, atomic=True)[-1]


_message_decoder: Final = msgspec.json.Decoder(ExportedMessage)
_session_decoder: Final = msgspec.json.Decoder(ExportedSession)
