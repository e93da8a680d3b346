"""The partitioned log (issue 14.3): migration 007 converts a database in place and
nothing a reader, a session or a rebuild sees changes."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from contextlog.producers import ContextReader
from contextlog.producers.ids import uuid7
from contextlog.schema import attachments, codec
from contextlog.schema import events as ev
from contextlog.worker.store.eventlog import Accepted, PostgresEventLog
from contextlog.worker.store.migrations import migrate
from contextlog.worker.store.rebuild import rebuild
from tests.integration.test_rebuild import snapshot
from tests.support.services import drop_database, later_than, migrate_layout, with_database

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(hours=2)
IMAGE = b"\x89PNG" + bytes(range(256)) * 40


@pytest.fixture
def at_006(database_url: str) -> Iterator[str]:
    """A database of its own, its tables migrated up to 006 only (as the last release
    left them), with the functions (008, 012) the writer that fills it calls."""
    name = f"contextlog_006_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(database_url, name)
    with psycopg.connect(url) as conn:
        assert migrate_layout(conn, upto=6)[-6:] == [
            "006_window_start",
            "008_fence",
            "010_await_event",
            "011_window_functions",
            "012_append_functions",
            "013_window_start_stable",
        ]
    yield url
    drop_database(database_url, name)


def entry(event: ev.AnyEvent, blobs: dict[str, bytes] | None = None) -> Accepted:
    return Accepted("1-0", event, codec.encode(event), blobs or {})


def message(channel: str, i: int, thread: str | None = None) -> ev.MessagePosted:
    return ev.MessagePosted(
        event_id=uuid7(),
        agent="alpha",
        channel=channel,
        thread=thread,
        occurred_at=T0 + dt.timedelta(minutes=i),
        role="user" if i % 2 == 0 else "assistant",
        content=f"message {i} in {channel}",
    )


def command(cls: type[Any], channel: str, minute: int, **kw: Any) -> ev.AnyEvent:
    at = T0 + dt.timedelta(minutes=minute)
    return cls(event_id=uuid7(), agent="alpha", channel=channel, occurred_at=at, **kw)  # type: ignore[no-any-return]


def fill(url: str) -> None:
    """Messages in threads, an image, a clear, saves (sessions referencing seqs), a
    restore, settings: what the conversion must carry over."""
    sha = hashlib.sha256(IMAGE).hexdigest()
    source = {"type": "base64", "media_type": "image/png", "data": ""}
    image = {"type": "image", "source": attachments.reference(source, sha, len(IMAGE))}
    log = PostgresEventLog(psycopg.connect(url))
    for channel in ("general", "random", "dm-7"):
        batch = [entry(message(channel, i, "t1" if i % 3 == 0 else None)) for i in range(12)]
        log.append(0, 1, batch)
    posted = {
        "type": "message.v1",
        "event_id": str(uuid7()),
        "agent": "alpha",
        "channel": "general",
        "occurred_at": (T0 + dt.timedelta(minutes=12)).isoformat(),
        "role": "user",
        "content": [image, {"type": "text", "text": "look"}],
    }
    raw = json.dumps(posted).encode()
    log.append(0, 1, [Accepted("1-0", codec.decode(raw), raw, {sha: IMAGE})])
    log.append(0, 1, [entry(command(ev.SessionSaveRequested, "general", 13, description="w"))])
    log.append(0, 1, [entry(command(ev.ContextCleared, "general", 14))])
    log.append(0, 1, [entry(message("general", 16)), entry(message("general", 17))])
    log.append(0, 1, [entry(command(ev.SessionSaveRequested, "random", 18))])
    log.append(0, 1, [entry(command(ev.ContextCleared, "random", 19))])
    log.append(0, 1, [entry(command(ev.SessionRestoreRequested, "random", 20, session_id="last"))])
    log.append(0, 1, [entry(command(ev.Configured, "dm-7", 21, token_budget=200))])
    log.close()


def observed(url: str) -> dict[str, Any]:
    """Everything a user or an operator sees: contexts, sessions, the log, projections."""
    reader = ContextReader.from_url(url)
    out: dict[str, Any] = {}
    for channel in ("general", "random", "dm-7"):
        for thread in (None, "t1"):
            ctx = reader.context("alpha", channel, thread)
            out[f"{channel}/{thread}"] = (ctx.to_anthropic(), ctx.token_estimate, ctx.truncated)
        page = reader.sessions("alpha", channel)
        out[f"{channel}/sessions"] = [
            (s.session_id, s.message_count, s.token_estimate, s.description) for s in page.sessions
        ]
    reader.close()
    with psycopg.connect(url) as conn:
        # The columns 006 has (the running totals of 009 are not kept by 007's copy).
        out["log"] = conn.execute(
            "SELECT position, event_id, agent, channel, thread, seq, kind, occurred_at, tokens,"
            " payload FROM events ORDER BY position"
        ).fetchall()
        out["attachments"] = conn.execute("SELECT sha256, size FROM attachments").fetchall()
    out["projections"] = snapshot(url)
    return out


def test_migration_007_converts_a_log_in_place(at_006: str) -> None:
    fill(at_006)
    before = observed(at_006)
    assert len(before["log"]) == 45 and before["attachments"]
    assert before["general/None"][0]["messages"]  # the window after the clear
    assert before["random/sessions"] and before["general/sessions"]
    with psycopg.connect(at_006) as conn:
        assert migrate(conn) == [
            "007_partitioned_events",
            "009_running_totals",
            "014_segments",
            *later_than(14),
        ]
        parts = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'events'::regclass"
        ).fetchone()
        assert parts == (16,)
        top = conn.execute("SELECT max(position) FROM events").fetchone()
    assert observed(at_006) == before
    # Positions go on after the old table's; a rebuild from the new table is the same.
    log = PostgresEventLog(psycopg.connect(at_006))
    log.append(0, 1, [entry(message("general", 30))])
    log.close()
    with psycopg.connect(at_006) as conn:
        newest = conn.execute("SELECT max(position) FROM events").fetchone()
        assert top is not None and newest is not None and newest[0] > top[0]
        live = snapshot(at_006)
        assert rebuild(conn) == 46
    assert snapshot(at_006) == live


def test_migration_007_on_an_empty_log(at_006: str) -> None:
    with psycopg.connect(at_006) as conn:
        assert migrate(conn) == [
            "007_partitioned_events",
            "009_running_totals",
            "014_segments",
            *later_than(14),
        ]
    log = PostgresEventLog(psycopg.connect(at_006))
    assert log.append(0, 1, [entry(message("general", 1))]) == 1
    log.close()
    with psycopg.connect(at_006) as conn:
        assert conn.execute("SELECT position, seq FROM events").fetchall() == [(1, 1)]
