"""One contract, two backends: the in-memory fake and Postgres must behave alike."""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import pq
from psycopg.rows import TupleRow

from contextlog.producers.ids import uuid7
from contextlog.schema import codec
from contextlog.schema import events as ev
from contextlog.schema.errors import Fenced, ShardBusy, StorageRefused
from contextlog.schema.queries import migrations
from contextlog.worker.store.eventlog import (
    FENCED,
    ONE_STATEMENT_MAX,
    Accepted,
    EventLog,
    MemoryEventLog,
    PostgresEventLog,
    bound_waits,
)
from contextlog.worker.store.migrations import migrate
from tests.support import properties
from tests.support.blocks import conversation

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


def accepted(
    channel: str = "general",
    text: str = "hi",
    entry: str = "1-0",
    event_id: uuid.UUID | None = None,
    thread: str | None = None,
) -> Accepted:
    event = ev.MessagePosted(
        event_id=event_id or uuid7(),
        agent="alpha",
        channel=channel,
        thread=thread,
        occurred_at=T0,
        role="user",
        content=text,
    )
    return Accepted(entry, event, codec.encode(event))


def seqs(log: EventLog, db_url: str | None) -> list[tuple[str, int, str]]:
    """(channel, seq, text) of everything stored, in seq order per channel."""
    if isinstance(log, MemoryEventLog):
        rows = [(a.event.channel, seq, getattr(a.event, "content", None)) for seq, a in log.rows]
    else:
        assert db_url is not None
        with psycopg.connect(db_url) as conn:
            rows = conn.execute("SELECT channel, seq, payload->>'content' FROM events").fetchall()
    return sorted(rows)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[EventLog, str | None]]:
    if request.param == "memory":
        yield MemoryEventLog(), None
        return
    url = request.getfixturevalue("db")
    log = PostgresEventLog(psycopg.connect(url))
    yield log, url
    log.close()


def test_append_assigns_per_conversation_sequence(backend: tuple[EventLog, str | None]) -> None:
    log, url = backend
    assert log.append(0, 1, [accepted("a", "1"), accepted("b", "x"), accepted("a", "2")]) == 3
    assert log.append(0, 1, [accepted("a", "3")]) == 1
    assert seqs(log, url) == [("a", 1, "1"), ("a", 2, "2"), ("a", 3, "3"), ("b", 1, "x")]


def test_append_is_idempotent_on_event_id(backend: tuple[EventLog, str | None]) -> None:
    log, url = backend
    batch = [accepted(text="1"), accepted(text="2")]
    assert log.append(0, 1, batch) == 2
    assert log.append(0, 1, batch) == 0  # the whole batch redelivered
    again = accepted(text="3")
    assert log.append(0, 1, [again, again, batch[0]]) == 1  # repeats inside one batch
    assert seqs(log, url) == [("general", 1, "1"), ("general", 2, "2"), ("general", 3, "3")]


def test_an_older_epoch_is_fenced(backend: tuple[EventLog, str | None]) -> None:
    log, url = backend
    log.append(2, 5, [accepted(text="new owner")])
    with pytest.raises(Fenced):
        log.append(2, 4, [accepted(text="stale owner")])
    log.append(3, 1, [accepted(text="other shard")])  # epochs are per shard
    assert log.epochs() == {2: 5, 3: 1}
    assert [r[2] for r in seqs(log, url)] == ["new owner", "other shard"]


