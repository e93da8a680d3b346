"""Search across an agent's log, as adapters read it: the hits of one page and their
parameters (`ContextReader.search`; the query syntax is `schema.search`'s)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from contextlog.schema import search
from contextlog.schema.errors import Refused

PER_PAGE: Final = 10
MAX_PER_PAGE: Final = 50
# How many of the newest matches are ranked (see the `search_messages` query): a query
# over a large log stays fast, and older matches are reached with `since`/`until` or a
# narrower scope.
RANK_WINDOW: Final = 1000

# The space set before and after each CJK character for the index (`schema.search.spaced`),
# taken out of a snippet again (also where a ** marking a match sits between).
_CJK_CLASS: Final = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_BEFORE: Final = re.compile(rf" ((?:\*\*)?[{_CJK_CLASS}])")
_AFTER: Final = re.compile(rf"([{_CJK_CLASS}](?:\*\*)?) ")
_SPACE: Final = re.compile(r"\s+")


@dataclass(frozen=True)
class SearchHit:
    """One message that matches: where it is, who said it, and its matching words in
    context (`snippet`, the words found between ** and **), with the live sessions that
    hold it (`restore` follows one)."""

    agent: str
    channel: str
    thread: str  # "" is the main line
    seq: int
    event_id: str
    at: dt.datetime  # when it was logged (the authoritative time)
    occurred_at: dt.datetime  # the platform's time (an imported message's original time)
    sender: str | None
    role: str
    snippet: str
    sessions: list[str] = field(default_factory=list)
    rank: float = 0.0


@dataclass(frozen=True)
class SearchPage:
    """One page of hits, best first (newest first among equals); iterate it for the hits.
    `total` counts the matches ranked: at most `RANK_WINDOW`, the newest (`capped`: there
    may be older ones; narrow the search with `since`, `until`, a channel or a sender)."""

    query: str
    hits: list[SearchHit]
    page: int
    per_page: int
    total: int

    @property
    def capped(self) -> bool:
        """Whether older matches were left out of the ranking."""
        return self.total >= RANK_WINDOW

    @property
    def pages(self) -> int:
        """How many pages there are (at least 1)."""
        return max(1, -(-self.total // self.per_page))

    def __iter__(self) -> Iterator[SearchHit]:
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)


@dataclass(frozen=True)
class HitRow:
    """A row of the `search_messages` query, read by column name."""

    agent: str | None  # None (every column but `matches`): the page is past the last hit
    channel: str
    thread: str
    seq: int
    at: dt.datetime
    sender: str | None
    role: str
    rank: float
    matches: int


@dataclass(frozen=True)
class DetailRow:
    """A row of the `search_details` query: what a hit shows."""

    event_id: Any
    occurred_at: dt.datetime
    snippet: str | None
    sessions: list[str]


@dataclass(frozen=True)
class Scope:
    """What a search looks through, within its agent (None: all of it)."""

    channel: str | None = None
    thread: str | None = None
    sender: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None


def params(
    agent: str, query: str, scope: Scope, page: int = 1, per_page: int = PER_PAGE
) -> dict[str, Any]:
    """The parameters of one page of a search; bad input is `Refused`, saying why."""
    if not agent:
        raise Refused("search: name the agent whose log to search")
    if page < 1 or not 1 <= per_page <= MAX_PER_PAGE:
        raise Refused(f"search: page must be >= 1 and per_page 1..{MAX_PER_PAGE}")
    if page * per_page > RANK_WINDOW:
        raise Refused(
            f"search: only the best {RANK_WINDOW} matches are paged; narrow the search "
            "(since, until, channel, sender) to reach others"
        )
    for name, at in (("since", scope.since), ("until", scope.until)):
        if at is not None and at.tzinfo is None:
            raise Refused(f"search: {name} must be timezone-aware (e.g. datetime.now(UTC))")
    try:
        tsquery = search.to_tsquery(query)
    except search.QueryError as e:
        raise Refused(f"search: {e}") from None
    return {
        "agent": agent,
        "tsquery": tsquery,
        "channel": scope.channel,
        "thread": scope.thread,
        "sender": scope.sender,
        "since": scope.since,
        "until": scope.until,
        "window": RANK_WINDOW,
        "limit": per_page,
        "offset": (page - 1) * per_page,
    }


def snippet(text: str | None) -> str:
    """A headline as people read it: the spaces set between CJK characters removed."""
    if not text:
        return ""
    text = _AFTER.sub(r"\1", _BEFORE.sub(r"\1", text)).replace("****", "")
    return _SPACE.sub(" ", text).strip()


def hits_of(rows: Sequence[HitRow]) -> list[HitRow]:
    """The page's hits (none when the page is past the last one)."""
    return [r for r in rows if r.agent is not None]


def details_params(params: dict[str, Any], hits: Sequence[HitRow]) -> dict[str, Any]:
    """The parameters of `search_details` for a page's hits."""
    return {
        "agent": params["agent"],
        "tsquery": params["tsquery"],
        "channels": [h.channel for h in hits],
        "seqs": [h.seq for h in hits],
    }


def to_page(
    query: str,
    rows: Sequence[HitRow],
    details: Sequence[DetailRow],
    page: int,
    per_page: int,
) -> SearchPage:
    """The page of hits the `search_messages` and `search_details` queries returned."""
    hits = [
        SearchHit(
            agent=str(r.agent),
            channel=r.channel,
            thread=r.thread,
            seq=int(r.seq),
            event_id=str(d.event_id),
            at=r.at,
            occurred_at=d.occurred_at,
            sender=r.sender,
            role=r.role,
            snippet=snippet(d.snippet),
            sessions=list(d.sessions or ()),
            rank=float(r.rank),
        )
        for r, d in zip(hits_of(rows), details, strict=True)
    ]
    total = int(rows[0].matches) if rows else 0
    return SearchPage(query, hits, page, per_page, total)
