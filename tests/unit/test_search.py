"""The search query syntax (schema/search.py) and how a snippet reads (producers/search.py):
pure rules, no database."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextlog.producers import search as found
from contextlog.schema import codec, search
from contextlog.schema import events as ev
from contextlog.schema.errors import EventRejected
from tests.unit.test_events import COMMON


@pytest.mark.parametrize(
    ("query", "tsquery"),
    [
        ("rollback", "'rollback'"),
        ("rollback plan", "'rollback' & 'plan'"),
        ('"we decided"  roll*', "'we decided' & 'roll':*"),
        ('a -b -"c d"', "'a' & !'b' & !'c d'"),
        ("a b OR c | d", "'a' & ( 'b' | 'c' | 'd' )"),
        ("OR a", "'a'"),
        ("O'Brien back\\slash", "'O''Brien' & 'back\\\\slash'"),
        ("回滚", "' 回  滚 '"),
        ('"unterminated phrase', "'unterminated phrase'"),
        ("what ?", "'what'"),
    ],
)
def test_queries_become_tsqueries(query: str, tsquery: str) -> None:
    assert search.to_tsquery(query) == tsquery


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("", "no word to look for"),
        ("   ", "no word to look for"),
        ("-a -b", "only words to leave out"),
        ("*", "no word to look for"),
        ("x" * 501, "at most 500"),
        (" ".join(["w"] * 33), "at most 32"),
    ],
)
def test_queries_without_anything_to_look_for_are_refused(query: str, why: str) -> None:
    with pytest.raises(search.QueryError, match=why):
        search.to_tsquery(query)


@given(st.text(max_size=120))
def test_any_text_is_a_query_or_a_reason(query: str) -> None:
    why = search.check(query)
    if why is None:
        text = search.to_tsquery(query)
        assert text.count("'") % 2 == 0  # every operand quoted, quotes doubled inside
    else:
        assert why


def test_the_search_command_is_checked_at_the_edge() -> None:
    ok = ev.SearchRequested(query="rollback", **COMMON)
    assert codec.decode(codec.encode(ok)) == ok
    bad = ev.SearchRequested(query="-rollback", **COMMON)
    with pytest.raises(EventRejected, match="only words to leave out"):
        codec.decode(codec.encode(bad))


def test_erased_is_written_by_ingest_only() -> None:
    import uuid

    marked = ev.ContextCleared(erased=ev.ErasedMark(erase_id=uuid.uuid4()), **COMMON)
    with pytest.raises(EventRejected, match="written by ingest only"):
        codec.decode(codec.encode(marked))
    assert codec.decode(codec.encode(marked), check=False) == marked


@pytest.mark.parametrize(
    ("headline", "snippet"),
    [
        ("we **decided** the\nrollback", "we **decided** the rollback"),
        (search.spaced("我们决定明天回滚部署"), "我们决定明天回滚部署"),
        (search.spaced("我们决定明天").rstrip() + "  **回**  **滚**  部", "我们决定明天**回滚**部"),
        (search.spaced("Café 回滚 ok"), "Café 回滚 ok"),
        (None, ""),
    ],
)
def test_snippets_read_as_written(headline: str | None, snippet: str) -> None:
    assert found.snippet(headline) == snippet