def everything(db: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row a batch can write: the log, the projections, the checkpoints."""
    with psycopg.connect(db) as conn:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("events", "conversations", "threads", "shard_checkpoints")
        }


@pytest.mark.parametrize(
    "size", [1, 3, ONE_STATEMENT_MAX + 1], ids=["one", "one-statement", "copied"]
)
def test_a_fenced_batch_writes_nothing(
    db: str, size: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The fence fails the stale writer's transaction in SQL (SQLSTATE CL001, before
    anything else is written; a small batch's statement is its own transaction): no row,
    no projection or checkpoint change, no commit notification, no warning from psycopg;
    the connection goes on."""
    log = PostgresEventLog(psycopg.connect(db))
    listener = psycopg.connect(db, autocommit=True)
    log.append(2, 5, [accepted("general", "new owner", "5-0")])
    before = everything(db)
    listener.execute("LISTEN contextlog_commits")
    stale = [accepted("general", "stale", "4-0"), accepted("other", "stale", "4-1", thread="t")]
    stale += [accepted("general", f"stale {i}", f"4-{i + 2}") for i in range(size - 2)]
    with caplog.at_level(logging.WARNING, logger="psycopg"):
        for _ in range(5):
            with pytest.raises(Fenced) as fenced:
                log.append(2, 4, stale[:size])
            assert isinstance(fenced.value.__cause__, psycopg.Error)
            assert fenced.value.__cause__.sqlstate == FENCED
    assert caplog.records == []
    assert everything(db) == before
    assert list(listener.notifies(timeout=0.2)) == []  # rolled back: nothing committed
    assert log.append(2, 5, [accepted("general", "owner again", "6-0")]) == 1
    assert len(list(listener.notifies(timeout=5, stop_after=1))) == 1
    assert [r[2] for r in seqs(log, db)] == ["new owner", "owner again"]
    listener.close()
    log.close()


def round_trips(conn: psycopg.Connection[TupleRow], action: Callable[[], object]) -> int:
    """How many times `action` sends to the server and then waits for its answers, from
    libpq's protocol trace (the server answers only at a Sync or Flush, so each turn
    from frontend to backend messages is one round trip)."""
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            action()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        sides = [line[0] for line in trace if line[:2] in ("F\t", "B\t")]
    return sum(1 for a, b in itertools.pairwise(sides) if (a, b) == ("F", "B"))


def test_a_bot_turn_commits_in_one_round_trip(db: str) -> None:
    """A one-event append (and a small batch of several conversations and threads) is
    one round trip: one statement, its own transaction. The connection's first append
    prepares that statement, a round trip of its own, once."""
    log = PostgresEventLog(psycopg.connect(db))
    for i in range(7):
        one = [accepted("general", f"turn {i}", f"{i}-0")]
        trips = round_trips(log.conn, functools.partial(log.append, 0, 1, one))
        assert trips == (2 if i == 0 else 1)
    several = mixed("rt-", 9)
    assert round_trips(log.conn, functools.partial(log.append, 0, 1, several)) == 1
    with psycopg.connect(db) as reader:  # committed: visible to another session
        row = reader.execute("SELECT count(*) FROM events").fetchone()
    assert row == (7 + len(several),)
    log.close()


def test_a_writer_stalled_inside_its_transaction_holds_the_shard_only_briefly(db: str) -> None:
    """A frozen owner keeps its batch's transaction, and the shard's checkpoint lock, open.
    Its successor's write gives up after a third of the lease with ShardBusy (it must go on
    renewing its leases), and the server ends a transaction idle past the lease."""
    stalled = psycopg.connect(db)
    bound_waits(stalled, lease_seconds=0.6)
    successor = PostgresEventLog(psycopg.connect(db))
    bound_waits(successor.conn, lease_seconds=0.6)
    assert successor.append(1, 1, [accepted(text="before")]) == 1
    stalled.execute("SELECT * FROM shard_checkpoints WHERE shard = 1 FOR UPDATE")
    waited = time.monotonic()
    with pytest.raises(ShardBusy):
        successor.append(1, 2, [accepted(text="blocked")])
    assert 0.15 < time.monotonic() - waited < 2.0  # lock_timeout: a third of 0.6 s
    assert successor.append(2, 1, [accepted(text="other shard")]) == 1  # not blocked
    idle = stalled.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    assert idle == ("5s",)  # the floor: a lease this short would cut real batches
    stalled.rollback()
    assert successor.append(1, 2, [accepted(text="after")]) == 1  # nothing was half-written
    assert [r[2] for r in seqs(successor, db)] == ["before", "other shard", "after"]
    stalled.close()
    successor.close()


def test_postgres_refusal_is_translated_and_rolls_back(db: str) -> None:
    log = PostgresEventLog(psycopg.connect(db))
    good = accepted(text="good")
    bad_event = ev.MessagePosted(
        event_id=uuid7(), agent="alpha", channel="general", occurred_at=T0, role="user", content="x"
    )
    # Bytes the contract would never pass (jsonb refuses NUL): the database says no.
    bad = Accepted("2-0", bad_event, b'{"content": "\\u0000"}')
    with pytest.raises(StorageRefused):
        log.append(0, 1, [good, bad])
    assert log.append(0, 1, [good]) == 1  # nothing of the failed batch was kept
    log.close()


def migrate_concurrently(url: str, runs: int = 4) -> tuple[list[list[str]], list[BaseException]]:
    """Run `migrate` from `runs` threads at once; what each applied, and any errors."""
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(url) as conn:
                results.append(migrate(conn))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def test_migrate_is_idempotent_and_safe_in_parallel(database_url: str) -> None:
    from tests.support.services import create_database, drop_database

    name = f"contextlog_migrate_{uuid.uuid4().hex[:8]}"
    url = create_database(database_url, name)  # already migrated once
    results, errors = migrate_concurrently(url)
    drop_database(database_url, name)
    assert errors == [] and results == [[], [], [], []]


def test_migrate_in_parallel_on_an_empty_database(database_url: str) -> None:
    from tests.support.services import drop_database, with_database

    name = f"contextlog_empty_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    results, errors = migrate_concurrently(with_database(database_url, name))
    drop_database(database_url, name)
    every = [f"{m.version:03d}_{m.name}" for m in migrations()]
    assert errors == [] and sorted(results, key=len) == [[], [], [], every]


def test_text_that_copy_would_misread_is_stored_verbatim(db: str) -> None:
    log = PostgresEventLog(psycopg.connect(db))
    tricky = "tab\there\nnew line\r\\N back\\slash \\t literal ☃"
    event = ev.MessagePosted(
        event_id=uuid7(),
        agent="a\\gent",
        channel="chan\\nel",
        thread="th\\read",
        occurred_at=T0,
        role="user",
        content=tricky,
    )
    # A producer may send JSON with whitespace between tokens; it must survive too.
    payload = codec.encode(event).replace(b'","', b'",\n\t"')
    assert log.append(0, 1, [Accepted("1-0", codec.decode(payload), payload)]) == 1
    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT agent, channel, thread, payload->>'content' FROM events"
        ).fetchone()
    assert row == ("a\\gent", "chan\\nel", "th\\read", tricky)
    log.close()


