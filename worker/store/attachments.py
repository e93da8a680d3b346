"""The store's side of attachments: the bytes a batch brings go into the `attachments`
table in the batch's transaction, once per hash (ingest/attachments.py brings them from
Redis and checks them)."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg.rows import TupleRow

from contextlog.schema.queries import query
from contextlog.worker.store.batch import Accepted


def insert(cur: psycopg.Cursor[TupleRow], batch: Sequence[Accepted]) -> None:
    """In the batch's transaction: store the bytes the batch brings, once per hash (a
    hash stored meanwhile by another shard's writer is skipped by the key)."""
    blobs: dict[str, bytes] = {}
    for a in batch:
        blobs.update(a.blobs)
    for sha, data in sorted(blobs.items()):
        # %b: the bytes go in binary, not as 2x hex text.
        params = {"sha256": bytes.fromhex(sha), "size": len(data), "data": data}
        cur.execute(query("insert_attachment"), params)


def stored(conn: psycopg.Connection[TupleRow], hashes: Sequence[str]) -> set[str]:
    """Which of `hashes` the `attachments` table holds."""
    rows = conn.execute(query("attachments_stored"), {"hashes": [bytes.fromhex(h) for h in hashes]})
    return {bytes(sha256).hex() for (sha256,) in rows}
