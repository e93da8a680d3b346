"""The running token totals (migration 009, issue 12.2): every message stored by either
write path carries its thread's total, a first read finds its cut from them and reads
the rows it keeps, and whatever the log holds (messages out of time order, clears,
compactions, rows older than 009 or from a writer that does not write totals) it keeps
the very rows, with the very sums, that summing the whole window gives."""

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
from contextlog.producers.reader import rolling_cutoff, window_params
from contextlog.schema import codec
from contextlog.schema import events as ev
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.queries import query
from contextlog.worker.store.eventlog import Accepted, PostgresEventLog
from contextlog.worker.store.migrations import migrate
from tests.integration.test_context_cache import events_rows_scanned
from tests.support.services import OWN_TABLES, drop_database, migrate_layout, with_database

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
    return [Accepted(f"{i}-0", e, codec.encode(e)) for i, e in enumerate(events, 1)]


def stored_rows(conn: psycopg.Connection[Any], channel: str = "general") -> list[Any]:
    return conn.execute(
        "SELECT seq, thread, kind, occurred_at, tokens, through, late FROM events"
        " WHERE agent = 'alpha' AND channel = %s ORDER BY seq",
        (channel,),
    ).fetchall()


def test_each_message_carries_its_threads_running_total(db: str) -> None:
    """Batches of one (one statement), of many (COPY), with a command (rounds) and with a
    setting (one statement: a setting is not a command): each message's `through` is its
    thread's tokens up to it, `late` says whether a message before it in the thread is
    later in time."""
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
    latest: dict[str, dt.datetime] = {}
    lates = 0
    for seq, thread, kind, occurred_at, tokens, through, late in rows:
        if kind != "message.v1":
            assert (through, late) == (None, False), seq
            continue
        running[thread] = running.get(thread, 0) + tokens
        expected_late = thread in latest and occurred_at < latest[thread]
        assert (through, late) == (running[thread], expected_late), seq
        lates += late
        if not late:
            latest[thread] = occurred_at
    assert lates == 3 and totals == running