def test_a_log_holding_a_year_9999_activity_still_takes_messages(db: str) -> None:
    """Before times were bounded, a message dated 9999 could be stored; with a later
    configure(idle_timeout=...) every message of that conversation overflowed
    last activity + timeout and crashed ingest. Old logs like that keep working."""
    log = PostgresEventLog(psycopg.connect(db))
    far = ev.MessagePosted(
        event_id=uuid7(),
        agent="alpha",
        channel="general",
        role="user",
        content="x",
        occurred_at=dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.UTC),
    )
    assert log.append(0, 1, [Accepted("1-0", far, codec.encode(far))]) == 1
    configure = ev.Configured(
        event_id=uuid7(), agent="alpha", channel="general", occurred_at=T0, idle_timeout=7200
    )
    assert log.append(0, 1, [Accepted("2-0", configure, codec.encode(configure))]) == 1
    assert log.append(0, 1, [accepted(text="after", entry="3-0")]) == 1
    log.close()


def mixed(prefix: str, entry: int) -> list[Accepted]:
    """Three conversations interleaved, in two threads, with text COPY would misread."""
    layout = [("a", None), ("b", "t1"), ("a", "t1"), ("c", None), ("b", None), ("a", None)]
    return [
        accepted(f"{prefix}{c}", f"{c} {i}\twith 'quote', \\ and ünïcode", f"{entry}-{i}", thread=t)
        for i, (c, t) in enumerate(layout)
    ]


