"""`contextlog rebuild`: drop the projections and replay the log through the same fold."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from psycopg.rows import TupleRow

from schema.queries import query
from worker import projection
from worker.eventlog import REBUILD_LOCK

CHUNK = 20_000


def rebuild(
    conn: psycopg.Connection[TupleRow],
    progress: Callable[[int, int], None] | None = None,
    chunk: int = CHUNK,
) -> int:
    """Rebuild conversations and threads from `events` in one transaction; returns events read.

    Ingest waits meanwhile (it takes the rebuild lock shared in every batch) and readers
    see the old projections until the new ones commit.
    """
    done = 0
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (REBUILD_LOCK,))
        row = conn.execute("SELECT count(*) FROM events").fetchone()
        total = int(row[0]) if row else 0
        conn.execute("TRUNCATE conversations, threads")
        with conn.cursor(name="contextlog_replay") as source, conn.cursor() as cur:
            source.itersize = chunk
            source.execute(query("replay_events"))
            while rows := source.fetchmany(chunk):
                convs, threads = projection.fold(
                    projection.Row(
                        r[0], r[1], r[2], r[3], r[4], projection.settings_of(r[5]) if r[5] else None
                    )
                    for r in rows
                )
                projection.apply(cur, convs, threads)
                done += len(rows)
                if progress:
                    progress(done, total)
    return done
