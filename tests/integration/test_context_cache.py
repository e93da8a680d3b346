"""A context that keeps the prompt cache warm, read from Postgres: consecutive reads
share their whole earlier prefix, trims move the start in coarse steps, the bounded
fetch gives the same context as assembling the whole window, and the real client
accepts the request with the bot's own system prompt, tools and breakpoints."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import psycopg

from contextlog.producers import AsyncContextReader, ContextReader
from contextlog.producers.context import build_context
from contextlog.producers.reader import rolling_cutoff, stored, window_params, window_query
from contextlog.producers.tails import NO_HINT, fill
from contextlog.schema import events as ev
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.queries import query
from tests.integration.test_context import HOUR, NOW, Log, client, log, reader, result, texts
from tests.support.anthropic_rules import check_messages, check_params
from tests.support.blocks import thinking, use
from tests.support.services import truncate

__all__ = ["log", "reader"]  # fixtures
MINUTE = dt.timedelta(minutes=1)
TOOLS = [{"name": "lookup", "description": "Look up.", "input_schema": {"type": "object"}}]


def turn(lg: Log, i: int, at: dt.datetime, thread: str | None = None) -> None:
    """One exchange of a thinking, tool-using bot (every third turn calls a tool)."""
    lg.say("user", f"question {i} " + "words " * 80, at, thread=thread)
    if i % 3 == 0:
        lg.say("assistant", [thinking(str(i)), use(f"t{i}")], at, thread=thread)
        lg.say("user", [result(f"t{i}")], at, thread=thread)
    lg.say("assistant", [thinking(f"{i}b"), {"type": "text", "text": f"answer {i}"}], at,
           thread=thread)  # fmt: skip


def test_consecutive_reads_share_the_earlier_prefix_byte_for_byte(
    log: Log, reader: ContextReader
) -> None:
    log.add(ev.Configured, NOW - 300 * MINUTE, token_budget=3_000)
    api, previous, steps = client(), None, 0
    for i in range(120):
        at = NOW - (240 - 2 * i) * MINUTE
        turn(log, i, at)
        turn(log, i, at, thread="other")  # a second thread, active all along
        log.say("user", f"next {i}", at)
        ctx = reader.context("alpha", "general", now=at + MINUTE)
        assert ctx.token_estimate <= 3_000
        kw = ctx.to_anthropic(system="You are a bot.", tools=TOOLS, cache=True)
        assert check_params(kw) == [] and check_messages(kw["messages"], thinking=True) == []
        api.messages.create(model="m", max_tokens=4096,
                            thinking={"type": "enabled", "budget_tokens": 2048}, **kw)  # fmt: skip
        plain = json.dumps([ctx.system, ctx.messages[:-1]])
        if previous is not None and not plain.startswith(previous[:-2]):
            steps += 1
        previous = json.dumps([ctx.system, ctx.messages[:-1]])
        log.say("assistant", f"reply {i}", at + MINUTE)
    assert 0 < steps <= 12, steps  # ~150 tokens a turn, a 1,500-token step


def test_the_bounded_fetch_gives_the_context_of_the_whole_window(db: str) -> None:
    lg = Log(db)
    for i in range(150):
        turn(lg, i, NOW - (300 - i) * MINUTE)
    lg.log.close()
    for budget in (400, 2_000, 7_000, 10**9):
        r = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=budget))
        ctx = r.context("alpha", "general", now=NOW)
        params = window_params("alpha", "general", None, NOW, r.defaults)
        with psycopg.connect(db) as conn:
            rows: list[Any] = conn.execute(query("window_messages"), params).fetchall()
            cut = conn.execute(query("window_messages"), {**params, "bounded": True}).fetchall()
        r.close()
        whole = build_context(stored(rows), budget=budget)
        assert ctx.messages == whole.messages and ctx.truncated == whole.truncated, budget
        assert ctx.token_estimate <= budget or len(ctx.messages) <= 4
        if budget < 10**9:
            assert len(cut) < len(rows) / 2  # rows that cannot fit are not fetched


def test_the_rolling_edge_moves_in_steps_the_sql_and_python_agree(db: str, log: Log) -> None:
    """Messages a minute apart over 26 hours: reads during one step of the edge (1/24 of
    the window: an hour) all start at the same message, the one the step's start names."""
    r = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=10**9))
    for i in range(0, 26 * 60, 20):
        log.say("user" if i % 40 == 0 else "assistant", f"m{i}", NOW - (26 * 60 - i) * MINUTE)
    firsts = set()
    for minutes in range(0, 60, 7):  # NOW is on an hour: one step
        now = NOW + minutes * MINUTE
        ctx = r.context("alpha", "general", now=now)
        assert ctx.window_start == rolling_cutoff(now, 86_400) == NOW - 24 * HOUR
        firsts.add(json.dumps(ctx.messages[0]))
    later = r.context("alpha", "general", now=NOW + 60 * MINUTE)
    r.close()
    assert len(firsts) == 1 and json.dumps(later.messages[0]) not in firsts


