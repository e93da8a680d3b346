"""Context reads from a real streaming replica (made with pg_basebackup): exact wait_for,
the lag bound, and fallbacks to the primary when the replica lags or is down."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from contextlog.producers import AsyncContextReader, ContextReader, Producer
from contextlog.producers.context import Context
from contextlog.producers.replica import POLL_SECONDS, RETRY_SECONDS
from contextlog.schema.defaults import ConversationDefaults
from tests.support.replica import ReplicaPair
from tests.support.running import eventually, running, settings_for
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(120)


class FakeTimer:
    """Monotonic time that moves only when the reader sleeps; `on_sleep` runs at the first
    sleep (a test resumes replay there), so no test waits for a real timer."""

    def __init__(self, on_sleep: Callable[[], None] | None = None) -> None:
        self.now = 0.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        if self.on_sleep is not None:
            hook, self.on_sleep = self.on_sleep, None
            hook()

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


def texts(ctx: Context) -> list[str]:
    return [b["text"] for m in ctx.messages for b in m["content"] if b["type"] == "text"]


def reader_for(pair: ReplicaPair, timer: FakeTimer, **kw: Any) -> ContextReader:
    return ContextReader.from_url(
        pair.url, replica_url=pair.replica_url, timer=timer, defaults=ConversationDefaults(), **kw
    )


@pytest.fixture
def producer(redis_url: str) -> Iterator[Producer]:
    p = Producer.from_url(redis_url, shards=4)
    yield p
    p.close()


def exchange(producer: Producer, text: str) -> str:
    """A user message and its answer, through the real ingest path; the answer's event id."""
    producer.post_message("alpha", "general", "user", text)
    return producer.post_message("alpha", "general", "assistant", f"re: {text}")


