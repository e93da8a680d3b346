"""The store's side of search: `/context search` answered by ingest (a notice with one page
of matches), the backfill of messages stored before migration 016, and the reindex of
`contextlog rebuild`. The rows themselves are written by the `contextlog_search` trigger
in every batch's transaction (016); the reads are `ContextReader.search`'s."""

from __future__ import annotations

import datetime as dt
from typing import Final, NamedTuple

import psycopg
from psycopg.rows import TupleRow, class_row

from contextlog.producers import search as found
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.errors import Refused
from contextlog.schema.queries import query
from contextlog.worker.effects.kinds import Effect
from contextlog.worker.store.replies import Cursor, notice, refused, rows_as

# A `/context search` runs in ingest's transaction: it may take at most this long (the
# batch then goes on, the adapter is told to narrow the search).
ANSWER_TIMEOUT_MS: Final = 2000
REINDEX_CHUNK: Final = 200_000  # positions one reindex statement goes through
BACKFILL_STEP: Final = 20_000  # events one backfill statement goes through
INDEX_STEP: Final = 2_000  # queued messages the indexer takes in one transaction


def on_search(
    cur: Cursor, e: ev.SearchRequested, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """Answer `/context search` with a page of this conversation's matches: a person in a
    channel searches what that channel said, never another conversation of the agent
    (the library's `ContextReader.search` is the bot's, for wider scopes)."""
    try:
        params = found.params(e.agent, e.query, found.Scope(channel=e.channel), e.page)
    except Refused as why:
        return refused(e, str(why))
    (old,) = cur.execute(query("statement_timeout")).fetchone() or ("0",)
    try:
        with cur.connection.transaction():  # a savepoint: a cancelled search undoes itself
            cur.execute(query("set_statement_timeout"), {"timeout": str(ANSWER_TIMEOUT_MS)})
            # Bound in the text: planned for the query's words (see `reader._send_hits`).
            hits = psycopg.ClientCursor(cur.connection, row_factory=class_row(found.HitRow))
            rows = hits.execute(query("search_messages"), params, prepare=False).fetchall()
            details: list[found.DetailRow] = []
            if shown_hits := found.hits_of(rows):
                more = found.details_params(params, shown_hits)
                shown = rows_as(cur, found.DetailRow).execute(query("search_details"), more)
                details = shown.fetchall()
            cur.execute(query("set_statement_timeout"), {"timeout": old})
    except psycopg.errors.QueryCanceled:
        return refused(e, "the search took too long: narrow it (more words, a phrase)")
    page = found.to_page(e.query, rows, details, e.page, found.PER_PAGE)
    return notice(
        e,
        nt.SEARCH_RESULTS,
        describe(page),
        hits=[_hit(h) for h in page],
        total=page.total,
        page=page.page,
    )


def describe(page: found.SearchPage) -> str:
    """The page as lines for people: when, who, where, the snippet, the sessions."""
    if not page.total:
        return f"nothing matches {page.query!r}"
    more = "+" if page.capped else ""
    lines = [f"{page.total}{more} messages match {page.query!r} (page {page.page} of {page.pages})"]
    for h in page:
        where = f" in thread {h.thread}" if h.thread else ""
        who = h.sender or h.role
        held = f" [session {', '.join(h.sessions)}]" if h.sessions else ""
        lines.append(f"{h.at:%Y-%m-%d %H:%M} {who}{where}: {h.snippet}{held}")
    return "\n".join(lines)


def _hit(h: found.SearchHit) -> nt.NoticeHit:
    return nt.NoticeHit(
        channel=h.channel,
        thread=h.thread or None,
        seq=h.seq,
        event_id=h.event_id,
        at=h.at,
        sender=h.sender,
        role=h.role,
        snippet=h.snippet[:2000],
        sessions=h.sessions[:1000],
    )


def reindex(conn: psycopg.Connection[TupleRow], chunk: int = REINDEX_CHUNK) -> None:
    """Every message's search row again, from the log as it is (in the caller's
    transaction, `search_messages` emptied first): `contextlog rebuild`'s."""
    (lo, hi) = conn.execute(query("position_bounds")).fetchone() or (0, 0)
    for start in range(int(lo), int(hi) + 1, chunk):
        conn.execute(query("search_reindex"), {"lo": start, "hi": start + chunk})
    conn.execute(query("search_backfill_done"))


def index_pending(conn: psycopg.Connection[TupleRow], limit: int = INDEX_STEP) -> int:
    """One step of the indexer: up to `limit` queued messages indexed, in a transaction of
    their own; returns how many were taken (0: the queue is empty)."""
    with conn.transaction():
        row = conn.execute(query("search_index_pending"), {"limit": limit}).fetchone()
    return int(row[0]) if row else 0


def index_all(conn: psycopg.Connection[TupleRow]) -> int:
    """Index every queued message (tests, benchmarks, a rebuild's end); how many."""
    done = 0
    while n := index_pending(conn):
        done += n
    return done


class Lag(NamedTuple):
    """What waits for the indexer: how many messages, and when the oldest was logged."""

    waiting: int
    oldest: dt.datetime | None


def lag(conn: psycopg.Connection[TupleRow]) -> Lag:
    """The indexer's lag (`contextlog status`)."""
    row = conn.cursor(row_factory=class_row(Lag)).execute(query("search_lag")).fetchone()
    return row or Lag(0, None)


def backfill(conn: psycopg.Connection[TupleRow], budget: int, step: int = BACKFILL_STEP) -> int:
    """Index up to `budget` events stored before migration 016, newest first, a step a
    transaction (the worker's sweeper calls it each cycle); returns how many it went
    through (0: none left)."""
    done = 0
    while done < budget:
        with conn.transaction():
            row = conn.execute(query("search_backfill_step"), {"limit": step}).fetchone()
        events, below = row if row else (0, 0)
        done += int(events)
        if not below:
            break
    return done


def backfill_left(conn: psycopg.Connection[TupleRow]) -> int:
    """About how many events are still to be indexed by the backfill (0: none)."""
    row = conn.execute(query("search_backfill_left")).fetchone()
    return int(row[0]) if row else 0