def test_the_window_start_has_one_rule_in_sql_and_python(db: str) -> None:
    """`contextlog_window_start` (every query's edge) is `rolling_cutoff`, whatever the
    window length and the time of the read."""
    windows = [1, 23, 24, 25, 60, 3_599, 3_600, 86_400, 86_401, 604_800]
    times = [NOW + dt.timedelta(seconds=s) for s in (0, 1, 59, 3_599, 3_600, 12_345, 86_399)]
    with psycopg.connect(db) as conn:
        for window in windows:
            for now in times:
                (got,) = conn.execute(
                    "SELECT contextlog_window_start(%s, %s)", (now, window)
                ).fetchone()  # type: ignore[misc]
                assert got == rolling_cutoff(now, window), (window, now)


def test_the_reads_inline_the_window_rules(db: str, log: Log) -> None:
    """The window's rules are SQL functions (006, 011) that the planner inlines into each
    read: no read calls one at run time (a function call Postgres cannot inline runs the
    SQL function executor, which sets its body up afresh for each call site on every
    execution: 013)."""
    log.say("user", "hello", NOW - HOUR)
    r = ContextReader.from_url(db)
    r.context("alpha", "general", now=NOW)  # learns a hint, so window_tail has one
    hinted, _ = r.tails.hint(window_params("alpha", "general", None, NOW, r.defaults))
    r.close()
    plain = window_params("alpha", "general", None, NOW, r.defaults, bounded=True)
    reads = [(name, plain) for name in ("conversation_state", "window_messages", "active_threads")]
    with psycopg.connect(db) as conn:
        for name, params in [*reads, ("window_tail", hinted)]:
            plan = conn.execute("EXPLAIN VERBOSE " + query(name), params).fetchall()
            called = [line for (line,) in plan if "contextlog_" in line]
            assert not called, (name, called)


def test_the_thread_list_follows_the_same_edge_as_the_messages(db: str, log: Log) -> None:
    """Between the floored edge and `now - window`, messages are still in the window, and a
    thread active there is listed in the preamble too (the thread list, like a restore's
    visibility and saves, used the unfloored edge: for up to an hour the preamble and the
    messages disagreed)."""
    r = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=10**9))
    now = NOW + 30 * MINUTE  # the edge is floored to NOW - 24 h
    log.say("user", "main line, kept", NOW - 24 * HOUR + 5 * MINUTE)
    log.say("user", "side thread, quiet since", NOW - 24 * HOUR + 10 * MINUTE, thread="side")
    ctx = r.context("alpha", "general", now=now)
    r.close()
    assert ctx.window_start == NOW - 24 * HOUR
    assert [m["content"] for m in ctx.messages] == [[{"type": "text", "text": "main line, kept"}]]
    assert ctx.system is not None and "- thread side" in ctx.system


