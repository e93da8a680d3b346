"""The reader's side of attachments: put the stored bytes back into a context, as base64.

A message stored with attachment references (`schema.attachments`) comes back from the
window query without its bytes; only the context a caller gets has them put back, after
the window was cut to its budget, with one query for the hashes still in it. History,
session listings, counts and summaries never ask for them. The base64 text of recently
read attachments is kept (`Cache`): a hash names its bytes forever, so a kept entry is
never stale, and a bot that reads its context every turn fetches an image once.
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Final, TypeVar

from contextlog.producers.context import Context
from contextlog.producers.history import SessionMessage
from contextlog.schema import attachments
from contextlog.schema.queries import query

CACHE_BYTES: Final = 64 << 20  # base64 characters kept per reader
T = TypeVar("T")


class Cache:
    """Base64 text of attachments by sha256, least recently used dropped past `limit`."""

    def __init__(self, limit: int = CACHE_BYTES) -> None:
        self.limit = limit
        self.size = 0
        self._items: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()  # a reader may serve several threads

    def get(self, hashes: Iterable[str]) -> dict[str, str]:
        """The kept entries among `hashes`."""
        found = {}
        with self._lock:
            for h in hashes:
                if (text := self._items.get(h)) is not None:
                    self._items.move_to_end(h)
                    found[h] = text
        return found

    def put(self, items: dict[str, str]) -> None:
        """Keep entries, dropping the least recently used past the limit."""
        with self._lock:
            for h, text in items.items():
                if h in self._items or len(text) > self.limit:
                    continue
                self._items[h] = text
                self.size += len(text)
            while self.size > self.limit:
                _, text = self._items.popitem(last=False)
                self.size -= len(text)


_HOLDERS: Final = attachments.HOLDS_SOURCE | {"tool_result"}


def needed(contents: Iterable[Any]) -> list[str]:
    """The hashes referenced in these message contents, sorted. Runs on every read: a
    tight loop looks at each block's type and walks only those that can hold a source."""
    found: set[str] = set()
    for content in contents:
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") in _HOLDERS:
                    found |= attachments.hashes([block])
    return sorted(found)


def _params(hashes: Sequence[str]) -> dict[str, Any]:
    return {"hashes": [bytes.fromhex(h) for h in hashes]}


def _texts(rows: Iterable[tuple[Any, ...]]) -> dict[str, str]:
    return {bytes(sha).hex(): base64.b64encode(data).decode("ascii") for sha, data in rows}


def fetch(conn: Any, hashes: Sequence[str], cache: Cache | None = None) -> dict[str, str]:
    """Base64 text by sha256 for `hashes`: from the cache, the rest in one query."""
    found = cache.get(hashes) if cache is not None else {}
    missing = [h for h in hashes if h not in found]
    if missing:
        cur = conn.execute(query("attachment_data"), _params(missing), binary=True)
        fresh = _texts(cur.fetchall())
        if cache is not None:
            cache.put(fresh)
        found.update(fresh)
    return found


async def afetch(conn: Any, hashes: Sequence[str], cache: Cache | None = None) -> dict[str, str]:
    """`fetch` on an asyncio connection."""
    found = cache.get(hashes) if cache is not None else {}
    missing = [h for h in hashes if h not in found]
    if missing:
        cur = await conn.execute(query("attachment_data"), _params(missing), binary=True)
        fresh = _texts(await cur.fetchall())
        if cache is not None:
            cache.put(fresh)
        found.update(fresh)
    return found


def restored(ctx: Context, data: dict[str, str]) -> Context:
    """The context with its references replaced by the base64 sources."""
    messages = [
        m
        if isinstance(m["content"], str)
        else {**m, "content": attachments.restore(m["content"], data)}
        for m in ctx.messages
    ]
    return replace(ctx, messages=messages)


def attach(connect: Callable[[], Any], ctx: Context, cache: Cache | None = None) -> Context:
    """`ctx` with its attachments' bytes; a connection is taken only if it has any."""
    hashes = needed(m["content"] for m in ctx.messages)
    if not hashes:
        return ctx
    with connect() as conn:
        return restored(ctx, fetch(conn, hashes, cache))


async def aattach(
    connect: Callable[[], Awaitable[Any]], ctx: Context, cache: Cache | None = None
) -> Context:
    """`attach` for the asyncio reader."""
    hashes = needed(m["content"] for m in ctx.messages)
    if not hashes:
        return ctx
    async with await connect() as conn:
        return restored(ctx, await afetch(conn, hashes, cache))


def attach_messages(conn: Any, messages: list[SessionMessage]) -> list[SessionMessage]:
    """Session messages with their attachments' bytes (what an export carries)."""
    hashes = needed(m.content for m in messages)
    if not hashes:
        return messages
    data = fetch(conn, hashes)
    return [
        m
        if isinstance(m.content, str)
        else replace(m, content=attachments.restore(m.content, data))
        for m in messages
    ]
