"""`contextlog rebuild`: drop the projections and replay the log through the same fold."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from contextlog.schema import codec
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.queries import query
from contextlog.worker.store import projection
from contextlog.worker.store.handlers import ANSWERS, BARRIERS, COMMANDS, handle
from contextlog.worker.store.locks import REBUILD_LOCK
from contextlog.worker.store.projection import CONFIGURE
from contextlog.worker.store.search import reindex

CHUNK = 20_000
# The commands a replay applies: all but the answers (a search is not run again).
REPLAYED = COMMANDS - ANSWERS


def rebuild(
    conn: psycopg.Connection[TupleRow],
    progress: Callable[[int, int], None] | None = None,
    chunk: int = CHUNK,
    defaults: ConversationDefaults | None = None,
) -> int:
    """Rebuild conversations, threads, sessions, notes, the search index and attachment
    references from `events` in one transaction; returns events read. The commands'
    effects (notices, jobs) are not sent again, and searches (`search.v1`) are not
    answered again.

    Ingest waits meanwhile (it takes the rebuild lock shared in every batch) and readers
    see the old projections until the new ones commit.
    """
    defaults = defaults or ConversationDefaults()
    done = 0
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (REBUILD_LOCK,))
        (total,) = conn.execute("SELECT count(*) FROM events").fetchone() or (0,)
        conn.execute(
            "TRUNCATE conversations, threads, sessions, notes, search_messages,"
            " search_pending, attachment_refs"
        )
        with conn.cursor(name="contextlog_replay") as source, conn.cursor() as cur:
            source.itersize = chunk
            source.execute(query("replay_events"), {"with_payload": [*REPLAYED, CONFIGURE]})
            while rows := source.fetchmany(chunk):
                _replay(cur, rows, defaults)
                done += len(rows)
                if progress:
                    progress(done, total)
        reindex(conn)
        conn.execute(query("refs_reindex"))
    return done


def _replay(
    cur: psycopg.Cursor[TupleRow], rows: list[tuple[Any, ...]], d: ConversationDefaults
) -> None:
    """Fold a chunk round by round, applying the commands as live ingest does."""
    events, commands = _replayed(rows)
    for segment in projection.rounds(events, _conversation, _is_command, _is_setting, _is_barrier):
        convs, threads = projection.fold(segment)
        projection.apply(cur, convs, threads, d)
        projection.segments(cur, convs, threads, d)
        for row in segment:
            if _is_command(row):
                seq, payload = commands[id(row)]
                event = codec.decode(payload.encode(), 1 << 30, check=False)
                handle(cur, event, seq, row.at, d)


def _replayed(
    rows: list[tuple[Any, ...]],
) -> tuple[list[projection.Row], dict[int, tuple[int, str]]]:
    """A chunk of `replay_events` as the fold reads it, and each command's seq and payload
    by the id of its row. Unpacked, not `class_row`: a rebuild reads the whole log."""
    events = []
    commands = {}
    for agent, channel, thread, kind, at, tokens, seq, payload, source, mark in rows:
        settings = projection.settings_of(json.loads(payload)) if kind == CONFIGURE else None
        row = projection.Row(agent, channel, thread, kind, at, settings, tokens, source, mark or 0)
        events.append(row)
        if kind in REPLAYED:
            commands[id(row)] = (seq, payload)
    return events, commands


def _conversation(row: projection.Row) -> tuple[str, str]:
    return (row.agent, row.channel)


def _is_command(row: projection.Row) -> bool:
    return row.kind in REPLAYED


def _is_barrier(row: projection.Row) -> bool:
    return row.kind in BARRIERS


def _is_setting(row: projection.Row) -> bool:
    return row.kind == CONFIGURE