def test_a_newest_exchange_over_the_budget_is_still_read_whole(db: str, log: Log) -> None:
    """The budget's cut lands inside the newest exchange (no turn to start at in the
    fetched rows): the reader fetches the whole window and keeps that exchange, valid."""
    log.add(ev.Configured, NOW - 10 * MINUTE, token_budget=300)
    log.say("user", "small question", NOW - 9 * MINUTE)
    log.say("assistant", "small answer", NOW - 9 * MINUTE)
    log.say("user", "big question", NOW - 8 * MINUTE)
    log.say("assistant", [thinking("1"), use("a")], NOW - 8 * MINUTE)
    log.say("user", [{**result("a"), "content": "x" * 4000}], NOW - 7 * MINUTE)

    async def read_async() -> Any:
        r = AsyncContextReader.from_url(db)
        try:
            return await r.context("alpha", "general", now=NOW)
        finally:
            await r.aclose()

    r = ContextReader.from_url(db)
    for ctx in (r.context("alpha", "general", now=NOW), asyncio.run(read_async())):
        assert ctx.messages[0]["content"] == [{"type": "text", "text": "big question"}]
        assert check_messages(ctx.messages, thinking=True) == [] and ctx.truncated
    r.close()


def fresh_context(db: str, now: dt.datetime, thread: str | None = None) -> Any:
    """The context a reader with no tail hints reads (it sums the whole window)."""
    r = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=3_000))
    try:
        return r.context("alpha", "general", thread, now=now)
    finally:
        r.close()


def test_reads_from_the_tail_hint_equal_reads_of_the_whole_window(db: str, log: Log) -> None:
    """One reader, reading every turn from its last read's hint (its last row), against a reader
    with no hints, while the window grows past the budget, its edge moves, a clear, a
    restore and a second thread come and go, and the budget grows."""
    hinted = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=3_000))
    start = NOW - 30 * HOUR
    for i in range(200):
        at = start + i * 9 * MINUTE
        turn(log, i, at, thread="other" if i % 7 == 0 else None)
        if i == 120:
            log.add(ev.SessionSaveRequested, at, description="first part")
            log.add(ev.ContextCleared, at)
        if i == 150:
            log.add(ev.SessionRestoreRequested, at, session_id="last")
        if i == 185:  # a bigger budget: the kept part starts earlier than the last read's
            log.add(ev.Configured, at, token_budget=6_000)
        for thread in (None, "other"):
            got = hinted.context("alpha", "general", thread, now=at + MINUTE)
            assert got == fresh_context(db, at + MINUTE, thread), (i, thread)
    assert len(hinted.tails._last) == 2
    hinted.close()


def test_a_stale_hint_for_a_log_written_again_is_ignored(db: str, log: Log) -> None:
    """The log emptied and written again (a conversation retired, then new): the same
    window key and seqs, other events. The hint names its event, so it is not used."""
    r = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=3_000))
    for i in range(60):
        turn(log, i, NOW - 50 * MINUTE)
    r.context("alpha", "general", now=NOW)
    hint = r.tails.hint(window_params("alpha", "general", None, NOW, r.defaults))[0]
    truncate(db)
    for i in range(200):  # more rows, longer ones: every seq has another `before`
        log.say("user" if i % 2 == 0 else "assistant", f"new {i} " + "words " * 60, NOW)
    again = r.tails.hint(window_params("alpha", "general", None, NOW, r.defaults))[0]
    assert again["hint_seq"] == hint["hint_seq"] is not None
    got = r.context("alpha", "general", now=NOW)
    r.close()
    assert got == fresh_context(db, NOW)
    assert texts(got)[-1].startswith("new 199") and got.token_estimate <= 3_000


def test_rows_held_from_a_log_written_again_are_not_used(db: str, log: Log) -> None:
    """The same seqs and window key over other events: the rows a reader holds are not
    theirs, so the query sends every payload (the hint check guards the known rows)."""
    r = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=3_000))
    for i in range(30):
        log.say("user" if i % 2 == 0 else "assistant", f"old {i}", NOW)
    r.context("alpha", "general", now=NOW)
    truncate(db)
    for i in range(30):
        log.say("user" if i % 2 == 0 else "assistant", f"new {i}", NOW)
    got = r.context("alpha", "general", now=NOW)
    r.close()
    assert texts(got) == [f"new {i}" for i in range(30)]


