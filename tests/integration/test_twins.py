"""`ContextReader` and `AsyncContextReader` answer every public read alike, on real
Postgres (their parameters are compared in tests/unit/test_twins.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from contextlog.producers import AsyncContextReader, ContextReader
from tests.support.session_stack import A, C, Stack

# Each public read, as a call on either reader (awaited on the asyncio one).
READS: dict[str, Callable[[Any, dict[str, str]], Any]] = {
    "context": lambda r, k: r.context(A, C, wait_for=k["last"]),
    "segment": lambda r, k: r.segment(A, C),
    "sessions": lambda r, k: r.sessions(A, C, page=1, per_page=5),
    "session": lambda r, k: r.session(k["session"], agent=A, channel=C),
    "session_messages": lambda r, k: r.session_messages(k["session"], agent=A, channel=C),
    "search": lambda r, k: r.search(A, "milk OR eggs", channel=C),
}
# Public, and not reads of a conversation: construction and the pool.
NOT_READS = {"from_url", "close", "connection"}


def test_both_readers_answer_every_read_alike(stack: Stack, db: str) -> None:
    assert set(READS) | NOT_READS == {
        n
        for n in dir(ContextReader)
        if not n.startswith("_") and callable(getattr(ContextReader, n))
    }
    stack.say("What's on the list?")
    stack.say("Milk and bread.", "assistant")
    stack.producer.save(A, C, "groceries", source="test")
    stack.notice("session_saved")
    last = stack.say("And eggs?")
    known = {"last": last, "session": stack.reader.sessions(A, C).sessions[0].session_id}
    sync = ContextReader.from_url(db)

    async def both() -> list[tuple[str, Any, Any]]:
        twin = AsyncContextReader.from_url(db)
        try:
            return [
                (name, read(sync, known), await read(twin, known)) for name, read in READS.items()
            ]
        finally:
            await twin.aclose()

    try:
        answers = asyncio.run(both())
    finally:
        sync.close()
    for name, mine, theirs in answers:
        assert mine == theirs, name
    context = answers[0][1]
    assert [m["role"] for m in context.messages] == ["user", "assistant", "user"]


def test_a_connection_is_the_readers_own_pooled_one(db: str) -> None:
    sync = ContextReader.from_url(db)
    try:
        with sync.connection() as conn:
            assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
    finally:
        sync.close()

    async def twin() -> Any:
        reader = AsyncContextReader.from_url(db)
        try:
            async with await reader.connection() as conn:
                return await (await conn.execute("SELECT 41 + 1")).fetchone()
        finally:
            await reader.aclose()

    assert asyncio.run(twin()) == (42,)
