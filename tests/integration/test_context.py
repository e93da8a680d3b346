"""The context read model on real Postgres: window, clear, threads, budget, validity."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import anthropic
import httpx2
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg_pool import ConnectionPool

from contextlog.producers import AsyncContextReader, ContextReader, NotVisible, Producer, tails
from contextlog.producers.ids import uuid7
from contextlog.producers.reader import _configure
from contextlog.schema import codec
from contextlog.schema import events as ev
from contextlog.schema.defaults import ConversationDefaults
from contextlog.worker.store.eventlog import Accepted, PostgresEventLog
from tests.support.anthropic_rules import check_messages, check_params
from tests.support.blocks import PARAMS, server_call, thinking
from tests.support.running import running, settings_for
from tests.support.services import truncate

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


class Log:
    """Appends events straight into the Postgres log, as ingest would, with chosen times."""

    def __init__(self, url: str) -> None:
        self.log = PostgresEventLog(psycopg.connect(url))
        self.n = 0

    def add(
        self,
        cls: type[ev.Event],
        at: dt.datetime,
        channel: str = "general",
        thread: str | None = None,
        **fields: Any,
    ) -> str:
        self.n += 1
        event = cls(
            event_id=fields.pop("event_id", None) or uuid7(),
            agent="alpha",
            channel=channel,
            thread=thread,
            occurred_at=at,
            **fields,
        )
        payload = codec.encode(event)
        self.log.append(0, 1, [Accepted(f"{self.n}-0", codec.decode(payload), payload)])
        return str(event.event_id)

    def say(self, role: str, content: Any, at: dt.datetime, **kw: Any) -> str:
        return self.add(ev.MessagePosted, at, role=role, content=content, **kw)


@pytest.fixture
def log(db: str) -> Iterator[Log]:
    lg = Log(db)
    yield lg
    lg.log.close()


@pytest.fixture
def reader(db: str) -> Iterator[ContextReader]:
    r = ContextReader.from_url(db, defaults=ConversationDefaults())
    yield r
    r.close()


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


def test_window_crosses_a_clear_and_the_24h_edge_inside_tool_exchanges(
    log: Log, reader: ContextReader
) -> None:
    t0 = NOW - 30 * HOUR
    log.say("user", "ancient", t0)
    log.say("assistant", [use("old")], NOW - 24 * HOUR - dt.timedelta(minutes=1))
    log.say("user", [result("old")], NOW - 24 * HOUR + dt.timedelta(minutes=1))  # edge inside
    log.say("assistant", "old answer", NOW - 23 * HOUR)
    log.say("user", "before clear", NOW - 5 * HOUR)
    log.say("assistant", [use("mid")], NOW - 4 * HOUR)
    log.add(ev.ContextCleared, NOW - 3 * HOUR)  # a clear in the middle of a tool exchange
    log.say("user", [result("mid")], NOW - 2 * HOUR)
    log.say("assistant", "answer after clear", NOW - 2 * HOUR)
    log.say("user", "fresh question", NOW - HOUR)
    log.say("assistant", "fresh answer", NOW - HOUR)
    ctx = reader.context("alpha", "general", now=NOW)
    assert check_messages(ctx.messages) == []
    assert texts(ctx) == ["fresh question", "fresh answer"]
    assert ctx.window_start == NOW - 3 * HOUR
    # Without the clear, the 24 h edge alone would have cut into the first exchange.
    later = reader.context("alpha", "other", now=NOW)
    assert later.messages == []


def test_24h_edge_alone(log: Log, reader: ContextReader) -> None:
    log.say("user", "too old", NOW - 25 * HOUR)
    log.say(
        "assistant",
        [{"type": "text", "text": "calling"}, use("a")],
        NOW - 24 * HOUR - 60 * dt.timedelta(seconds=1),
    )
    log.say("user", [result("a")], NOW - 23 * HOUR)
    log.say("assistant", "result was found", NOW - 23 * HOUR)
    log.say("user", "next", NOW - 22 * HOUR)
    ctx = reader.context("alpha", "general", now=NOW)
    assert check_messages(ctx.messages) == []
    assert texts(ctx) == ["next"]
    assert ctx.window_start == NOW - 24 * HOUR


def test_threads_have_their_own_context_and_show_in_the_preamble(
    log: Log, reader: ContextReader
) -> None:
    log.say("user", "main line", NOW - HOUR)
    log.say("user", "in t1", NOW - HOUR, thread="t1")
    log.say("assistant", "t1 reply", NOW - 30 * dt.timedelta(minutes=1), thread="t1")
    log.say("user", "stale thread", NOW - 48 * HOUR, thread="old")
    main = reader.context("alpha", "general", now=NOW)
    assert texts(main) == ["main line"]
    assert main.system is not None and "- thread t1" in main.system
    assert "old" not in main.system
    t1 = reader.context("alpha", "general", "t1", now=NOW)
    assert texts(t1) == ["in t1", "t1 reply"]
    assert t1.system is not None and "- main line" in t1.system
    # Activity in another thread leaves this thread's system text (a cached prefix) as is.
    log.say("user", "more in t1", NOW - dt.timedelta(minutes=1), thread="t1")
    assert reader.context("alpha", "general", now=NOW).system == main.system


def test_configure_changes_window_and_budget(log: Log, reader: ContextReader) -> None:
    for i in range(6):
        log.say("user", f"q{i} " + "x" * 400, NOW - (6 - i) * HOUR)
        log.say("assistant", f"a{i} " + "y" * 400, NOW - (6 - i) * HOUR)
    assert len(reader.context("alpha", "general", now=NOW).messages) == 12
    log.add(ev.Configured, NOW, rolling_window=3 * 3600 + 60)
    assert texts(reader.context("alpha", "general", now=NOW))[0].startswith("q3")
    log.add(ev.Configured, NOW, token_budget=250)
    ctx = reader.context("alpha", "general", now=NOW)
    assert ctx.truncated and ctx.token_estimate <= 250
    assert texts(ctx)[0].startswith("q5") and check_messages(ctx.messages) == []


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
    at = NOW - HOUR
    timer = threading.Timer(delay, log.say, ("user", text, at), {"event_id": UUID(event_id)})
    timer.start()
    return timer


def _listening(reader: ContextReader) -> list[str]:
    with reader.connection() as conn:
        return [r[0] for r in conn.execute("SELECT pg_listening_channels()")]


def test_wait_for_returns_once_the_event_commits(log: Log, reader: ContextReader) -> None:
    eid = str(uuid7())
    timer = _later(log, eid)
    ctx = reader.context("alpha", "general", wait_for=eid, timeout=20, now=NOW)
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
        log.say("user", "late", NOW - HOUR, event_id=UUID(eid))

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
    ctx = reader.context("alpha", "general", wait_for=eid, timeout=20, now=NOW)
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
        log.say("user" if i % 2 == 0 else "assistant", f"m{i}", NOW - 2 * HOUR)
    sent: list[int] = []  # rows that came with their payload, per read of the window
    real_fill = tails.fill

    def counting(rows: Any, known: Any) -> Any:
        sent.append(sum(r[7] is not None for r in rows))
        return real_fill(rows, known)

    monkeypatch.setattr("contextlog.producers.reader.fill", counting)
    reader.context("alpha", "general", now=NOW)
    eid = str(uuid7())
    timer = _later(log, eid)
    ctx = reader.context("alpha", "general", wait_for=eid, timeout=20, now=NOW)
    timer.join()
    assert texts(ctx) == [f"m{i}" for i in range(40)] + ["late"]
    assert sent == [40, 1]
    assert _listening(reader) == []


def test_a_caller_editing_its_context_changes_no_later_read(
    log: Log, reader: ContextReader
) -> None:
    """Later reads reuse what earlier ones fetched; never the blocks a caller was given."""
    log.say("user", [{"type": "text", "text": "question"}], NOW - HOUR)
    log.say("assistant", "answer", NOW - HOUR)
    first = reader.context("alpha", "general", now=NOW)
    first.messages[0]["content"][0]["text"] = "edited"
    first.messages[0]["content"][0]["cache_control"] = {"type": "ephemeral"}
    first.messages[-1]["content"].append({"type": "text", "text": "added"})
    again = reader.context("alpha", "general", now=NOW)
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
            return texts(await r.context("alpha", "general", wait_for=eid, timeout=20, now=NOW))
        finally:
            await r.aclose()

    timer = _later(log, eid)
    assert asyncio.run(go()) == ["late"]
    timer.join()


def test_async_reader(log: Log, db: str) -> None:
    log.say("user", "hello async", NOW - HOUR)

    async def go() -> list[dict[str, Any]]:
        r = AsyncContextReader.from_url(db, defaults=ConversationDefaults())
        ctx = await r.context("alpha", "general", now=NOW)
        await r.aclose()
        return ctx.messages

    assert asyncio.run(go()) == [
        {"role": "user", "content": [{"type": "text", "text": "hello async"}]}
    ]


def fake_api(request: httpx2.Request) -> httpx2.Response:
    """Answers like the Messages API: 400 with the reason for an invalid request."""
    body = json.loads(request.content)
    thinking = body.get("thinking", {}).get("type") in ("enabled", "adaptive")
    errors = check_params(body) + check_messages(body["messages"], thinking=thinking)
    if errors:
        return httpx2.Response(
            400,
            json={
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "; ".join(errors)},
            },
        )
    return httpx2.Response(
        200,
        json={
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
    )


def client() -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="test-key",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(fake_api)),
    )


def test_the_mock_api_refuses_what_the_real_one_refuses() -> None:
    with pytest.raises(anthropic.BadRequestError, match="no tool_result"):
        broken: list[Any] = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [use("x")]},
            {"role": "user", "content": "where is my result"},
        ]
        client().messages.create(model="m", max_tokens=10, messages=broken)


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, Any, int]]:
    """(what, content, minutes before NOW): messages, tool calls, clears, configures."""
    out: list[tuple[str, Any, int]] = []
    minutes = draw(st.integers(0, 3000))
    pending: list[str] = []
    for i in range(draw(st.integers(1, 25))):
        minutes = max(0, minutes - draw(st.integers(0, 400)))
        kind = draw(
            st.sampled_from(["user", "assistant", "tools", "results", "clear", "configure"])
        )
        if kind == "tools":
            pending = [f"t{i}_{k}" for k in range(draw(st.integers(1, 3)))]
            out.append(("assistant", [use(p) for p in pending], minutes))
        elif kind == "results":
            out.append(("user", [result(p) for p in pending] or "no calls", minutes))
            pending = []
        elif kind == "clear":
            out.append(("clear", None, minutes))
        elif kind == "configure":
            out.append(
                (
                    "configure",
                    {
                        "rolling_window": draw(st.sampled_from([600, 7200, 86400])),
                        "token_budget": draw(st.sampled_from([20, 200, 16000])),
                    },
                    minutes,
                )
            )
        else:
            out.append((kind, f"{kind} {i}", minutes))
    return out


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(history=histories(), now_offset=st.integers(-600, 1500))
def test_any_logged_history_reads_back_valid_for_the_real_client(
    db: str, reader: ContextReader, history: list[tuple[str, Any, int]], now_offset: int
) -> None:
    truncate(db)
    lg = Log(db)
    for what, content, minutes in history:
        at = NOW - dt.timedelta(minutes=minutes)
        if what == "clear":
            lg.add(ev.ContextCleared, at)
        elif what == "configure":
            lg.add(ev.Configured, at, **content)
        else:
            lg.say(what, content, at)
    lg.log.close()
    now = NOW + dt.timedelta(minutes=now_offset)
    ctx = reader.context("alpha", "general", now=now)
    assert check_messages(ctx.messages) == []
    # Everything returned is inside the window: after the last clear, within the
    # rolling window in force (the last configure's, or 24 h).
    last_clear = max((i for i, h in enumerate(history) if h[0] == "clear"), default=-1)
    window = 86400
    for what, content, _ in history:
        if what == "configure":
            window = content["rolling_window"]
    cutoff = now - dt.timedelta(seconds=window)
    allowed: set[str] = set()
    for i, (what, content, minutes) in enumerate(history):
        if (
            i > last_clear
            and what in ("user", "assistant")
            and (NOW - dt.timedelta(minutes=minutes) >= cutoff)
        ):
            parts = [content] if isinstance(content, str) else content
            allowed |= {
                p if isinstance(p, str) else p.get("id") or p.get("tool_use_id") for p in parts
            }
    assert set(texts(ctx)) <= allowed
    if ctx.messages:
        reply = client().messages.create(model="m", max_tokens=10, **ctx.to_anthropic())
        assert reply.content[0].text == "ok"


def test_cli_context_across_a_clear_and_the_24h_edge_inside_tool_exchanges(
    log: Log, db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from contextlog.worker.cli import main as cli

    now = dt.datetime.now(dt.UTC)
    log.say("assistant", [use("edge")], now - 24 * HOUR - dt.timedelta(minutes=5))
    log.say("user", [result("edge")], now - 24 * HOUR + dt.timedelta(minutes=5))
    log.say("assistant", "edge answer", now - 23 * HOUR)
    log.say("user", "later", now - 10 * HOUR)
    log.say("assistant", [{"type": "text", "text": "checking"}, use("mid")], now - 5 * HOUR)
    log.add(ev.ContextCleared, now - 4 * HOUR)
    log.say("user", [result("mid")], now - 3 * HOUR)
    log.say("assistant", "after clear", now - 3 * HOUR)
    log.say("user", "new topic", now - HOUR)
    log.say("assistant", [use("new")], now - HOUR)
    log.say("user", [result("new")], now - HOUR)
    log.say("assistant", "done", now - HOUR)
    monkeypatch.setenv("DATABASE_URL", db)
    assert cli.main(["context", "alpha", "general", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert check_messages(out["messages"]) == []
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user", "assistant"]
    assert out["messages"][0]["content"] == [{"type": "text", "text": "new topic"}]


def test_a_restored_sessions_messages_count_as_recent_from_the_restore(
    log: Log, db: str, reader: ContextReader
) -> None:
    log.say("user", "old question", NOW - 50 * HOUR)
    log.say("assistant", [use("s")], NOW - 50 * HOUR)
    log.say("user", [result("s")], NOW - 50 * HOUR)
    log.say("assistant", "old answer", NOW - 50 * HOUR)
    log.add(ev.SessionSaveRequested, NOW - 50 * HOUR, description="old work")
    log.say("user", "not in the session", NOW - 40 * HOUR)
    log.add(ev.SessionRestoreRequested, NOW - 2 * HOUR, session_id="last")
    log.say("user", "after restore", NOW - HOUR)
    ctx = reader.context("alpha", "general", now=NOW)
    assert check_messages(ctx.messages) == []
    assert texts(ctx) == ["old question", "s", "s", "old answer", "after restore"]
    # A restore older than the rolling window no longer brings them back.
    assert texts(reader.context("alpha", "general", now=NOW + 23 * HOUR)) == ["after restore"]


def test_thinking_and_tools_cut_at_every_boundary_read_back_valid_for_the_real_client(
    db: str, reader: ContextReader
) -> None:
    """A bot with thinking and tools, storing every response verbatim; the window edge,
    a clear and a restore landing at each message in turn: the API accepts the context."""
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
    api = client()
    for cut in range(len(convo) + 1):
        for how in ("edge", "clear", "restore"):
            truncate(db)
            lg = Log(db)
            for i, (role, content) in enumerate(convo):
                at = NOW - dt.timedelta(minutes=60 - i)
                if i == cut and how == "clear":
                    lg.add(ev.ContextCleared, at - dt.timedelta(seconds=1))
                if i == cut and how == "restore":
                    lg.add(ev.SessionSaveRequested, at - dt.timedelta(seconds=2))
                    lg.add(
                        ev.SessionRestoreRequested, at - dt.timedelta(seconds=1), session_id="last"
                    )
                lg.say(
                    role, content, at - (25 * HOUR if how == "edge" and i < cut else dt.timedelta())
                )
            lg.log.close()
            ctx = reader.context("alpha", "general", now=NOW)
            assert check_messages(ctx.messages, thinking=True) == [], (cut, how)
            if ctx.messages:
                reply_ = api.messages.create(
                    model="m",
                    max_tokens=4096,
                    thinking={"type": "enabled", "budget_tokens": 2048},
                    **ctx.to_anthropic(),
                )
                assert reply_.content[0].type == "text"
    # Uncut, every block comes back as posted, thinking byte for byte, no cache_control.
    ctx = reader.context("alpha", "general", now=NOW)
    assert ctx.messages[-2]["content"][0] == thinking("4")
    assert ctx.messages[0]["content"] == user