def events_rows_scanned(conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
    """Rows the window query's scans of `events` read: returned or filtered out (EXPLAIN
    ANALYZE, all nodes), so a scan that reads a partition to keep a few rows counts all."""
    row = conn.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + query(window_query(params)), params
    ).fetchone()
    assert row is not None

    def walk(node: dict[str, Any]) -> int:
        own = 0
        if str(node.get("Relation Name", "")).startswith("events"):
            read = int(node["Actual Rows"]) + int(node.get("Rows Removed by Filter", 0))
            own = read * int(node["Actual Loops"])
        return own + sum(walk(child) for child in node.get("Plans", []))

    return walk(row[0][0]["Plan"])


def test_a_hinted_read_reads_what_changed_not_the_window(db: str, log: Log) -> None:
    """A 2,000-message window at a budget that keeps ~60 of them: without a hint the read
    visits the rows it keeps (the running totals find the cut), not every message; from
    the last read's hint, only the new rows."""
    for i in range(1_000):
        at = NOW - dt.timedelta(seconds=2_000 - 2 * i)
        log.say("user", f"question {i} " + "words " * 40, at)
        log.say("assistant", f"answer {i} " + "words " * 40, at)
    r = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=3_000))
    first = r.context("alpha", "general", now=NOW)  # learns the hint
    for i in range(3):
        log.say("user", f"late {i} " + "words " * 40, NOW)
    params, known = r.tails.hint(
        window_params("alpha", "general", None, NOW, r.defaults, bounded=True)
    )
    r.close()
    assert params["hint_seq"] == max(known)
    plain = {**params, **NO_HINT}
    with psycopg.connect(db, autocommit=True) as conn:
        # As autovacuum leaves a live database: with statistics, a planner that expected
        # a third of this one-conversation partition from the hint on read all of it.
        conn.execute("ANALYZE events")
        whole = conn.execute(query("window_messages"), plain).fetchall()
        tail = conn.execute(query("window_tail"), params).fetchall()
        summed, tailed = events_rows_scanned(conn, plain), events_rows_scanned(conn, params)
    assert len(whole) < 80 and summed <= 4 * len(whole) and first.truncated, summed
    assert len(tail) == 4 and tailed <= 3 * len(tail), (tailed, len(tail))
    filled = fill(tail, known)
    assert filled is not None and [row[:6] for row in filled] == [row[:6] for row in whole]
    assert stored(filled) == stored(whole)


def test_rows_a_reader_holds_come_back_without_their_payload(db: str, log: Log) -> None:
    """The hint's row comes back bare and the reader adds the rows ahead of it that the
    cut keeps: the query looks up the payload of the new rows alone, and the filled
    rows are those of a read without a hint, also once the cut has moved."""
    for i in range(300):
        log.say("user" if i % 2 == 0 else "assistant", f"m{i} " + "words " * 40, NOW)
    r = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=3_000))
    r.context("alpha", "general", now=NOW)  # learns the hint and the rows
    first_known = min(r.tails.hint(window_params("alpha", "general", None, NOW, r.defaults))[1])
    for n in (1, 40):  # a new question; then enough to move the cut past some known rows
        for i in range(n):
            log.say("user", f"new question {n}.{i} " + "words " * 40, NOW)
        params, known = r.tails.hint(
            window_params("alpha", "general", None, NOW, r.defaults, bounded=True)
        )
        plain = {**params, **NO_HINT}
        with psycopg.connect(db) as conn:
            full = conn.execute(query("window_messages"), plain).fetchall()
            bare = conn.execute(query("window_tail"), params).fetchall()
            bare_looked = events_rows_scanned(conn, params)
        assert bare[0][0] == params["hint_seq"] and bare[0][7] is None
        assert sum(row[7] is not None for row in bare) == n  # the new questions
        filled = fill(bare, known)
        assert filled is not None and [row[:8] for row in filled] == [row[:8] for row in full]
        assert bare_looked <= 2 * (n + 1), bare_looked
        assert fill(bare, {}) is None  # rows it no longer holds: the reader reads them whole
        r.tails.learn(window_params("alpha", "general", None, NOW, r.defaults), filled)
    r.close()
    assert full[0][0] > first_known  # the cut moved: known rows were left out