def oracle(
    conn: psycopg.Connection[Any], thread: str, now: dt.datetime, budget: int
) -> tuple[list[tuple[int, int]], int]:
    """The kept rows (seq, tokens of the window before it) and the cut, by the rule
    (`window_messages`' header) applied in Python to every row of the log."""
    cleared = conn.execute(
        "SELECT cleared_seq FROM conversations WHERE agent = 'alpha' AND channel = 'general'"
    ).fetchone()
    compacted = conn.execute(
        "SELECT compacted_through_seq FROM threads"
        " WHERE agent = 'alpha' AND channel = 'general' AND thread = %s",
        (thread,),
    ).fetchone()
    low = max(cleared[0] if cleared else 0, compacted[0] if compacted else 0)
    cutoff = rolling_cutoff(now, DAY)
    window = [
        (seq, tokens)
        for seq, th, kind, occurred_at, tokens, _, _ in stored_rows(conn)
        if th == thread and kind == "message.v1" and occurred_at >= cutoff and seq > low
    ]
    total = sum(tokens for _, tokens in window)
    step = max(1, budget // 2)
    at = 0 if total <= budget else (total - budget + step - 1) // step * step
    kept, before = [], 0
    for i, (seq, tokens) in enumerate(window):
        if before >= at or i == len(window) - 1:
            kept.append((seq, before))
        before += tokens
    return kept, at


def read(
    conn: psycopg.Connection[Any], thread: str, now: dt.datetime, budget: int, bounded: bool
) -> tuple[list[tuple[int, int]], int]:
    defaults = ConversationDefaults(token_budget=budget)
    params = window_params("alpha", "general", thread, now, defaults, bounded=bounded)
    rows = conn.execute(query("window_messages"), params).fetchall()
    return [(r[0], r[5]) for r in rows], (rows[0][8] if rows else 0)


def random_log(db: str, seed: int, imports: float) -> list[dt.datetime]:
    """A few hundred messages over ~40 hours in two threads, in batches of 1 to 120 (both
    write paths): most in time order, some late by seconds (clocks that disagree), a share
    `imports` by hours (below the edge); now and then a clear, a compaction. Returns the
    times to read at."""
    rng = random.Random(seed)
    log = PostgresEventLog(psycopg.connect(db))
    at, n, batch_no = T0, 0, 0
    while at < T0 + dt.timedelta(hours=40):
        batch: list[ev.AnyEvent] = []
        for _ in range(rng.choice([1, 1, 2, 5, 70, 120])):
            at += dt.timedelta(seconds=rng.randrange(60, 900))
            roll, n = rng.random(), n + 1
            stamp = at
            if roll < 0.15:
                stamp = at - dt.timedelta(seconds=rng.randrange(1, 30))
            elif roll < 0.15 + imports:
                stamp = at - dt.timedelta(hours=rng.randrange(2, 30))
            if roll > 0.99:
                batch.append(
                    ev.ContextCleared(
                        event_id=uuid7(), agent="alpha", channel="general", occurred_at=at
                    )
                )
            text = f"m{n} " + "words " * rng.randrange(1, 200)
            batch.append(message(stamp, text, thread=rng.choice([None, None, "x"])))
        batch_no += 1
        log.append(0, batch_no, entries(batch))
        if rng.random() < 0.05:  # a compaction job's outcome: the window starts after it
            with psycopg.connect(db) as conn:
                conn.execute(
                    "UPDATE threads SET compacted_through_seq = (SELECT max(seq) - %s FROM"
                    " events WHERE agent = 'alpha' AND channel = 'general')"
                    " WHERE agent = 'alpha' AND channel = 'general'",
                    (rng.randrange(0, 40),),
                )
    log.close()
    return [T0 + dt.timedelta(hours=h, minutes=rng.randrange(60)) for h in (12, 25, 33, 40)]


@pytest.mark.parametrize(("seed", "imports"), [(0, 0.03), (1, 0.03), (2, 0.0), (3, 0.0)])
def test_a_first_read_keeps_what_summing_the_window_keeps(
    db: str, seed: int, imports: float
) -> None:
    """Against the rule applied in Python. With messages hours late (most windows hold
    one below their edge) the window is summed; with messages seconds late only, most
    first reads find the cut from the totals (fewer rows read than the window holds)."""
    times = random_log(db, seed, imports)
    compared = fast = 0
    with psycopg.connect(db, autocommit=True) as conn:
        for now in times:
            for thread in ("", "x"):
                for budget in (700, 4_000, 10**9):
                    expected = oracle(conn, thread, now, budget)
                    for bounded in (True, False):
                        got = read(conn, thread, now, budget, bounded)
                        if bounded or budget == 10**9:
                            assert got == expected, (now, thread, budget, bounded)
                        compared += 1
                    window = len(oracle(conn, thread, now, 10**9)[0])
                    if window >= 30 and len(expected[0]) * 3 < window:
                        params = window_params(
                            "alpha",
                            "general",
                            thread,
                            now,
                            ConversationDefaults(token_budget=budget),
                            bounded=True,
                        )
                        fast += events_rows_scanned(conn, params) < window
    assert compared == len(times) * 2 * 3 * 2 and (fast > 0 or imports > 0)


@pytest.fixture
def at_008(database_url: str) -> Iterator[str]:
    """A database of its own at 008 (the release before the running totals)."""
    name = f"contextlog_008_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(database_url, name)
    with psycopg.connect(url) as conn:
        migrate_layout(conn, upto=8)
    yield url
    drop_database(database_url, name)


def test_migration_009_on_a_log_written_before_it(at_008: str) -> None:
    """A log written by the release before (no totals): 009 counts each thread's total, it
    reads as before, new messages go on from the total, and a row a writer of the
    release before adds during the upgrade (no total; `late` by default) is read right."""
    log = PostgresEventLog(psycopg.connect(at_008))
    old = [message(T0 + dt.timedelta(minutes=i), f"old {i} " + "w " * 30) for i in range(300)]
    log.append(0, 1, entries(old))
    log.close()
    with psycopg.connect(at_008, autocommit=True) as conn:
        # As 008 left the log: the columns today's writer wrote for the fill, gone.
        conn.execute("ALTER TABLE events DROP COLUMN through, DROP COLUMN late")
        conn.execute("ALTER TABLE threads DROP COLUMN tokens_through")
        assert migrate(conn) == ["009_running_totals", *OWN_TABLES]
        now = T0 + dt.timedelta(hours=5)
        for budget in (500, 10**9):  # rows without totals: the window is summed
            assert read(conn, "", now, budget, True) == oracle(conn, "", now, budget)
        total = sum(r[4] for r in stored_rows(conn))
        (through,) = conn.execute("SELECT tokens_through FROM threads").fetchone() or (0,)
        assert through == total
    log = PostgresEventLog(psycopg.connect(at_008))
    new = [
        message(T0 + dt.timedelta(hours=30, minutes=i), f"new {i} " + "w " * 30) for i in range(300)
    ]
    log.append(0, 2, entries(new[:150]))
    with psycopg.connect(at_008, autocommit=True) as conn:
        # A writer of the release before: the columns it knows, `seq` after the last.
        conn.execute(
            "INSERT INTO events (event_id, agent, channel, thread, seq, kind, occurred_at,"
            " tokens, payload) VALUES (%s, 'alpha', 'general', '', 451, 'message.v1', %s, 40,"
            ' \'{"type": "message.v1", "role": "user", "content": "from 008"}\')',
            (uuid7(), T0 + dt.timedelta(hours=32)),
        )
        conn.execute(
            "UPDATE conversations SET last_seq = 451 WHERE agent = 'alpha' AND channel = 'general'"
        )
    log.append(0, 3, entries(new[150:]))
    log.close()
    with psycopg.connect(at_008, autocommit=True) as conn:
        rows = stored_rows(conn)
        assert [r[6] for r in rows[:300]] == [None] * 300 and rows[450][5:] == (None, True)
        assert [r[5] for r in rows[300:450]] == [
            total + sum(r[4] for r in rows[300 : i + 1]) for i in range(300, 450)
        ]
        for hours in (31, 33, 56, 57):  # the old writer's row inside, then below the edge
            now = T0 + dt.timedelta(hours=hours)
            for budget in (500, 3_000, 10**9):
                assert read(conn, "", now, budget, True) == oracle(conn, "", now, budget)
        # A window that starts after the row without a total reads from the totals.
        now = T0 + dt.timedelta(hours=57)
        params = window_params(
            "alpha", "general", None, now, ConversationDefaults(token_budget=500), bounded=True
        )
        window = len(oracle(conn, "", now, 10**9)[0])
        assert window > 100 and events_rows_scanned(conn, params) < window


def test_a_first_read_of_a_reader_is_the_read_of_the_whole_window(db: str) -> None:
    """The reader end to end: the context a reader with no hints builds is the one a
    reader that holds every earlier read's rows builds, with late messages about."""
    log = PostgresEventLog(psycopg.connect(db))
    hinted = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=2_000))
    for i in range(120):
        at = T0 + dt.timedelta(minutes=15 * i)
        stamp = at - dt.timedelta(seconds=5) if i % 9 == 4 else at
        role = "user" if i % 2 == 0 else "assistant"
        log.append(0, i + 1, entries([message(stamp, f"turn {i} " + "w " * 90, role=role)]))
        fresh = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=2_000))
        now = at + dt.timedelta(minutes=1)
        assert hinted.context("alpha", "general", now=now) == fresh.context(
            "alpha", "general", now=now
        ), i
        fresh.close()
    hinted.close()
    log.close()
