"""The context read model on real Postgres: segments and their boundaries, decided by
ingest; reads that only ever grow between them; thinking kept; validity for the API."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
from typing import Any
from uuid import UUID

import anthropic
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg_pool import ConnectionPool

from contextlog.producers import AsyncContextReader, ContextReader, NotVisible, Producer
from contextlog.producers.ids import uuid7
from contextlog.producers.reader import _configure
from contextlog.schema import events as ev
from contextlog.schema.defaults import ConversationDefaults
from tests.support import properties
from tests.support.anthropic_rules import check_messages
from tests.support.appendonly import extends
from tests.support.blocks import PARAMS, server_call, thinking
from tests.support.fake_anthropic import FakeAPI, client_for
from tests.support.running import running, settings_for
from tests.support.services import truncate
from tests.support.thinking_bot import Bot, Log

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
MINUTE = dt.timedelta(minutes=1)


def use(i: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": i, "name": "lookup", "input": {"q": i}}


def result(i: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": i, "content": "found"}


def texts(ctx: Any) -> list[str]:
    return [
        b.get("text") or b.get("id") or b.get("tool_use_id")
        for m in ctx.messages
        for b in m["content"]
    ]


def test_the_rolling_edge_moves_at_opening_messages_in_steps_of_a_quarter(
    log: Log, reader: ContextReader
) -> None:
    """An exchange every hour for two days: the context never starts before the window
    of its newest opening message (24 h, plus up to a quarter for the step), crosses at
    most four edge boundaries a day, and grows only at its end in between."""
    previous = reader.context("alpha", "general")
    edges = 0
    for hour in range(48):
        log.say("user", f"q{hour}", NOW + hour * HOUR)
        log.say("assistant", [thinking(str(hour)), {"type": "text", "text": f"a{hour}"}])
        ctx = reader.context("alpha", "general")
        assert check_messages(ctx.messages, thinking=True) == []
        oldest = int(texts(ctx)[0].removeprefix("q"))
        assert hour - oldest <= 24  # never older than the window at the newest message
        assert hour < 24 or hour - oldest >= 18  # and cut in quarter steps, not further
        if ctx.boundary == previous.boundary:
            assert extends(previous.messages, ctx.messages) == ""
        else:
            assert ctx.boundary is not None and ctx.boundary.kind == "edge"
            edges += 1
        previous = ctx
    assert 4 <= edges <= 7  # a day's worth of steps past the first 24 h
    # Thinking before the newest boundary is gone, the rest is back verbatim.
    kept = [b for m in ctx.messages for b in m["content"] if b["type"] == "thinking"]
    assert kept and kept[-1] == thinking("47")


def test_producers_clocks_decide_nothing(log: Log, reader: ContextReader, db: str) -> None:
    """A message stamped 2099 or an hour slow is placed by the time ingest logged it."""
    log.say("user", "from the future", NOW, occurred_at=dt.datetime(2099, 12, 31, tzinfo=dt.UTC))
    log.say("assistant", "noted")
    log.say("user", "slow clock", NOW + 25 * HOUR, occurred_at=NOW - 30 * HOUR)
    ctx = reader.context("alpha", "general")
    assert texts(ctx) == ["slow clock"]  # the 2099 message aged out like any other
    with psycopg.connect(db) as conn:
        at = conn.execute("SELECT max(last_activity_at) FROM conversations").fetchone()
    assert at is not None and at[0] == NOW + 25 * HOUR


def test_the_budget_cuts_only_at_an_opening_message_never_inside_a_cycle(db: str) -> None:
    defaults = ConversationDefaults(token_budget=1000)
    lg, r = Log(db, defaults), ContextReader.from_url(db, defaults=defaults)
    try:
        for i in range(3):
            lg.say("user", f"q{i} " + "x" * 200)
            lg.say("assistant", [thinking(f"{i}"), {"type": "text", "text": "a" * 200}])
        lg.say("user", "run the tools")
        for i in range(4):  # one long cycle, well past the budget
            lg.say("assistant", [thinking(f"c{i}"), use(f"t{i}")])
            lg.say("user", [{**result(f"t{i}"), "content": "r" * 400}])
            ctx = r.context("alpha", "general")
            assert check_messages(ctx.messages, thinking=True) == []
        assert ctx.over_budget and ctx.boundary is None  # grown past it, never cut
        assert texts(ctx)[0].startswith("q0")
        lg.say("assistant", [thinking("done"), {"type": "text", "text": "all done"}])
        lg.say("user", "next question")  # the cycle closed: here the start moves
        ctx = r.context("alpha", "general")
        assert ctx.boundary is not None and ctx.boundary.kind == "budget"
        assert texts(ctx)[0] == "next question" and not ctx.over_budget
        assert check_messages(ctx.messages, thinking=True) == []
    finally:
        lg.close()
        r.close()


def test_a_plain_message_inside_a_tool_cycle_is_no_boundary(db: str) -> None:
    """A person's message between a tool call and its results joins the results' turn
    (the API's view): the cycle goes on, so the budget does not cut there."""
    defaults = ConversationDefaults(token_budget=200)
    lg, r = Log(db, defaults), ContextReader.from_url(db, defaults=defaults)
    try:
        lg.say("user", "q " + "x" * 400)
        lg.say("assistant", [thinking("1"), use("a")])
        lg.say("user", "are you there?")  # over the budget, but the call is open
        lg.say("user", [result("a")])
        ctx = r.context("alpha", "general")
        assert ctx.boundary is None
        assert check_messages(ctx.messages, thinking=True) == []
    finally:
        lg.close()
        r.close()


def test_threads_have_their_own_context_and_a_frozen_header(
    log: Log, reader: ContextReader
) -> None:
    log.say("user", "main line", NOW - HOUR)
    log.say("user", "in t1", thread="t1")
    log.say("assistant", "t1 reply", thread="t1")
    assert texts(reader.context("alpha", "general")) == ["main line"]
    assert texts(reader.context("alpha", "general", "t1")) == ["in t1", "t1 reply"]
    log.add(ev.ContextCleared)  # a boundary: each thread's header lists the others
    log.say("user", "again", thread="t1")
    log.say("user", "main again")
    log.add(ev.SessionSaveRequested)
    log.add(ev.SessionRestoreRequested, session_id="last")
    main = reader.context("alpha", "general")
    assert main.system is not None and "- thread t1" in main.system
    # Activity in another thread leaves this thread's header (a cached prefix) as is.
    log.say("user", "more in t1", thread="t1")
    log.say("user", "in t2", thread="t2")
    assert reader.context("alpha", "general").system == main.system


def test_configure_takes_effect_at_the_next_opening_message(
    log: Log, reader: ContextReader
) -> None:
    for i in range(6):
        log.say("user", f"q{i} " + "x" * 400, NOW + i * HOUR)
        log.say("assistant", f"a{i} " + "y" * 400)
    assert len(reader.context("alpha", "general").messages) == 12
    log.add(ev.Configured, token_budget=500)
    assert len(reader.context("alpha", "general").messages) == 12  # no boundary yet
    log.say("user", "q6")
    ctx = reader.context("alpha", "general")
    assert ctx.truncated and ctx.token_estimate <= 500
    assert check_messages(ctx.messages) == []


def test_wait_for_reads_your_writes(db: str, redis_url: str, reader: ContextReader) -> None:
    producer = Producer.from_url(redis_url, shards=4)
    with running(settings_for(db, redis_url)):
        producer.post_message("alpha", "general", "user", "hello")
        eid = producer.post_message("alpha", "general", "assistant", "hi there")
        ctx = reader.context("alpha", "general", wait_for=eid, timeout=10)
    assert texts(ctx) == ["hello", "hi there"]


def test_wait_for_an_event_never_stored_raises_a_clear_error(reader: ContextReader) -> None:
    with pytest.raises(NotVisible, match="is `contextlog ingest` running"):
        reader.context("alpha", "general", wait_for=str(uuid7()), timeout=0.05)


def _later(log: Log, event_id: str, delay: float = 0.3, text: str = "late") -> threading.Timer:
    """Store a message a moment from now, as ingest would, while a reader waits for it."""
    timer = threading.Timer(delay, log.say, ("user", text), {"event_id": UUID(event_id)})
    timer.start()
    return timer


def _listening(reader: ContextReader) -> list[str]:
    with reader.connection() as conn:
        return [r[0] for r in conn.execute("SELECT pg_listening_channels()")]


def test_wait_for_returns_once_the_event_commits(log: Log, reader: ContextReader) -> None:
    eid = str(uuid7())
    timer = _later(log, eid)
    ctx = reader.context("alpha", "general", wait_for=eid, timeout=20)
    timer.join()
    assert texts(ctx) == ["late"]
    assert _listening(reader) == []  # the pooled connection stopped listening


def _await(conn: psycopg.Connection[Any], event_id: str, timeout: float) -> int | None:
    row = conn.execute(
        "SELECT contextlog_await_event(%s, 'alpha', 'general', %s)", (event_id, timeout)
    ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_a_statement_timeout_shorter_than_the_wait_is_named(db: str) -> None:
    """Postgres does the waiting, so a deployment's `statement_timeout` can end it early:
    the caller is told so, and the pooled connection stops listening."""

    def configure(conn: psycopg.Connection[Any]) -> None:
        _configure(conn)
        conn.execute("SET statement_timeout = 100")

    pool = ConnectionPool(db, configure=configure, kwargs={"autocommit": True}, open=False)
    r = ContextReader(pool, defaults=ConversationDefaults())
    try:
        with pytest.raises(NotVisible, match="statement_timeout"):
            r.context("alpha", "general", wait_for=str(uuid7()), timeout=20)
        assert _listening(r) == []
    finally:
        r.close()


def test_a_listening_wait_is_woken_by_each_commit(log: Log, db: str) -> None:
    """`wait_for` waits in Postgres (010), looking every millisecond and at each commit's
    signal: a wait through a storm of commits looks far more often than its timer alone
    could, one look a millisecond."""
    eid = str(uuid7())

    def storm() -> None:
        with psycopg.connect(db, autocommit=True) as conn:
            for _ in range(1000):
                conn.execute("NOTIFY contextlog_commits")  # as each ingest commit does
        log.say("user", "late", event_id=UUID(eid))

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("LISTEN contextlog_commits")
        stormer = threading.Thread(target=storm)
        start = time.monotonic()
        stormer.start()
        looks = _await(conn, eid, 20)
        elapsed_ms = (time.monotonic() - start) * 1000
        stormer.join()
    assert looks is not None and looks > 1.5 * elapsed_ms


def test_a_wait_without_the_commit_signal_still_ends(log: Log, db: str) -> None:
    """A connection not listening (or an ingest that sends no NOTIFY) is not signalled:
    the wait looks every millisecond, finds the event, and gives up at its timeout."""
    eid = str(uuid7())
    timer = _later(log, eid, 0.1)
    with psycopg.connect(db, autocommit=True) as conn:
        looks = _await(conn, eid, 20)
        assert _await(conn, str(uuid7()), 0.05) is None  # never stored
    timer.join()
    assert looks is not None and looks > 10


def test_wait_for_sleeps_through_other_commits(log: Log, reader: ContextReader) -> None:
    # A commit without the awaited event wakes the wait, which looks and waits on.
    eid = str(uuid7())
    timers = [_later(log, str(uuid7()), 0.2, "other"), _later(log, eid, 0.6)]
    ctx = reader.context("alpha", "general", wait_for=eid, timeout=20)
    for t in timers:
        t.join()
    assert texts(ctx) == ["other", "late"]
    assert _listening(reader) == []


def test_wait_for_after_a_read_fetches_only_what_changed(
    log: Log, reader: ContextReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bot's next turn: the reader holds the rows of its last read, so the read after
    the commit it waited for brings the new message alone."""
    for i in range(40):
        log.say("user" if i % 2 == 0 else "assistant", f"m{i}")
    sent: list[int] = []  # rows each read of the thread brought (its state row aside)
    from contextlog.producers import reader as module

    real = module._parts

    def counting(rows: Any, tail: Any) -> Any:
        sent.append(len(rows) - 1)
        return real(rows, tail)

    monkeypatch.setattr(module, "_parts", counting)
    reader.context("alpha", "general")
    eid = str(uuid7())
    timer = _later(log, eid)
    ctx = reader.context("alpha", "general", wait_for=eid, timeout=20)
    timer.join()
    assert texts(ctx) == [f"m{i}" for i in range(40)] + ["late"]
    assert sent == [40, 1]
    assert _listening(reader) == []


def test_a_read_after_a_boundary_reads_the_segment_afresh(log: Log, reader: ContextReader) -> None:
    log.say("user", "before")
    assert texts(reader.context("alpha", "general")) == ["before"]
    log.add(ev.ContextCleared)
    log.say("user", "after")
    ctx = reader.context("alpha", "general")
    assert texts(ctx) == ["after"]
    assert ctx.boundary is not None and ctx.boundary.kind == "clear"


def test_a_caller_editing_its_context_changes_no_later_read(
    log: Log, reader: ContextReader
) -> None:
    """Later reads reuse what earlier ones fetched; never the blocks a caller was given."""
    log.say("user", [{"type": "text", "text": "question"}])
    log.say("assistant", "answer")
    first = reader.context("alpha", "general")
    first.messages[0]["content"][0]["text"] = "edited"
    first.messages[0]["content"][0]["cache_control"] = {"type": "ephemeral"}
    first.messages[-1]["content"].append({"type": "text", "text": "added"})
    again = reader.context("alpha", "general")
    assert again.messages == [
        {"role": "user", "content": [{"type": "text", "text": "question"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "answer"}]},
    ]


def test_a_failed_wait_stops_listening(reader: ContextReader) -> None:
    with pytest.raises(NotVisible):
        reader.context("alpha", "general", wait_for=str(uuid7()), timeout=0.05)
    assert _listening(reader) == []


def test_async_wait_for_returns_once_the_event_commits(log: Log, db: str) -> None:
    eid = str(uuid7())

    async def go() -> list[str]:
        r = AsyncContextReader.from_url(db, defaults=ConversationDefaults())
        try:
            return texts(await r.context("alpha", "general", wait_for=eid, timeout=20))
        finally:
            await r.aclose()

    timer = _later(log, eid)
    assert asyncio.run(go()) == ["late"]
    timer.join()


def test_the_async_reader_reads_what_the_sync_one_does(
    log: Log, db: str, reader: ContextReader
) -> None:
    log.say("user", "hello async")
    log.say("system", "Be brief.")
    log.add(ev.FrameSet, model="claude-fable-5-1", system="bot", tools=[{"name": "lookup"}])

    async def go() -> Any:
        r = AsyncContextReader.from_url(db, defaults=ConversationDefaults())
        try:
            return await r.context("alpha", "general"), await r.segment("alpha", "general")
        finally:
            await r.aclose()

    ctx, segment = asyncio.run(go())
    assert ctx == reader.context("alpha", "general") and ctx.frame is not None
    assert segment.context == ctx and [m.seq for m in segment.messages] == [1, 2]


@st.composite
def operations(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """What happens to a conversation: a thinking bot's turns (with tool calls), system
    messages, a second thread, clears, saves and restores, budget changes, frame
    changes, and hours passing."""
    ops: list[tuple[str, Any]] = [("frame", 0)]
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(
            st.sampled_from(
                [
                    "turn",
                    "turn",
                    "turn",
                    "tools",
                    "system",
                    "thread",
                    "clear",
                    "save",
                    "restore",
                    "budget",
                    "frame",
                    "hours",
                ]
            )
        )
        if kind == "turn":
            ops.append(("turn", draw(st.integers(5, 600))))
        elif kind == "tools":
            ops.append(("tools", draw(st.integers(1, 3))))
        elif kind == "budget":
            ops.append(("budget", draw(st.sampled_from([300, 1000, 4000]))))
        elif kind == "hours":
            ops.append(("hours", draw(st.integers(1, 30))))
        elif kind == "frame":
            ops.append(("frame", draw(st.integers(0, 1))))
        else:
            ops.append((kind, None))
    return ops


@settings(
    max_examples=properties.examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=operations())
def test_any_history_reads_back_append_only_and_accepted_by_the_api(
    db: str, ops: list[tuple[str, Any]]
) -> None:
    """The invariant (docs/context.md): between boundaries every read of a thread extends
    the read before; and every request the bot builds from a context passes the API's
    rules, the prefix check on its thinking included (a refusal fails the test)."""
    truncate(db)
    lg = Log(db, ConversationDefaults(token_budget=2000))
    reader = ContextReader.from_url(db, defaults=ConversationDefaults(token_budget=2000))
    fake = FakeAPI()
    post = lambda role, content, thread=None: lg.say(role, content, thread=thread)  # noqa: E731
    bot = Bot(post, reader, fake)
    last: dict[str, Any] = {}
    try:
        for n, (kind, arg) in enumerate(ops):
            thread = "side" if kind == "thread" else None
            if kind in ("turn", "thread"):
                assert bot.turn(f"question {n} " + "x" * (arg or 50), thread=thread), bot.stats
            elif kind == "tools":
                assert bot.turn(f"use tools {n}", tools=arg), bot.stats.errors
            elif kind == "system":
                lg.say("system", f"It is now {lg.now:%H:%M}.")
            elif kind == "clear":
                lg.add(ev.ContextCleared)
            elif kind == "save":
                lg.add(ev.SessionSaveRequested)
            elif kind == "restore":
                lg.add(ev.SessionRestoreRequested, session_id="last")
            elif kind == "budget":
                lg.add(ev.Configured, token_budget=arg)
            elif kind == "frame":
                tools = [{"name": "lookup"}] if arg else None
                lg.add(ev.FrameSet, model="claude-fable-5-1", system="bot", tools=tools)
            elif kind == "hours":
                lg.now += arg * HOUR
            for t in (None, "side"):
                ctx = reader.context("alpha", "general", t)
                assert check_messages(ctx.messages) == []
                before = last.get(t or "")
                if before is not None and before.boundary == ctx.boundary:
                    assert extends(before.messages, ctx.messages) == "", (n, kind)
                    assert before.system == ctx.system
                last[t or ""] = ctx
    finally:
        lg.close()
        reader.close()


def test_a_thinking_bot_for_1000_turns_is_never_refused(db: str) -> None:
    """The issue's bot: thinking on, its own system prompt and tools, prompt caching, a
    tool call every 4th turn, a second thread every 5th, the default budget, two days of
    turns (the 24 h edge crossed), requests through the real client to an API that binds
    each thinking block to its prefix."""
    lg = Log(db)
    reader = ContextReader.from_url(db, defaults=ConversationDefaults())
    fake = FakeAPI()
    bot = Bot(
        lambda role, content, thread=None: lg.say(role, content, thread=thread),
        reader,
        fake,
        budget=ConversationDefaults().token_budget,
    )
    try:
        for turn in range(1000):
            lg.now += 3 * MINUTE
            text = f"turn {turn}: " + "details " * (5 + turn % 40)
            thread = "ops" if turn % 5 == 4 else None
            bot.turn(text, thread=thread, tools=1 if turn % 4 == 3 else 0)
    finally:
        lg.close()
        reader.close()
    s = bot.stats
    assert s.refused == 0, s.errors[:3]
    assert s.thinking_share >= 0.98, s
    assert s.cacheable_share >= 0.9, s
    assert s.over_budget == 0, s
    assert 0 < s.boundaries < 200


def test_cli_context_reads_the_segment(
    log: Log, db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from contextlog.worker.cli import main as cli

    log.say("assistant", [use("edge")], NOW)
    log.say("user", [result("edge")])
    log.say("user", "later")
    log.say("assistant", [{"type": "text", "text": "checking"}, use("mid")])
    log.add(ev.ContextCleared)
    log.say("user", [result("mid")])
    log.say("assistant", "after clear")
    log.say("user", "new topic")
    log.say("assistant", [use("new")])
    log.say("user", [result("new")])
    log.say("assistant", "done")
    monkeypatch.setenv("DATABASE_URL", db)
    assert cli.main(["context", "alpha", "general", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert check_messages(out["messages"]) == []
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user", "assistant"]
    assert out["messages"][0]["content"] == [{"type": "text", "text": "new topic"}]


def test_a_restored_sessions_messages_count_as_recent_from_the_restore(
    log: Log, reader: ContextReader
) -> None:
    log.say("user", "old question", NOW - 50 * HOUR)
    log.say("assistant", [thinking("old"), use("s")])
    log.say("user", [result("s")])
    log.say("assistant", "old answer")
    log.add(ev.SessionSaveRequested, description="old work")
    log.say("user", "not in the session", NOW - 40 * HOUR)
    log.add(ev.SessionRestoreRequested, NOW - 2 * HOUR, session_id="last")
    log.say("user", "after restore", NOW - HOUR)
    ctx = reader.context("alpha", "general")
    assert check_messages(ctx.messages, thinking=False) == []
    assert texts(ctx) == ["old question", "s", "s", "old answer", "after restore"]
    assert ctx.thinking_removed == 1  # its prefix is gone: removed at the restore
    assert ctx.system is not None and ctx.system.startswith("Resumed saved session")
    # Once the restore is older than the rolling window, an opening message drops them.
    log.say("assistant", "ok")
    log.say("user", "a day later", NOW + 23 * HOUR)
    assert texts(reader.context("alpha", "general")) == ["a day later"]


def test_every_block_comes_back_as_posted_and_valid_at_every_clear_and_restore(
    db: str, reader: ContextReader
) -> None:
    """A bot with thinking and tools, storing every response verbatim; a clear and a
    restore landing at each message in turn: the context obeys the API's rules."""
    user = [PARAMS[k] for k in ("text", "image", "document", "search_result")]
    reply = [thinking("1"), thinking("2", redacted=True), *server_call("1"), use("a")]
    convo: list[tuple[str, Any]] = [
        ("user", [*user[:-1], {**user[-1], "cache_control": {"type": "ephemeral"}}]),
        ("assistant", reply),
        ("user", [{**result("a"), "content": [PARAMS["image"], PARAMS["text"]]}]),
        ("assistant", [use("b")]),  # the same cycle, without new thinking
        ("user", [result("b")]),
        ("assistant", [thinking("3"), {"type": "text", "text": "done"}]),
        ("user", "next"),
        ("assistant", [thinking("4"), use("c")]),
        ("user", [result("c")]),
    ]
    api = client_for(FakeAPI())
    for cut in range(len(convo) + 1):
        for how in ("clear", "restore"):
            truncate(db)
            lg = Log(db)
            for i, (role, content) in enumerate(convo):
                if i == cut and how == "clear":
                    lg.add(ev.ContextCleared)
                if i == cut and how == "restore":
                    lg.add(ev.SessionSaveRequested)
                    lg.add(ev.SessionRestoreRequested, session_id="last")
                lg.say(role, content)
            lg.close()
            ctx = reader.context("alpha", "general")
            assert check_messages(ctx.messages, thinking=True) == [], (cut, how)
            if ctx.messages:
                answer = api.messages.create(
                    model="claude-opus-4-8",
                    max_tokens=4096,
                    thinking={"type": "enabled", "budget_tokens": 2048},
                    **ctx.to_anthropic(),
                )
                assert answer.content[0].type == "thinking"
    # Uncut, every block comes back as posted, thinking byte for byte, no cache_control.
    ctx = reader.context("alpha", "general")
    assert ctx.messages[-2]["content"][0] == thinking("4")
    assert ctx.messages[0]["content"] == user


def test_the_fake_api_refuses_what_the_real_one_refuses() -> None:
    api = client_for(FakeAPI())
    with pytest.raises(anthropic.BadRequestError, match="no tool_result"):
        broken: list[Any] = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [use("x")]},
            {"role": "user", "content": "where is my result"},
        ]
        api.messages.create(model="m", max_tokens=10, messages=broken)
