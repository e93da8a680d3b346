"""Where a canary string still is: every row of every table and a `pg_dump` of the data in
Postgres, every key of a Redis database (read by type, and DUMPed), the proof that an
erase left nothing (issue 34.4).

A needle is looked for as text, as the hex of its bytes (bytea in a dump or a row), and
in zlib-compressed values (RQ keeps a job's arguments so), case-sensitively.
"""

from __future__ import annotations

import subprocess
import zlib
from collections.abc import Iterable
from typing import Any

import psycopg
import redis

from tests.support.servers import client_tool


def forms(needle: str) -> list[bytes]:
    """The shapes a stored needle may take: its bytes, its hex (either case)."""
    raw = needle.encode()
    return [raw, raw.hex().encode(), raw.hex().upper().encode()]


def _found(data: bytes, needles: Iterable[str]) -> set[str]:
    out = set()
    for needle in needles:
        if any(f in data for f in forms(needle)):
            out.add(needle)
    return out


def postgres(url: str, needles: list[str]) -> dict[str, set[str]]:
    """Where each needle is: `table` (its rows as text) and `pg_dump` (the data)."""
    hits: dict[str, set[str]] = {}
    with psycopg.connect(url) as conn:
        version = conn.info.server_version
        tables = [
            t
            for (t,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
            )
        ]
        for t in tables:
            for (row,) in conn.execute(f'SELECT t::text FROM "{t}" t'):
                for n in _found(row.encode(), needles):
                    hits.setdefault(n, set()).add(t)
    dump = subprocess.run(
        [str(client_tool("pg_dump", version)), "--data-only", "--dbname", url],
        capture_output=True,
        check=True,
        timeout=300,
    ).stdout
    for n in _found(dump, needles):
        hits.setdefault(n, set()).add("pg_dump")
    return hits


def redis_keys(redis_client: redis.Redis, needles: list[str]) -> dict[str, set[str]]:
    """Where each needle is among the keys of the client's database (by key)."""
    client: Any = redis_client  # replies are bytes (decode_responses off)
    hits: dict[str, set[str]] = {}
    for key in client.scan_iter(count=1000):
        for blob in _values(client, key):
            for n in _found(blob, needles) | _found(_inflated(blob), needles):
                hits.setdefault(n, set()).add(key.decode(errors="replace"))
    return hits


def _values(client: Any, key: bytes) -> list[bytes]:
    """A key's content read by its type, and its DUMP."""
    kind = client.type(key).decode()
    parts: list[Any] = [key]
    if kind == "string":
        parts.append(client.get(key))
    elif kind == "hash":
        parts += [x for kv in client.hgetall(key).items() for x in kv]
    elif kind == "stream":
        for entry_id, fields in client.xrange(key):
            parts += [entry_id, *(x for kv in fields.items() for x in kv)]
    elif kind == "list":
        parts += client.lrange(key, 0, -1)
    elif kind == "set":
        parts += list(client.smembers(key))
    elif kind == "zset":
        parts += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
    dumped = client.dump(key)
    if dumped is not None:
        parts.append(dumped)
    return [p if isinstance(p, bytes) else str(p).encode() for p in parts if p is not None]


def _inflated(blob: bytes) -> bytes:
    if blob[:1] != b"\x78":  # zlib's header
        return b""
    try:
        return zlib.decompress(blob)
    except zlib.error:
        return b""