def stored(db: str, prefix: str) -> dict[str, list[tuple[object, ...]]]:
    """What a conversation-prefixed part of the log and its projections hold, by the
    conversations' names without the prefix, rows in log order (position)."""
    n = len(prefix)
    with psycopg.connect(db) as conn:
        out = {
            name: [(r[0][n:], *r[1:]) for r in conn.execute(sql, (prefix + "%",)).fetchall()]
            for name, sql in (
                (
                    "events",
                    "SELECT channel, seq, thread, kind, occurred_at, tokens,"
                    " payload->'content' FROM events WHERE channel LIKE %s ORDER BY position",
                ),
                (
                    "conversations",
                    "SELECT channel, last_seq, last_message_seq, last_activity_at"
                    " FROM conversations WHERE channel LIKE %s ORDER BY channel",
                ),
                (
                    "threads",
                    "SELECT channel, thread, message_count, window_tokens FROM threads"
                    " WHERE channel LIKE %s ORDER BY channel, thread",
                ),
            )
        }
    return out


def test_a_small_batch_in_one_statement_stores_what_a_copied_large_one_does(db: str) -> None:
    """A batch of a few messages is INSERTed by one statement, numbered in SQL, a large
    one COPYed, numbered in Python: same rows, sequence numbers (after a history, across
    conversations and threads mixed in one batch), log order, token counts and
    projections; and the same numbers as the in-memory contract's."""
    history = [("a", None), ("a", "t1"), ("b", None)]
    log = PostgresEventLog(psycopg.connect(db), now=lambda: T0)  # one time: comparable
    memory = MemoryEventLog()
    try:
        for prefix in ("small-", "large-"):
            first = [accepted(f"{prefix}{c}", "old", "1-0", thread=t) for c, t in history]
            assert log.append(0, 1, first) == 3
        memory.append(0, 1, [accepted(f"small-{c}", "old", "1-0", thread=t) for c, t in history])
        small = mixed("small-", 2)
        filler = [accepted("filler", "x", f"9-{i}") for i in range(ONE_STATEMENT_MAX)]
        assert log.append(0, 1, small) == 6
        assert log.append(1, 1, mixed("large-", 2) + filler) == 6 + ONE_STATEMENT_MAX
        assert memory.append(0, 1, small) == 6
        assert log.append(0, 1, small[:1]) == 0  # a redelivery: absorbed, not doubled
    finally:
        log.close()
    by_small, by_large = stored(db, "small-"), stored(db, "large-")
    assert by_small == by_large
    assert [r[:2] for r in by_small["events"]] == [
        *[("a", 1), ("a", 2), ("b", 1)],  # the history
        # The batch grouped by conversation (a round, as the fold sees it).
        *[("a", 3), ("a", 4), ("a", 5), ("b", 2), ("b", 3), ("c", 1)],
    ]
    in_memory = sorted((a.event.channel[len("small-") :], seq) for seq, a in memory.rows)
    assert in_memory == sorted(r[:2] for r in by_small["events"])
    assert by_small["conversations"] == [("a", 5, 5, T0), ("b", 3, 3, T0), ("c", 1, 1, T0)]


def test_an_event_id_is_unique_within_its_conversation(
    backend: tuple[EventLog, str | None],
) -> None:
    """The guard's key is (event id, conversation) since the log is partitioned by
    conversation (007): a redelivery carries its conversation and is absorbed, while
    the same id in another conversation (a platform message id unique only per chat,
    derived into an event id) is another event, stored there."""
    log, url = backend
    shared = uuid7()
    assert log.append(0, 1, [accepted("a", "in a", event_id=shared)]) == 1
    assert log.append(0, 1, [accepted("b", "in b", event_id=shared)]) == 1
    batch = [accepted("a", "again", event_id=shared), accepted("b", "b2")]
    assert log.append(0, 1, batch) == 1  # a redelivery to a, and a new event in b
    assert seqs(log, url) == [("a", 1, "in a"), ("b", 1, "in b"), ("b", 2, "b2")]