def has_event(url: str, event_id: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM events WHERE event_id = %s", (event_id,))
        return bool(row.fetchone() == (1,))


def on_replica(pair: ReplicaPair, event_id: str) -> bool:
    return has_event(pair.replica_url, event_id)


def stored_exchange(pair: ReplicaPair, producer: Producer, text: str) -> None:
    """`exchange`, waited for on the primary (ingest stops when its `running` block ends,
    whatever is still on the stream)."""
    eid = exchange(producer, text)
    eventually(lambda: has_event(pair.url, eid), 10, "the exchange on the primary")


def test_wait_for_reads_on_the_replica_once_it_has_replayed_the_event(
    replicated: ReplicaPair, redis_url: str, producer: Producer
) -> None:
    reader = reader_for(replicated, FakeTimer(), replica_wait=60.0)
    try:
        with running(settings_for(replicated.url, redis_url)):
            eid = exchange(producer, "hello")
            ctx = reader.context("alpha", "general", wait_for=eid, timeout=10)
    finally:
        reader.close()
    assert (ctx.served_by, texts(ctx)) == ("replica", ["hello", "re: hello"])
    assert reader.routing["replica"] == 1 and reader.routing["primary"] == 0


def test_wait_for_with_replay_paused_beyond_the_bound_reads_the_primary(
    replicated: ReplicaPair, redis_url: str, producer: Producer
) -> None:
    timer = FakeTimer()
    reader = reader_for(replicated, timer, replica_wait=0.5)
    try:
        with replicated.replay_paused(), running(settings_for(replicated.url, redis_url)):
            eid = exchange(producer, "while paused")
            ctx = reader.context("alpha", "general", wait_for=eid, timeout=10)
            assert not on_replica(replicated, eid)  # the replica really is behind
    finally:
        reader.close()
    assert (ctx.served_by, texts(ctx)) == ("primary", ["while paused", "re: while paused"])
    assert reader.routing["behind"] == 1
    assert timer.now == pytest.approx(0.5, abs=2 * POLL_SECONDS)  # the whole bound, no more


def test_wait_for_after_a_short_pause_reads_the_replica(
    replicated: ReplicaPair, redis_url: str, producer: Producer
) -> None:
    timer = FakeTimer(on_sleep=lambda: replicated.set_replay(False))
    reader = reader_for(replicated, timer, replica_wait=60.0)
    try:
        replicated.set_replay(True)
        with running(settings_for(replicated.url, redis_url)):
            eid = exchange(producer, "short pause")
            ctx = reader.context("alpha", "general", wait_for=eid, timeout=10)
    finally:
        replicated.set_replay(False)
        reader.close()
    assert (ctx.served_by, texts(ctx)) == ("replica", ["short pause", "re: short pause"])
    assert timer.sleeps >= 1  # it found the replica behind, waited, and read there
    assert reader.routing["behind"] == 0


def test_plain_reads_use_the_replica_within_the_lag_bound_else_the_primary(
    replicated: ReplicaPair, redis_url: str, producer: Producer
) -> None:
    reader = reader_for(replicated, FakeTimer(), max_replica_lag=0.0)
    try:
        with running(settings_for(replicated.url, redis_url)):
            eid = exchange(producer, "first")
            reader.context("alpha", "general", wait_for=eid, timeout=10)
            replicated.caught_up()
            fresh = reader.context("alpha", "general")
            with replicated.replay_paused():
                later = exchange(producer, "second")
                reader.context("alpha", "general", wait_for=later, timeout=10)
                replicated.received()  # the WAL is there, not replayed: the replica lags
                lagging = reader.context("alpha", "general")
    finally:
        reader.close()
    assert (fresh.served_by, texts(fresh)) == ("replica", ["first", "re: first"])
    assert lagging.served_by == "primary" and texts(lagging)[-1] == "re: second"
    assert reader.routing["lagging"] == 1


def test_a_replica_that_is_down_leaves_reads_to_the_primary_until_it_is_back(
    replicated: ReplicaPair, redis_url: str, producer: Producer
) -> None:
    timer = FakeTimer()
    reader = reader_for(replicated, timer, replica_wait=60.0)
    try:
        with running(settings_for(replicated.url, redis_url)):
            eid = exchange(producer, "before")
            assert reader.context("alpha", "general", wait_for=eid).served_by == "replica"
            replicated.replica.crash()
            try:
                down = reader.context("alpha", "general")
                still_down = reader.context("alpha", "general", wait_for=eid)
                sessions = reader.sessions("alpha", "general")
            finally:
                replicated.replica.start()
            replicated.caught_up()
            timer.now += RETRY_SECONDS
            back = reader.context("alpha", "general")
    finally:
        reader.close()
    assert [c.served_by for c in (down, still_down, back)] == ["primary", "primary", "replica"]
    assert texts(down) == texts(back) == ["before", "re: before"]
    assert sessions.sessions == []
    assert reader.routing["down"] == 3


def test_a_primary_that_is_down_leaves_plain_reads_to_the_replica(
    replicated: ReplicaPair, redis_url: str, producer: Producer
) -> None:
    with running(settings_for(replicated.url, redis_url)):
        stored_exchange(replicated, producer, "stored")
    replicated.caught_up()
    nobody = f"postgresql://postgres@127.0.0.1:{free_port()}/{replicated.url.rsplit('/', 1)[1]}"
    reader = ContextReader.from_url(
        nobody, replica_url=replicated.replica_url, defaults=ConversationDefaults()
    )
    try:
        ctx = reader.context("alpha", "general")
    finally:
        reader.close()
    assert (ctx.served_by, texts(ctx)) == ("replica", ["stored", "re: stored"])


def test_an_unreachable_replica_url_leaves_reads_to_the_primary(
    replicated: ReplicaPair, redis_url: str, producer: Producer
) -> None:
    with running(settings_for(replicated.url, redis_url)):
        stored_exchange(replicated, producer, "stored")
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    reader = ContextReader.from_url(replicated.url, replica_url=dead, timer=FakeTimer())
    try:
        ctx = reader.context("alpha", "general")
    finally:
        reader.close()
    assert (ctx.served_by, texts(ctx)) == ("primary", ["stored", "re: stored"])
    assert reader.routing["down"] == 1


def test_async_reader_reads_the_replica_and_falls_back_beyond_the_bound(
    replicated: ReplicaPair, redis_url: str, producer: Producer
) -> None:
    timer = FakeTimer()
    reader = AsyncContextReader.from_url(
        replicated.url,
        replica_url=replicated.replica_url,
        replica_wait=0.5,
        timer=timer,
        defaults=ConversationDefaults(),
    )

    async def scenario() -> tuple[Context, Context]:
        try:
            with running(settings_for(replicated.url, redis_url)):
                eid = exchange(producer, "one")
                await reader.context("alpha", "general", wait_for=eid, timeout=10)
                replicated.caught_up()
                plain = await reader.context("alpha", "general")
                with replicated.replay_paused():
                    eid = exchange(producer, "two")
                    paused = await reader.context("alpha", "general", wait_for=eid, timeout=10)
            return plain, paused
        finally:
            await reader.aclose()

    plain, paused = asyncio.run(scenario())
    assert (plain.served_by, texts(plain)) == ("replica", ["one", "re: one"])
    assert paused.served_by == "primary" and texts(paused)[-2:] == ["two", "re: two"]
    assert reader.routing["behind"] >= 1
