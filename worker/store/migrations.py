"""Schema migrations: the numbered files of schema/sql/, each applied once, in order."""

from __future__ import annotations

from typing import Final

import psycopg
from psycopg.rows import TupleRow

from contextlog.schema.errors import MigrationError
from contextlog.schema.queries import migrations

# pg_advisory_xact_lock key of `contextlog migrate`: two processes migrating at once
# queue on it instead of racing on CREATE TABLE.
MIGRATION_LOCK: Final = 0x636F6E74  # "cont"


def migrate(conn: psycopg.Connection[TupleRow], *, upto: int | None = None) -> list[str]:
    """Apply missing migrations in one transaction; returns the names applied. `upto`
    stops after that version (tests build a database as an older release left it)."""
    applied: list[str] = []
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {v for (v,) in conn.execute("SELECT version FROM schema_migrations")}
            for m in migrations():
                if m.version in done or (upto is not None and m.version > upto):
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
