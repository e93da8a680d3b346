"""Both readers behind one face, so one parametrised test suite runs every public method
on the sync `ContextReader` and the asyncio `AsyncContextReader` (STYLE: twins cannot
drift). `Twin.call("search", ...)` runs the method on whichever the test was given."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from contextlog.producers import AsyncContextReader, ContextReader
from contextlog.schema.defaults import ConversationDefaults
from contextlog.worker.store.search import index_all


def parameters(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """What a method takes (name, kind, default): what two twins, or a fake and the real
    reader, must share."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


class Twin:
    """A sync or an asyncio reader on `url`; `call` waits for the asyncio one."""

    def __init__(self, url: str, kind: str) -> None:
        self.url = url
        self.kind = kind
        self.loop: asyncio.AbstractEventLoop | None = None
        if kind == "sync":
            self.reader: Any = ContextReader.from_url(url, defaults=ConversationDefaults())
        else:
            self.loop = asyncio.new_event_loop()
            self.reader = AsyncContextReader.from_url(url, defaults=ConversationDefaults())

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`reader.method(*args, **kwargs)`, awaited when the reader is the asyncio one."""
        result = getattr(self.reader, method)(*args, **kwargs)
        if self.loop is None:
            return result
        return self.loop.run_until_complete(result)

    def search(self, *args: Any, **kwargs: Any) -> Any:
        """`reader.search`, after the indexer indexed what ingest queued (a worker's
        indexer does it right after ingest; tests run it here)."""
        indexed(self.url)
        return self.call("search", *args, **kwargs)

    def close(self) -> None:
        if self.loop is None:
            self.reader.close()
            return
        self.loop.run_until_complete(self.reader.aclose())
        self.loop.close()


def indexed(url: str) -> int:
    """Run the search indexer until its queue is empty; how many messages it indexed."""
    with psycopg.connect(url) as conn:
        return index_all(conn)


@pytest.fixture(params=["sync", "async"])
def twin(db: str, request: pytest.FixtureRequest) -> Iterator[Twin]:
    """The reader of a test, once sync and once asyncio."""
    t = Twin(db, request.param)
    yield t
    t.close()
