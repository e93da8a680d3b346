"""The running token totals (migration 009) and the boundary decisions made from them
(014): every message stored by either write path carries its thread's total; a log
decides the same boundaries however it was batched, and `contextlog rebuild` decides
them again the same; a log written before 014 gets its segments from its state."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from contextlog.producers import ContextReader
from contextlog.producers.ids import uuid7
from contextlog.schema import codec
from contextlog.schema import events as ev
from contextlog.schema.defaults import ConversationDefaults
from contextlog.worker.store.eventlog import Accepted, PostgresEventLog
from contextlog.worker.store.migrations import migrate
from tests.support.services import drop_database, later_than, migrate_layout, with_database

T0 = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
DAY = 86_400


def message(at: dt.datetime, text: str, thread: str | None = None, **kw: Any) -> ev.AnyEvent:
    return ev.MessagePosted(
        event_id=uuid7(),
        agent="alpha",
        channel=kw.pop("channel", "general"),
        thread=thread,
        occurred_at=at,
        role=kw.pop("role", "user"),
        content=text,
    )


def entries(events: list[ev.AnyEvent]) -> list[Accepted]:
    """The events as ingest accepts them (decoded from their entry's bytes)."""
    out = []
    for i, e in enumerate(events, 1):
        payload = codec.encode(e)
        out.append(Accepted(f"{i}-0", codec.decode(payload), payload))
    return out


def stored_rows(conn: psycopg.Connection[Any], channel: str = "general") -> list[Any]:
    return conn.execute(
        "SELECT seq, thread, kind, occurred_at, tokens, through, late FROM events"
        " WHERE agent = 'alpha' AND channel = %s ORDER BY seq",
        (channel,),
    ).fetchall()


def test_each_message_carries_its_threads_running_total(db: str) -> None:
    """Batches of one (one statement), of many (COPY), with a command (rounds) and with a
    setting (one statement: a setting is not a command): each message's `through` is its
    thread's tokens up to it (`late`, which reads by time used, is false since 014)."""
    log = PostgresEventLog(psycopg.connect(db))
    at = [T0 + dt.timedelta(seconds=s) for s in range(1_000)]
    batches: list[list[ev.AnyEvent]] = [
        [message(at[10], "one")],
        [message(at[5], "late by five seconds")],  # late: one statement
        [
            message(at[20 + i], f"copy {i} " + "w " * i, thread="x" if i % 3 else None)
            for i in range(100)
        ],
        [message(at[50], "late in a copy", thread="x"), message(at[200], "after it", thread="x")],
        [
            ev.ContextCleared(
                event_id=uuid7(), agent="alpha", channel="general", occurred_at=at[300]
            ),
            message(at[301], "after the clear"),
            message(at[299], "late after the clear"),
        ],
        [
            ev.Configured(
                event_id=uuid7(),
                agent="alpha",
                channel="general",
                occurred_at=at[400],
                token_budget=5_000,
            ),
            message(at[401], "with a setting"),
        ],
    ]
    for n, batch in enumerate(batches):
        assert log.append(0, n + 1, entries(batch)) == len(batch)
    log.close()
    with psycopg.connect(db) as conn:
        rows = stored_rows(conn)
        totals: dict[str, int] = dict(
            conn.execute("SELECT thread, tokens_through FROM threads WHERE agent = 'alpha'")
        )
    running: dict[str, int] = {}
    for seq, thread, kind, _at, tokens, through, late in rows:
        if kind != "message.v1":
            assert (through, late) == (None, False), seq
            continue
        running[thread] = running.get(thread, 0) + tokens
        assert (through, late) == (running[thread], False), seq
    assert totals == running


def random_log(seed: int, channel: str) -> list[ev.AnyEvent]:
    """Three days of a conversation in two threads: a thinking bot's turns with tool
    calls, system messages, clears, saves, restores, budget changes; producer clocks
    that disagree (the recorded time decides)."""
    rng = random.Random(seed)
    out: list[ev.AnyEvent] = []
    common = {"agent": "alpha", "channel": channel}

    def add(cls: type[ev.Event], **fields: Any) -> None:
        out.append(cls(event_id=uuid7(), occurred_at=T0, **common, **fields))  # type: ignore[arg-type]

    for n in range(400):
        thread = rng.choice([None, None, "x"])
        roll = rng.random()
        if roll < 0.02:
            add(ev.ContextCleared)
        elif roll < 0.04:
            add(ev.SessionSaveRequested)
        elif roll < 0.05:
            add(ev.SessionRestoreRequested, session_id="last")
        elif roll < 0.06:
            add(ev.Configured, token_budget=rng.choice([800, 3000]))
        elif roll < 0.08:
            add(ev.MessagePosted, role="system", content=f"note {n}")
        add(
            ev.MessagePosted,
            thread=thread,
            role="user",
            content=f"q{n} " + "w " * rng.randrange(200),
        )
        call = {"type": "tool_use", "id": f"t{n}", "name": "lookup", "input": {}}
        think = {"type": "thinking", "thinking": f"think {n}", "signature": f"s{n}"}
        if rng.random() < 0.3:
            add(ev.MessagePosted, thread=thread, role="assistant", content=[think, call])
            result = {"type": "tool_result", "tool_use_id": f"t{n}", "content": "r " * 50}
            add(ev.MessagePosted, thread=thread, role="user", content=[result])
        answer = [think, {"type": "text", "text": "a " * rng.randrange(100)}]
        add(ev.MessagePosted, thread=thread, role="assistant", content=answer)
    return out


def _state(conn: psycopg.Connection[Any], channel: str) -> list[Any]:
    return conn.execute(
        "SELECT thread, seg_start, seg_base, seg_extra, seg_restored, seg_note, seg_summary,"
        " seg_threads, strip_through, boundaries, boundary, boundary_seq, window_tokens"
        " FROM threads WHERE agent = 'alpha' AND channel = %s ORDER BY thread",
        (channel,),
    ).fetchall()


def test_boundaries_do_not_depend_on_batching_and_rebuild_decides_them_again(db: str) -> None:
    """The same events, one batch each (a bot's turns) and in batches of up to 200 (a
    backlog, COPY): the same boundaries and contexts; and a rebuild gives them again."""
    from contextlog.worker.store.rebuild import rebuild

    rng = random.Random(7)
    clock = [T0]
    log = PostgresEventLog(psycopg.connect(db), now=lambda: clock[0])
    one, many = random_log(3, "one"), random_log(3, "many")
    n = 0
    while one:
        size = rng.choice([1, 1, 2, 30, 200])
        for e in one[:size]:
            n += 1
            log.append(0, n, entries([e]))
        n += 1
        log.append(0, n, entries(many[:size]))
        one, many = one[size:], many[size:]
        clock[0] += dt.timedelta(minutes=rng.randrange(1, 90))
    log.close()
    reader = ContextReader.from_url(db, defaults=ConversationDefaults())
    try:
        with psycopg.connect(db) as conn:
            before = (_state(conn, "one"), _state(conn, "many"))
            assert before[0] == before[1] and sum(r[9] for r in before[0]) > 5
            contexts = [reader.segment("alpha", "one", t).context for t in (None, "x")]
            assert contexts == [reader.segment("alpha", "many", t).context for t in (None, "x")]
            rebuild(conn)
            assert (_state(conn, "one"), _state(conn, "many")) == before
    finally:
        reader.close()


@pytest.fixture
def at_013(database_url: str) -> Iterator[str]:
    """A database of its own at 013 (the release before segments)."""
    name = f"contextlog_013_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(database_url, name)
    with psycopg.connect(url) as conn:
        migrate_layout(conn, upto=13)
    yield url
    drop_database(database_url, name)


def test_migration_014_gives_a_log_written_before_it_its_segments(at_013: str) -> None:
    """A conversation of three days written by the release before: after 014 its context
    is the rolling window as that release read it, and the next opening message decides
    the budget and the edge as ever after."""
    now = dt.datetime.now(dt.UTC)
    with psycopg.connect(at_013, autocommit=True) as conn:
        conn.execute("ALTER TABLE events DROP COLUMN IF EXISTS mark")
        rows = []
        for i in range(300):
            at = now - dt.timedelta(hours=72) + dt.timedelta(minutes=14 * i)
            role = "user" if i % 2 == 0 else "assistant"
            payload = f'{{"type": "message.v1", "role": "{role}", "content": "m{i} {"w " * 40}"}}'
            rows.append((uuid7(), i + 1, at, payload))
        for event_id, seq, at, payload in rows:
            conn.execute(
                "INSERT INTO events (event_id, agent, channel, thread, seq, kind, occurred_at,"
                " tokens, through, late, payload) VALUES (%s, 'alpha', 'general', '', %s,"
                " 'message.v1', %s, 21, %s * 21, false, %s)",
                (event_id, seq, at, seq, payload),
            )
        conn.execute(
            "INSERT INTO conversations (agent, channel, last_seq, last_activity_at)"
            " VALUES ('alpha', 'general', 300, %s)",
            (rows[-1][2],),
        )
        conn.execute(
            "INSERT INTO threads (agent, channel, thread, message_count, last_activity_at,"
            " tokens_through) VALUES ('alpha', 'general', '', 300, %s, 6300)",
            (rows[-1][2],),
        )
        assert migrate(conn) == ["014_segments", *later_than(14)]
    reader = ContextReader.from_url(at_013, defaults=ConversationDefaults())
    try:
        ctx = reader.context("alpha", "general")
        first = int(ctx.messages[0]["content"][0]["text"].split()[0].removeprefix("m"))
        assert (
            3 * 24 * 60 // 14 - 24 * 60 // 14 - 2 <= first <= 3 * 24 * 60 // 14 - 24 * 60 // 14 + 2
        )
        assert ctx.boundary is not None and ctx.boundary.kind == "upgrade"
        log = PostgresEventLog(
            psycopg.connect(at_013), defaults=ConversationDefaults(token_budget=500)
        )
        log.append(0, 1, entries([message(now, "after the upgrade")]))
        log.close()
        ctx = reader.context("alpha", "general")
        assert ctx.boundary is not None and ctx.boundary.kind == "budget"
        assert ctx.messages[-1]["content"][0]["text"] == "after the upgrade"
    finally:
        reader.close()
