"""Retention by policy (issue 34.2) on real Postgres: which conversations go and which stay
(activity, agent rules, a conversation's own, live sessions), sessions expired through the
log, what goes with a conversation (search rows, notes, attachments only it referenced),
bounded, idempotent and resumable steps, status, and a rebuild giving the same state."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from contextlog.producers import search as found
from contextlog.producers.ids import uuid7
from contextlog.schema import attachments, codec
from contextlog.schema import events as ev
from contextlog.schema.defaults import Keep, Retention
from contextlog.worker.app.clock import FakeClock
from contextlog.worker.app.status import gather
from contextlog.worker.store import policy, retention
from contextlog.worker.store.eventlog import Accepted
from contextlog.worker.store.locks import RETENTION_LOCK
from contextlog.worker.store.rebuild import rebuild
from contextlog.worker.tasks import retention as task
from tests.integration.test_erase import delivery, webhook
from tests.support import snapshots
from tests.support.readers import Twin, twin
from tests.support.running import settings_for
from tests.support.thinking_bot import Log

__all__ = ["twin"]

T0 = LOG_START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
SID = "2026-01-01_first"  # the session saved first in a test
RULES = Retention(Keep(log=90 * 86400), (("support", Keep(log=10 * 86400, sessions=5 * 86400)),))
IMAGE = b"\x89PNG" + bytes(range(256)) * 8
SHARED = b"GIF89a" + bytes(range(200)) * 4


def image(lg: Log, data: bytes, channel: str, agent: str = "alpha") -> None:
    """A message with an attachment, as a producer takes it out (bytes beside the event)."""
    sha = hashlib.sha256(data).hexdigest()
    source = {"type": "base64", "media_type": "image/png", "data": ""}
    block = {"type": "image", "source": attachments.reference(source, sha, len(data))}
    raw = json.dumps(
        {
            "type": "message.v1",
            "event_id": str(uuid7()),
            "agent": agent,
            "channel": channel,
            "occurred_at": lg.now.isoformat(),
            "role": "user",
            "content": [block, {"type": "text", "text": f"picture in {channel}"}],
        }
    ).encode()
    lg.log.append(0, 1, [Accepted("9-0", codec.decode(raw), raw, {sha: data})])


def step(
    db: str, now: dt.datetime, limit: int = 100, **kw: Any
) -> tuple[policy.Run, list[ev.Event]]:
    pushed: list[ev.Event] = []
    with psycopg.connect(db) as conn:
        run = policy.step(conn, RULES, now, pushed.extend, limit=limit, **kw)
    assert run is not None
    return run, pushed


def apply(lg: Log, events: list[ev.Event]) -> None:
    """What ingest does with what the step pushed."""
    for e in events:
        payload = codec.encode(e)
        lg.log.append(0, 1, [Accepted("8-0", codec.decode(payload), payload)])


def deliveries(db: str) -> list[tuple[str, str, str]]:
    """The webhook deliveries left: (agent, channel, delivery id)."""
    with psycopg.connect(db) as conn:
        return conn.execute(
            "SELECT agent, channel, delivery_id FROM webhook_deliveries ORDER BY 1, 2, 3"
        ).fetchall()


def conversations(db: str) -> list[tuple[str, str]]:
    with psycopg.connect(db) as conn:
        return conn.execute("SELECT agent, channel FROM conversations ORDER BY 1, 2").fetchall()


def test_the_log_goes_after_its_time_whole_and_rebuild_agrees(
    db: str, log: Log, twin: Twin
) -> None:
    log.say("user", "old words in quiet", channel="quiet")
    image(log, IMAGE, "quiet")  # only quiet references it
    image(log, SHARED, "quiet")
    log.say("user", "kept by a session", channel="saved")
    log.add(ev.SessionSaveRequested, channel="saved")
    log.say("user", "support talk", channel="help", agent="support")
    log.say("user", "its own rule", channel="brief")
    log.add(ev.RetentionSet, channel="brief", keep_log_days=3)
    log.now = T0 + 80 * DAY
    log.say("user", "recent words", channel="busy")
    image(log, SHARED, "busy")  # the same bytes: kept while busy references them
    with psycopg.connect(db) as conn:  # webhook bodies of their notices, delivered or not
        webhook(conn)
        delivery(conn, "quiet", "summary_ready", "they said old words", 1)
        delivery(conn, "busy", "summary_ready", "they said recent words", 2)
        delivery(conn, "help", "session_saved", "saved", 3, agent="support")
    run, pushed = step(db, T0 + 95 * DAY)
    assert (run.conversations, run.pinned, run.left_due, pushed) == (3, 1, 0, [])
    assert sorted(run.dropped or []) == [
        ("alpha", "brief"),
        ("alpha", "quiet"),
        ("support", "help"),
    ]
    assert conversations(db) == [("alpha", "busy"), ("alpha", "saved")]
    assert twin.search("alpha", "words").total == 1  # busy's only
    assert deliveries(db) == [("alpha", "busy", "d2")]  # a conversation goes with its bodies
    kept = snapshots.derived(db)
    assert [bytes(a[0]) for a in kept["attachments"]] == [hashlib.sha256(SHARED).digest()]
    with psycopg.connect(db) as conn:
        rebuild(conn)
    assert snapshots.derived(db) == kept
    again, _ = step(db, T0 + 95 * DAY)  # idempotent: nothing more to do
    assert (again.conversations, again.events) == (0, 0)


def test_sessions_expire_through_the_log_and_then_release_the_conversation(
    db: str, log: Log
) -> None:
    kw: dict[str, Any] = {"agent": "support", "channel": "c"}
    log.add(ev.MessagePosted, role="user", content="first talk", **kw)
    log.add(ev.SessionSaveRequested, description="first", **kw)
    log.now = T0 + 4 * DAY
    log.add(ev.SessionRestoreRequested, session_id="last", **kw)
    log.add(ev.MessagePosted, role="user", content="after the restore", **kw)
    log.add(ev.SummaryGenerated, session_id=SID, summary="They talked.", **kw)
    with psycopg.connect(db) as conn:
        note = conn.execute("SELECT seg_note, boundaries FROM threads").fetchone()
        notes = conn.execute("SELECT text FROM notes").fetchall()
    assert note is not None and "Resumed saved session 2026-01-01_first" in note[0]
    assert notes and "They talked." in notes[0][0]
    with psycopg.connect(db) as conn:  # the summary's webhook body, and another notice's
        webhook(conn)
        delivery(conn, "c", "summary_ready", "They talked.", 1, "support", session_id=SID)
        delivery(conn, "c", "summary_ready", "Later talk.", 2, "support", session_id="other")
        delivery(conn, "c", "restore_done", "restored", 3, "support")
    run, pushed = step(db, T0 + 6 * DAY)  # sessions: 5 days for support
    assert run.expiring == 1 and run.conversations == 0 and run.pinned == 0
    assert [(type(e), e.agent, e.channel) for e in pushed] == [(ev.SessionsExpired, "support", "c")]
    _, twice = step(db, T0 + 6 * DAY + dt.timedelta(minutes=10))
    assert [e.event_id for e in twice] == [e.event_id for e in pushed]  # stored once
    apply(log, pushed + twice)
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone() == (0,)
        header = conn.execute("SELECT seg_note, boundary, boundaries FROM threads").fetchone()
        texts = conn.execute("SELECT text FROM notes").fetchall()
    assert header is not None and header[1] == "expire" and header[2] == note[1] + 1
    assert "They talked" not in header[0] and "removed (the session expired)" in header[0]
    assert "They talked" not in texts[0][0]
    assert deliveries(db) == [("support", "c", "d2"), ("support", "c", "d3")]
    live = snapshots.derived(db)
    with psycopg.connect(db) as conn:
        rebuild(conn)
    assert snapshots.derived(db) == live
    run, _ = step(db, T0 + 15 * DAY)  # then the log (10 days for support) goes
    assert run.conversations == 1 and conversations(db) == []


def test_steps_are_bounded_and_one_at_a_time(db: str, log: Log) -> None:
    for i in range(5):
        log.say("user", f"conversation {i}", channel=f"c{i}")
    first, _ = step(db, T0 + 100 * DAY, limit=2)
    assert (first.conversations, first.left_due) == (2, 3)
    with psycopg.connect(db) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (RETENTION_LOCK,))
        with psycopg.connect(db) as conn:
            assert policy.step(conn, RULES, T0 + 100 * DAY, print, limit=2) is None
    second, _ = step(db, T0 + 100 * DAY, limit=2)
    third, _ = step(db, T0 + 100 * DAY, limit=2)
    assert (second.conversations, third.conversations, third.left_due) == (2, 1, 0)
    assert conversations(db) == []


def test_the_worker_step_is_recorded_for_status_and_survives_a_crash(
    db: str, log: Log, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):
        log.say("user", f"old {i}", channel=f"c{i}")
    settings = settings_for(
        db,
        redis_url,
        CONTEXTLOG_KEEP_LOG="30d",
        CONTEXTLOG_RETENTION_BATCH="5",
        CONTEXTLOG_RETENTION_ARCHIVE=str(tmp_path),
    )
    clock = FakeClock(T0 + 60 * DAY)
    connect = lambda: psycopg.connect(db)  # noqa: E731
    calls = 0
    real = retention._retire_one

    def crashing(*args: Any) -> int | None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("the worker died here")
        return real(*args)

    monkeypatch.setattr(retention, "_retire_one", crashing)
    with pytest.raises(RuntimeError):
        task.run_step(settings, connect, producer=None, now=clock.now())  # type: ignore[arg-type]
    assert len(conversations(db)) == 2  # the first went, committed alone
    monkeypatch.undo()
    run = task.run_step(settings, connect, producer=None, now=clock.now())  # type: ignore[arg-type]
    assert run is not None and run.conversations == 2 and conversations(db) == []
    archived = [line for f in tmp_path.iterdir() for line in f.read_text().splitlines()]
    assert len(archived) == 3  # archived before dropped, across both steps
    client = redis.Redis.from_url(redis_url)
    with psycopg.connect(db) as conn:
        status = gather(client, conn, 4, clock.now())
    client.close()
    assert status.retention is not None and status.retention.conversations == 2
    assert status.retention.error is None and status.healthy


def test_a_search_of_a_dropped_conversation_finds_nothing(db: str, log: Log, twin: Twin) -> None:
    log.say("user", "needle here", channel="gone")
    assert twin.search("alpha", "needle").total == 1
    step(db, T0 + 100 * DAY)
    page: found.SearchPage = twin.search("alpha", "needle")
    assert page.total == 0
