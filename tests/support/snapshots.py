"""Every table a replay derives from the log, as rows: what `contextlog rebuild` must give
back after retention or an erase (and what live ingest left)."""

from __future__ import annotations

from typing import Any

import psycopg

from contextlog.worker.store.search import index_all

# Each derived table with the order its rows are compared in.
DERIVED = {
    "conversations": "agent, channel",
    "threads": "agent, channel, thread",
    "sessions": "agent, channel, session_id",
    "notes": "agent, channel, thread, seq",
    "search_messages": "agent, channel, seq",
    "attachment_refs": "agent, channel, seq, sha256",
}


def derived(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of every derived table (search words as text), and the attachments kept,
    once the search indexer has caught up (it runs right after ingest, a rebuild at once)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with psycopg.connect(url) as conn:
        index_all(conn)
        for table, order in DERIVED.items():
            columns = "*, words::text" if table == "search_messages" else "*"
            rows = conn.execute(f"SELECT {columns} FROM {table} ORDER BY {order}").fetchall()
            if table == "search_messages":  # tsvector itself does not compare
                rows = [r[:-2] + r[-1:] for r in rows]
            out[table] = rows
        out["attachments"] = conn.execute(
            "SELECT sha256, size FROM attachments ORDER BY sha256"
        ).fetchall()
    return out


def log(url: str) -> list[tuple[Any, ...]]:
    """The events as stored, in log order."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT position, agent, channel, seq, kind, payload FROM events ORDER BY position"
        ).fetchall()
