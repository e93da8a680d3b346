"""Postgres side of ingest: migrations and the idempotent, fenced batch append."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from schema import events as ev
from schema.errors import Fenced, MigrationError
from schema.queries import migrations, query

# pg_advisory_xact_lock key of `contextlog migrate`: two processes migrating at once
# queue on it instead of racing on CREATE TABLE.
MIGRATION_LOCK: Final = 0x636F6E74  # "cont"


@dataclass(frozen=True)
class Accepted:
    """A decoded entry waiting to be appended: its stream id, event and original JSON."""

    entry_id: str
    event: ev.AnyEvent
    payload: bytes


def migrate(conn: psycopg.Connection[TupleRow]) -> list[str]:
    """Apply missing migrations in one transaction; returns the names applied."""
    applied: list[str] = []
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
            for m in migrations():
                if m.version in done:
                    continue
                conn.execute(m.sql.encode())
                conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                    (m.version, m.name),
                )
                applied.append(f"{m.version:03d}_{m.name}")
    except psycopg.errors.ProgrammingError as e:
        raise MigrationError(f"migration failed, nothing applied: {e}") from e
    return applied


class EventLog:
    """The `events` table and its per-shard checkpoint, written by one ingest connection."""

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self.conn = conn

    def append(self, shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        """Store a batch in one transaction; returns how many events were new.

        Events already in the log (redelivery after a crash) are skipped, so appending the
        same batch twice stores it once. Raises `Fenced` when a newer lease epoch has
        already written this shard.
        """
        with self.conn.transaction(), self.conn.cursor() as cur:
            fenced = (
                cur.execute(
                    query("advance_checkpoint"),
                    {
                        "shard": shard,
                        "epoch": epoch,
                        "last_entry_id": batch[-1].entry_id,
                        "events": 0,
                    },
                ).fetchone()
                is None
            )
            if fenced:
                raise Fenced(f"shard {shard}: epoch {epoch} is older than the last writer's")
            fresh = self._fresh(cur, batch)
            if fresh:
                self._insert(cur, fresh)
                cur.execute(
                    "UPDATE shard_checkpoints SET events = events + %s WHERE shard = %s",
                    (len(fresh), shard),
                )
        return len(fresh)

    def _fresh(self, cur: psycopg.Cursor[TupleRow], batch: Sequence[Accepted]) -> list[Accepted]:
        """The batch without events already stored or repeated within it, in stream order."""
        ids = [a.event.event_id for a in batch]
        stored: set[uuid.UUID] = {
            r[0] for r in cur.execute(query("existing_event_ids"), {"ids": ids})
        }
        fresh = []
        for a in batch:
            if a.event.event_id not in stored:
                stored.add(a.event.event_id)
                fresh.append(a)
        return fresh

    def _insert(self, cur: psycopg.Cursor[TupleRow], fresh: list[Accepted]) -> None:
        """Reserve per-conversation sequence numbers, then COPY the rows."""
        counts = Counter((a.event.agent, a.event.channel) for a in fresh)
        convs = sorted(counts)  # a fixed lock order: two writers cannot deadlock
        rows = cur.execute(
            query("advance_conversations"),
            {
                "agents": [c[0] for c in convs],
                "channels": [c[1] for c in convs],
                "counts": [counts[c] for c in convs],
            },
        ).fetchall()
        next_seq = {(r[0], r[1]): r[2] - counts[(r[0], r[1])] + 1 for r in rows}
        with cur.copy(query("copy_events")) as copy:
            for a in fresh:
                e = a.event
                key = (e.agent, e.channel)
                seq = next_seq[key]
                next_seq[key] = seq + 1
                copy.write_row(
                    (
                        e.event_id,
                        e.agent,
                        e.channel,
                        e.thread,
                        seq,
                        ev.kind_of(e),
                        e.occurred_at,
                        a.payload.decode(),
                    )
                )