def test_the_compaction_threshold_of_ingest_is_the_jobs(db: str) -> None:
    """Ingest's trigger (`advance_segments`) and the job's choice of threads
    (`threads_to_compact`) read one constant: a segment at exactly the threshold does not
    compact, one token more does, in both."""
    from contextlog.producers.context import COMPACT_AT
    from contextlog.schema.defaults import ConversationDefaults
    from contextlog.schema.queries import query
    from contextlog.worker.store import projection

    budget = 1000
    at = int(COMPACT_AT * budget)
    defaults = ConversationDefaults(token_budget=budget)
    with psycopg.connect(db) as conn, conn.cursor() as cur:
        for channel, tokens in (("at", at), ("over", at + 1)):
            row = projection.Row("alpha", channel, "", projection.MESSAGE, T0, None, tokens, None)
            convs, threads = projection.fold([row])
            projection.apply(cur, convs, threads, defaults)
            compacts = projection.segments(cur, convs, threads, defaults) == [("alpha", channel)]
            params = {
                "agent": "alpha",
                "channel": channel,
                "default_budget": budget,
                "compact_at": COMPACT_AT,
            }
            chosen = cur.execute(query("threads_to_compact"), params).fetchall() != []
            assert compacts == chosen == (channel == "over")


def test_both_write_paths_store_the_instant_an_event_names_in_any_offset(db: str) -> None:
    """COPY writes times as msgspec encodes them ("Z", or the event's own offset), the
    one-statement path as psycopg adapts them: either way the stored time is the instant."""
    log = PostgresEventLog(psycopg.connect(db))
    kolkata = dt.timezone(dt.timedelta(hours=5, minutes=30))
    times = [
        dt.datetime(2026, 11, 22, 17, 30, 0, 123456, tzinfo=kolkata),
        dt.datetime(2026, 11, 22, 12, 0, 0, 1, tzinfo=dt.UTC),
        dt.datetime(1, 1, 1, 0, 0, tzinfo=dt.UTC),
    ]

    def posted(at: dt.datetime, entry: str) -> Accepted:
        event = ev.MessagePosted(
            event_id=uuid7(), agent="alpha", channel="general", role="user", content=entry,
            occurred_at=at,
        )  # fmt: skip
        return Accepted(entry, event, codec.encode(event))

    copied = [posted(at, f"1-{i}") for i, at in enumerate(times)]
    filler = [posted(times[1], f"2-{i}") for i in range(ONE_STATEMENT_MAX)]  # COPY: too many
    assert log.append(0, 1, copied + filler) == len(times) + ONE_STATEMENT_MAX
    one = [posted(at, f"3-{i}") for i, at in enumerate(times[:1])]  # one statement: one message
    assert log.append(0, 1, one) == 1
    log.close()
    with psycopg.connect(db) as conn:
        stored: dict[str, dt.datetime] = dict(
            conn.execute("SELECT payload->>'content', occurred_at FROM events")
        )
    assert [stored[f"1-{i}"] for i in range(len(times))] == times
    assert stored["3-0"] == times[0]


@settings(
    max_examples=properties.examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(convo=conversation(True), blank=st.sampled_from(["", " ", "\n\t", "x"]))
def test_the_mark_of_a_message_stored_before_014_is_the_one_ingest_gives(
    db: str, convo: list[tuple[str, Any]], blank: str
) -> None:
    """`contextlog_mark_of` (SQL, for rows without a mark) and `rows.mark_of` (ingest)
    agree on every message a bot posts, blanks and compaction blocks included."""
    from contextlog.worker.store.rows import mark_of

    block = {"type": "compaction", "content": "summary"}
    convo = [*convo, ("user", blank), ("assistant", [block, {"type": "text", "text": "a"}])]
    convo.append(("assistant", [{"type": "compaction", "content": None}]))
    with psycopg.connect(db) as conn:
        for role, content in convo:
            event = ev.MessagePosted(
                event_id=uuid7(),
                agent="a",
                channel="c",
                occurred_at=T0,
                role=role,  # type: ignore[arg-type]
                content=content,
            )
            payload = codec.encode(event)
            row = conn.execute(
                "SELECT contextlog_mark_of('message.v1', %s::jsonb)", (payload.decode(),)
            ).fetchone()
            assert row is not None and (row[0] or 0) == mark_of(codec.decode(payload)), content
