"""Search across an agent's log (issue 34.1), on real Postgres: the syntax, scoping, what
is found (outside the window, in deleted sessions, tool inputs, documents) and what is
not (another agent's rows, base64, thinking), ranking and pages, maintenance in the
batch's transaction, rebuild and the backfill. Every test runs on both readers."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextlog.producers import search as found
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.schema.errors import EventRejected, Refused
from contextlog.worker.cli import main as cli
from contextlog.worker.store import search as store_search
from contextlog.worker.store.rebuild import rebuild
from tests.support import properties
from tests.support.readers import Twin, indexed, twin
from tests.support.services import truncate
from tests.support.session_stack import Stack
from tests.support.thinking_bot import Log

__all__ = ["twin"]

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5E"
    "rkJggg=="
)


def found_texts(page: found.SearchPage) -> list[str]:
    return [h.snippet.replace("**", "") for h in page]


def search(twin: Twin, query: str, agent: str = "alpha", **kw: Any) -> found.SearchPage:
    page: found.SearchPage = twin.search(agent, query, **kw)
    return page


def test_words_phrases_prefixes_exclusions_and_or(log: Log, twin: Twin) -> None:
    log.say("user", "We decided the rollback happens on Friday")
    log.say("assistant", "Friday rollback noted; the deploy waits")
    log.say("user", "decided: no deploy before the rollback drill")
    assert len(search(twin, "rollback")) == 3
    assert len(search(twin, "rollback friday")) == 2  # both words
    phrase = search(twin, '"decided the rollback"')
    assert [h.seq for h in phrase] == [1]
    assert len(search(twin, "roll*")) == 3
    assert len(search(twin, "rollback -drill")) == 2
    assert len(search(twin, "friday OR drill")) == 3
    assert len(search(twin, "deploy friday OR drill")) == 2  # deploy and (friday or drill)
    assert len(search(twin, "ROLLBACK")) == 3  # case is ignored
    assert "**decided** **the** **rollback** happens" in phrase.hits[0].snippet


def test_accents_and_scripts_without_spaces(log: Log, twin: Twin) -> None:
    log.say("user", "Le café de la Straße était naïf")
    log.say("user", "我们决定明天回滚部署")
    log.say("user", "ロールバックは明日です")
    assert len(search(twin, "cafe strasse naif")) == 1
    assert len(search(twin, "CAFÉ")) == 1
    cjk = search(twin, "回滚")
    assert len(cjk) == 1 and cjk.hits[0].snippet == "我们决定明天**回滚**部署"
    assert len(search(twin, "ロールバック")) == 1
    assert len(search(twin, "回部")) == 0  # a phrase: these characters next to each other


def test_always_scoped_to_one_agent_and_the_filters_narrow(log: Log, twin: Twin) -> None:
    log.say("user", "shared secret word", channel="general", sender="ann")
    log.say("user", "shared secret word", channel="random", thread="t1", sender="bob")
    log.now = NOW + 2 * HOUR
    log.say("user", "shared secret word", channel="random", sender="ann")
    log.add(ev.MessagePosted, agent="beta", role="user", content="shared secret word")
    assert len(search(twin, "secret")) == 3
    assert [h.agent for h in search(twin, "secret", agent="beta")] == ["beta"]
    assert len(search(twin, "secret", channel="random")) == 2
    assert [h.thread for h in search(twin, "secret", thread="t1")] == ["t1"]
    assert [h.sender for h in search(twin, "secret", sender="ann")] == ["ann", "ann"]
    assert len(search(twin, "secret", since=NOW + HOUR)) == 1
    assert len(search(twin, "secret", until=NOW + HOUR)) == 2
    assert search(twin, "secret", agent="gamma").total == 0


def test_outside_the_window_and_in_deleted_sessions_with_the_sessions_that_hold_them(
    log: Log, twin: Twin
) -> None:
    log.say("user", "the migration plan for tuesday")
    log.add(ev.SessionSaveRequested, description="plan")
    log.say("user", "another talk")
    log.add(ev.SessionSaveRequested, description="talk")
    log.add(ev.ContextCleared)
    log.add(ev.SessionDeleteRequested, session_id="2026-11-22_talk")
    log.now = NOW + 72 * HOUR  # far outside the rolling window
    plan, talk = search(twin, "migration"), search(twin, "another")
    # Both sessions hold the first message; the deleted one is not offered.
    assert plan.hits[0].sessions == ["2026-11-22_plan"]
    assert talk.total == 1 and talk.hits[0].sessions == []  # its session is deleted
    assert plan.hits[0].seq == 1 and plan.hits[0].event_id


def test_tool_inputs_results_and_documents_but_not_base64_or_thinking(log: Log, twin: Twin) -> None:
    log.say(
        "assistant",
        [
            {"type": "thinking", "thinking": "ponder zanzibar", "signature": "sigzebra"},
            {"type": "text", "text": "looking it up"},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "okapi"}},
        ],
    )
    log.say(
        "user",
        [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "quokka facts"},
            {
                "type": "document",
                "title": "Narwhal report",
                "source": {"type": "text", "media_type": "text/plain", "data": "tusk data"},
            },
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ],
    )
    for word in ("okapi", "quokka", "narwhal", "tusk", "looking"):
        assert len(search(twin, word)) == 1, word
    for word in (
        "zanzibar",
        "sigzebra",
        PNG.rstrip("="),  # base64 is never indexed (here: taken out as an attachment)
        "lookup",
    ):
        assert len(search(twin, word)) == 0, word


def test_ranked_then_newest_first_and_paged(log: Log, twin: Twin) -> None:
    for i in range(12):
        log.now = NOW + i * HOUR
        log.say("user", f"status report number {i}")
    log.now = NOW - HOUR
    log.say("user", "status report status report")  # the best match, and the oldest
    first = search(twin, '"status report"', per_page=5)
    assert first.total == 13 and first.pages == 3 and not first.capped
    assert first.hits[0].snippet.count("**status**") == 2
    assert [h.seq for h in first.hits[1:]] == [12, 11, 10, 9]  # equals: newest first
    third = search(twin, '"status report"', per_page=5, page=3)
    assert [h.seq for h in third] == [3, 2, 1]
    past = search(twin, '"status report"', per_page=5, page=4)
    assert past.total == 13 and len(past) == 0


@pytest.mark.parametrize(
    ("query", "kw", "why"),
    [
        ("", {}, "no word to look for"),
        ("-draft", {}, "only words to leave out"),
        ("?? !!", {}, "no word to look for"),
        ("x", {"per_page": 0}, "per_page"),
        ("x", {"page": 0}, "page must be"),
        ("x", {"page": 101, "per_page": 10}, "best 1000 matches"),
        ("x", {"since": dt.datetime(2026, 1, 1)}, "timezone-aware"),
        ("x " * 40, {}, "at most 32"),
        ("a\x00b", {}, "NUL"),
    ],
)
def test_bad_input_is_refused_saying_why(
    twin: Twin, query: str, kw: dict[str, Any], why: str
) -> None:
    with pytest.raises(Refused, match=why):
        search(twin, query, **kw)


def test_messages_are_queued_in_the_batch_and_indexed_right_after_and_rebuild_agrees(
    db: str, log: Log, twin: Twin
) -> None:
    log.say("user", "alpha bravo charlie")
    log.say("assistant", [{"type": "text", "text": "delta echo"}])
    log.add(ev.SearchRequested, query="bravo")
    with psycopg.connect(db) as conn:
        assert store_search.lag(conn).waiting == 2  # queued in the batches, commands not
        assert _search_rows(db) == []
        assert store_search.index_pending(conn, limit=1) == 1
        assert store_search.index_all(conn) == 1
        assert store_search.lag(conn) == (0, None)
    rows = _search_rows(db)
    assert len(rows) == 2
    with psycopg.connect(db) as conn:
        rebuild(conn)
    assert _search_rows(db) == rows
    with psycopg.connect(db) as conn:  # as migration 016 left an older log
        conn.execute("DELETE FROM search_messages")
        conn.execute(
            "INSERT INTO search_backfill (below) VALUES (1000) ON CONFLICT (id)"
            " DO UPDATE SET below = 1000"
        )
        conn.commit()
        assert store_search.backfill_left(conn) > 0
        assert store_search.backfill(conn, budget=10, step=1) == 3
        assert store_search.backfill(conn, budget=10, step=1) == 0
        assert store_search.backfill_left(conn) == 0
    assert _search_rows(db) == rows


def _search_rows(db: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db) as conn:
        return conn.execute(
            "SELECT agent, channel, seq, thread, position, recorded_at, role, sender,"
            " words::text FROM search_messages ORDER BY agent, channel, seq"
        ).fetchall()


VOCABULARY = ["ant", "bee", "bear", "beaver", "cat", "cow", "dog", "dove"]


@settings(
    max_examples=properties.examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    texts=st.lists(
        st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=6).map(" ".join),
        min_size=1,
        max_size=12,
    ),
    word=st.sampled_from(VOCABULARY),
    other=st.sampled_from(VOCABULARY),
)
def test_what_is_found_is_what_holds_the_words(
    db: str, twin: Twin, texts: list[str], word: str, other: str
) -> None:
    """Oracle: the query syntax's own rules on whitespace-separated words: a word is found
    where it is a word, a prefix where a word starts with it, a phrase where the words
    follow each other, an exclusion where it is absent."""
    truncate(db)
    lg = Log(db)
    try:
        for t in texts:
            lg.say("user", t)
    finally:
        lg.close()
    words = [t.split() for t in texts]
    pairs = [list(itertools.pairwise(w)) for w in words]
    cases = {
        word: [word in w for w in words],
        f"{word[:2]}*": [any(x.startswith(word[:2]) for x in w) for w in words],
        f'"{word} {other}"': [(word, other) in p for p in pairs],
        f"{word} -{other}": [word in w and other not in w for w in words],
        f"{word} OR {other}": [word in w or other in w for w in words],
    }
    for query, expected in cases.items():
        got = {h.seq for h in search(twin, query, per_page=50)}
        assert got == {i + 1 for i, hit in enumerate(expected) if hit}, query


def test_the_search_command_answers_with_this_conversations_matches(stack: Stack) -> None:
    stack.say("the canary is yellow", sender="ann")
    stack.say("the canary sings", channel="elsewhere", sender="bob")
    stack.stored(stack.say("unrelated"))
    indexed(stack.settings.database_url)
    stack.producer.search("alpha", "general", "canary", source="test")
    n = stack.notice(nt.SEARCH_RESULTS)
    assert n.total == 1 and n.hits is not None and n.page == 1
    assert [(h.channel, h.sender, h.snippet) for h in n.hits] == [
        ("general", "ann", "the **canary** is yellow")
    ]
    assert n.text is not None and n.text.startswith("1 messages match 'canary'")
    with pytest.raises(EventRejected, match="no word to look for"):
        stack.producer.search("alpha", "general", "-canary", source="test")


def test_cli_search_and_send_search(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    stack.say("deploy freeze starts monday", sender="ann")
    stack.reader.context("alpha", "ops", wait_for=stack.say("freeze lifted", channel="ops"))
    indexed(stack.settings.database_url)
    capsys.readouterr()
    assert cli.main(["search", "alpha", "freeze", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"] == 2 and {h["channel"] for h in out["hits"]} == {"general", "ops"}
    assert cli.main(["search", "alpha", "freeze", "--channel", "ops"]) == 0
    text = capsys.readouterr().out
    assert "1 matches of 'freeze'" in text and "**freeze** lifted" in text
    assert cli.main(["search", "alpha", "--", "-freeze"]) == 2
    assert "only words to leave out" in capsys.readouterr().err
    assert cli.main(["send", "search", "alpha", "general", "deploy", "--source", "test"]) == 0
    assert "**deploy** freeze starts monday" in capsys.readouterr().out
