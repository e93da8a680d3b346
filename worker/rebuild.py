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
from contextlog.worker import projection
from contextlog.worker.eventlog import REBUILD_LOCK
from contextlog.worker.handlers import COMMANDS, handle
from contextlog.worker.projection import CONFIGURE

CHUNK = 20_000


def rebuild(
    conn: psycopg.Connection[TupleRow],
    progress: Callable[[int, int], None] | None = None,
    chunk: int = CHUNK,
    defaults: ConversationDefaults | None = None,
) -> int:
    """Rebuild conversations, threads and sessions from `events` in one transaction;
    returns events read. The commands' effects (notices, jobs) are not sent again.

    Ingest waits meanwhile (it takes the rebuild lock shared in every batch) and readers
    see the old projections until the new ones commit.
    """
    defaults = defaults or ConversationDefaults()
    done = 0
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (REBUILD_LOCK,))
        row = conn.execute("SELECT count(*) FROM events").fetchone()
        total = int(row[0]) if row else 0
        conn.execute("TRUNCATE conversations, threads, sessions")
        with conn.cursor(name="contextlog_replay") as source, conn.cursor() as cur:
            source.itersize = chunk
            source.execute(query("replay_events"), {"with_payload": [*COMMANDS, CONFIGURE]})
            while rows := source.fetchmany(chunk):
                _replay(cur, rows, defaults)
                done += len(rows)
                if progress:
                    progress(done, total)
    return done


def _replay(
    cur: psycopg.Cursor[TupleRow], rows: list[tuple[Any, ...]], d: ConversationDefaults
) -> None:
    """Fold a chunk round by round, applying the commands as live ingest does."""
    for segment in projection.rounds(rows, lambda r: (r[0], r[1]), lambda r: r[3] in COMMANDS):
        projection.apply(
            cur,
            *projection.fold(
                projection.Row(
                    r[0],
                    r[1],
                    r[2],
                    r[3],
                    r[4],
                    projection.settings_of(json.loads(r[7])) if r[3] == CONFIGURE else None,
                    r[5],
                    r[8],
                )
                for r in segment
            ),
            d.token_budget,
        )
        for r in segment:
            if r[3] in COMMANDS:
                handle(cur, codec.decode(r[7].encode(), 1 << 30, check=False), int(r[6]), d)
